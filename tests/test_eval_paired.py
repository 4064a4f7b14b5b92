"""Paired differences between methods with a bootstrap over queries, on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codetool.eval.paired import (
    bootstrap_mean,
    mean_over_seeds,
    paired_difference,
    paired_differences,
)


def test_the_difference_is_the_mean_over_common_queries():
    a = {"q1": 1.0, "q2": 0.5, "q3": 0.0, "q4": 1.0}
    b = {"q1": 0.0, "q2": 0.5, "q3": 0.0, "q5": 1.0}
    d = paired_difference(a, b, names=("spot+latent", "spot-only"))
    assert (d.a, d.b, d.n, d.only_a, d.only_b) == ("spot+latent", "spot-only", 3, 1, 1)
    assert d.mean == pytest.approx(1 / 3)  # (1 + 0 + 0) / 3
    assert d.low <= d.mean <= d.high


def test_the_interval_resamples_queries_with_a_seed():
    diffs = [1.0, 0.0, 0.0, 0.0]
    low, high = bootstrap_mean(diffs, samples=2000, seed=3)
    assert (low, high) == bootstrap_mean(diffs, samples=2000, seed=3)
    # by hand: each resample's mean is k/4 with k ~ Binomial(4, 1/4): P(k=0) = 0.316 > 2.5%, P(k>=3) = 0.051 > 2.5%
    assert low == 0.0 and high == 0.75
    # numpy's own resampling of the same indices gives the same means
    pick = np.random.default_rng(3).integers(0, 4, size=(2000, 4))
    assert np.percentile(np.array(diffs)[pick].mean(axis=1), 97.5) == high


def test_identical_methods_differ_by_exactly_zero_and_nan_leaves_a_query_out():
    a = {"q1": 1.0, "q2": 0.0, "q3": float("nan")}
    d = paired_difference(a, dict(a))
    assert (d.n, d.mean, d.low, d.high) == (2, 0.0, 0.0, 0.0)
    empty = paired_difference({}, {"q1": 1.0})
    assert empty.n == 0 and math.isnan(empty.mean) and empty.to_dict()["mean"] is None


def test_against_a_baseline_and_every_pair():
    scores = {"single": {"q1": 0.0, "q2": 0.0}, "spot": {"q1": 1.0, "q2": 0.0}, "both": {"q1": 1.0, "q2": 1.0}}
    vs = paired_differences(scores, baseline="single", samples=50)
    assert [(d.a, d.b, d.mean) for d in vs] == [("spot", "single", 0.5), ("both", "single", 1.0)]
    every = paired_differences(scores, samples=50)
    assert [(d.a, d.b) for d in every] == [("spot", "single"), ("both", "single"), ("both", "spot")]
    with pytest.raises(KeyError):
        paired_differences(scores, baseline="nope")


def test_seeds_are_averaged_per_query_first():
    assert mean_over_seeds([{"q1": 1.0, "q2": 0.0}, {"q1": 0.0}, {"q1": 0.5, "q2": float("nan")}]) == {
        "q1": 0.5, "q2": 0.0}
