"""PRM evaluation metrics (codetool.prm.evaluate), against hand-computed values."""

from __future__ import annotations

import math

import pytest

from codetool.prm.evaluate import (
    calibration_bins,
    pairwise_accuracy,
    plot_calibration,
    prm_metrics,
    roc_auc,
)


def test_pairwise_accuracy_by_sibling_group():
    # g1: 0.9 beats 0.2, loses to 0.95; g2: a tie counts 1/2; g3 has no negative, so no pair.
    scores = [0.9, 0.2, 0.95, 0.5, 0.5, 0.7]
    labels = [1, 0, 0, 1, 0, 1]
    groups = ["g1", "g1", "g1", "g2", "g2", "g3"]
    assert pairwise_accuracy(scores, labels, groups) == (pytest.approx(1.5 / 3), 3)
    acc, pairs = pairwise_accuracy([0.1], [1], ["a"])
    assert math.isnan(acc) and pairs == 0


def test_roc_auc_hand_values():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert roc_auc([0.2, 0.9, 0.1], [0, 1, 0]) == pytest.approx(1.0)
    assert math.isnan(roc_auc([0.3, 0.4], [1, 1]))


def test_calibration_and_summary_metrics(tmp_path):
    table = calibration_bins([0.05, 0.95, 1.0], [0, 1, 1])
    assert [b["count"] for b in table] == [1] + [0] * 8 + [2]
    assert table[9]["mean_score"] == pytest.approx(0.975) and table[9]["positive_rate"] == 1.0
    metrics = prm_metrics([0.05, 0.95], [0, 1], ["g", "g"])
    assert metrics["ece"] == pytest.approx(0.05) and metrics["brier"] == pytest.approx(0.0025)
    assert metrics["accuracy"] == 1.0 and metrics["pairwise_accuracy"] == 1.0 and metrics["auc"] == 1.0
    png = plot_calibration([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], tmp_path / "cal.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
