"""Paired differences between two methods on the same queries, with a bootstrap over queries.

Two methods run on the same queries are compared query by query: the difference of their
per-query scores (a pass rate's 1 / 0.5 / 0, a grounded success, a path score, ...) averaged over
the queries both ran, with a seeded 95% percentile bootstrap interval that resamples **queries**
with replacement (the unit that varies between runs of a benchmark). Pairing removes the
between-query variance the two methods share, so a difference too small to separate two
independent pass rates (CodeTool's -3.8-point ablation at 580 queries: a binomial standard error of
~1.9 points per method) can still be resolved when the methods agree on most queries.

Guarantees: a query that only one method has is left out and counted (``only_a``/``only_b``),
never imputed; the interval is reproducible given ``seed``. Several search seeds of one method
are averaged per query first (:func:`mean_over_seeds`), so the bootstrap unit stays the query.
Limits: a percentile interval (not BCa); with fewer than ~20 queries it is wide and rough.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PairedDifference:
    """Method ``a`` minus method ``b`` on the queries both have.

    Args:
        a, b (`str`): the two methods' names.
        n (`int`): queries in both.
        mean (`float`): mean over those queries of ``score_a - score_b`` (NaN when ``n`` is 0).
        low, high (`float`): the bootstrap interval (NaN when ``n`` is 0).
        confidence (`float`): its level (0.95).
        samples, seed (`int`): the resamples of queries and the seed of numpy's ``default_rng``.
        only_a, only_b (`int`): queries one method has and the other lacks (left out).
    """

    a: str
    b: str
    n: int
    mean: float
    low: float
    high: float
    confidence: float
    samples: int
    seed: int
    only_a: int = 0
    only_b: int = 0

    def to_dict(self) -> dict:
        """The fields as a JSON-able dict (NaN as ``None``)."""
        return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(self).items()}


def bootstrap_mean(values: Iterable[float], *, samples: int = 1000, seed: int = 0,
                   confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one value per query), seeded.

    Returns:
        ``(low, high)``; ``(nan, nan)`` for no values.
    Raises:
        ValueError: ``samples < 1`` or ``confidence`` outside (0, 1).
    """
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {samples} and {confidence}.")
    x = np.asarray(list(values), dtype=np.float64)
    if not len(x):
        return float("nan"), float("nan")
    pick = np.random.default_rng(seed).integers(0, len(x), size=(samples, len(x)))
    means = x[pick].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def paired_difference(a: Mapping[Hashable, float], b: Mapping[Hashable, float], *, names: tuple[str, str] = ("a", "b"),
                      samples: int = 1000, seed: int = 0, confidence: float = 0.95) -> PairedDifference:
    """Mean of ``a[q] - b[q]`` over the queries ``q`` both map (a NaN score leaves its query out of
    both), with :func:`bootstrap_mean`'s interval over those queries.

    Args:
        a, b (`Mapping`): query key -> score of each method (e.g. ``(group, query_id)`` -> pass 1/0.5/0).
        names (`tuple[str, str]`): the methods' names in the result.
    """
    ok_a = {q: float(v) for q, v in a.items() if v is not None and v == v}
    ok_b = {q: float(v) for q, v in b.items() if v is not None and v == v}
    common = [q for q in ok_a if q in ok_b]
    diffs = [ok_a[q] - ok_b[q] for q in common]
    low, high = bootstrap_mean(diffs, samples=samples, seed=seed, confidence=confidence)
    return PairedDifference(a=names[0], b=names[1], n=len(common),
                            mean=float(np.mean(diffs)) if diffs else float("nan"), low=low, high=high,
                            confidence=confidence, samples=samples, seed=seed,
                            only_a=len(ok_a) - len(common), only_b=len(ok_b) - len(common))


def paired_differences(scores: Mapping[str, Mapping[Hashable, float]], *, baseline: str | None = None,
                       samples: int = 1000, seed: int = 0, confidence: float = 0.95) -> list[PairedDifference]:
    """:func:`paired_difference` of each method against ``baseline`` (every other method minus it),
    or of every pair in the given order (later minus earlier) when ``baseline`` is ``None``.

    Raises:
        KeyError: ``baseline`` is not one of the methods.
    """
    methods = list(scores)
    if baseline is not None:
        if baseline not in scores:
            raise KeyError(f"baseline {baseline!r} is not among the methods {methods}.")
        pairs = [(m, baseline) for m in methods if m != baseline]
    else:
        pairs = [(methods[j], methods[i]) for i in range(len(methods)) for j in range(i + 1, len(methods))]
    return [paired_difference(scores[x], scores[y], names=(x, y), samples=samples, seed=seed, confidence=confidence)
            for x, y in pairs]


def mean_over_seeds(per_seed: Iterable[Mapping[Hashable, float]]) -> dict[Hashable, float]:
    """Per query, the mean of its scores over the seeds that scored it (several search seeds of one
    method become one score per query, so the bootstrap resamples queries, not runs)."""
    sums: dict[Hashable, list[float]] = {}
    for scores in per_seed:
        for q, v in scores.items():
            if v is not None and v == v:
                sums.setdefault(q, []).append(float(v))
    return {q: sum(v) / len(v) for q, v in sums.items()}
