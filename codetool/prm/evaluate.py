"""The metrics of a PRM on held-out pairs (``codetool eval-prm`` reports them).

Metrics, over rows with a binary ``label`` (1 = the more promising sibling) and a PRM score:

- **pairwise accuracy**: over every (positive, negative) pair of siblings (candidates of the same
  step: same query and history), the share where the positive scores higher; ties count 1/2.
  This is what the search uses the PRM for: ranking the candidates of a step. ``eval-prm`` adds a
  seeded 95% bootstrap interval over sibling groups (``pairwise_accuracy_ci95``).
- **AUC**: ROC area over all rows (Mann-Whitney U with average ranks for ties).
- **accuracy@0.5**, **Brier score**, and **ECE** with a reliability diagram (PNG) over 10 bins.

``codetool eval-prm`` (``codetool.commands.eval_prm``) rebuilds the held-out split from the
checkpoint's ``prm_config.json`` (``split``): the same query ids that ``codetool train-prm`` kept
out of training.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)


def pairwise_accuracy(scores, labels, groups) -> tuple[float, int]:
    """``(accuracy, pairs)``: share of sibling (positive, negative) pairs ranked right.

    Args:
        scores: (n,) float in [0, 1]; labels: (n,) 0/1; groups: (n,) sibling group ids.
    Returns:
        The accuracy in [0, 1] (NaN when no group holds both labels) and the number of pairs.
    """
    by_group: dict = defaultdict(lambda: ([], []))
    for s, y, g in zip(scores, labels, groups):
        by_group[g][0 if int(y) == 1 else 1].append(float(s))
    wins, pairs = 0.0, 0
    for pos, neg in by_group.values():
        for p in pos:
            for q in neg:
                wins += 1.0 if p > q else 0.5 if p == q else 0.0
                pairs += 1
    return (wins / pairs if pairs else float("nan")), pairs


def bootstrap_pairwise(scores, labels, groups, samples: int = 1000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of :func:`pairwise_accuracy`, resampling sibling groups
    (the unit the pairs share) with replacement, seeded.

    Args:
        scores: (n,) float; labels: (n,) 0/1; groups: (n,) sibling group ids.
        samples: resamples; seed: seed of the resampling (numpy ``default_rng``).
    Returns:
        ``(low, high)`` in [0, 1], or ``None`` when no group holds both labels.
    """
    by_group: dict = defaultdict(lambda: ([], []))
    for s, y, g in zip(scores, labels, groups):
        by_group[g][0 if int(y) == 1 else 1].append(float(s))
    stats = []  # per group with pairs: (wins, pairs)
    for pos, neg in by_group.values():
        if pos and neg:
            wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
            stats.append((wins, len(pos) * len(neg)))
    if not stats:
        return None
    wins, pairs = np.array(stats).T
    pick = np.random.default_rng(seed).integers(0, len(stats), size=(samples, len(stats)))
    accs = wins[pick].sum(axis=1) / pairs[pick].sum(axis=1)
    return float(np.percentile(accs, 2.5)), float(np.percentile(accs, 97.5))


def roc_auc(scores, labels) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (NaN when only one class is present)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(int)
    n_pos, n_neg = int(labels.sum()), int((1 - labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibration_bins(scores, labels, bins: int = 10) -> list[dict]:
    """Reliability table: per equal-width score bin, ``count``, ``mean_score``, ``positive_rate``."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    index = np.minimum((scores * bins).astype(int), bins - 1)
    table = []
    for b in range(bins):
        mask = index == b
        n = int(mask.sum())
        table.append({"low": b / bins, "high": (b + 1) / bins, "count": n,
                      "mean_score": float(scores[mask].mean()) if n else None,
                      "positive_rate": float(labels[mask].mean()) if n else None})
    return table


def prm_metrics(scores, labels, groups) -> dict[str, float]:
    """All scalar metrics of the module docstring, as a flat dict (for logs and JSON)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(int)
    pair_acc, pairs = pairwise_accuracy(scores, labels, groups)
    table = calibration_bins(scores, labels)
    ece = sum(b["count"] * abs(b["mean_score"] - b["positive_rate"]) for b in table if b["count"]) / max(len(scores), 1)
    return {"pairwise_accuracy": pair_acc, "pairs": pairs, "auc": roc_auc(scores, labels),
            "accuracy": float(((scores > 0.5).astype(int) == labels).mean()) if len(scores) else float("nan"),
            "brier": float(((scores - labels) ** 2).mean()) if len(scores) else float("nan"),
            "ece": float(ece), "rows": int(len(scores))}


def plot_calibration(scores, labels, path: str | Path, title: str = "PRM calibration") -> Path:
    """Write a reliability diagram (PNG) with a histogram of scores; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = calibration_bins(scores, labels)
    filled = [b for b in table if b["count"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=[3, 1], sharex=True)
    top.plot([0, 1], [0, 1], "--", color="grey", label="perfect")
    top.plot([b["mean_score"] for b in filled], [b["positive_rate"] for b in filled], "o-", label="PRM")
    top.set_ylabel("share of positive labels")
    top.set_title(title)
    top.legend(loc="upper left")
    bottom.hist(np.asarray(scores, dtype=float), bins=20, range=(0, 1), color="tab:blue")
    bottom.set_xlabel("PRM score")
    bottom.set_ylabel("rows")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
