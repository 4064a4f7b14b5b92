"""The metrics of a PRM on held-out pairs (``codetool eval-prm`` and the trainer's evaluation report them).

What the search asks the PRM is which of a step's candidates to keep, and only between candidates
whose on-the-spot rewards are equal (at weights 1/1 a candidate that ran always beats one that
failed, whatever the PRM says). So the PRM's accuracy is measured on what it decides:

- **pairwise accuracy** over the **labelled sibling pairs** (each pair the tree labelled: the more
  promising sibling and the other; a tie counts 1/2), not over every positive x negative row of a
  sibling group (which counts pairs nobody labelled and weighs siblings that appear in several
  pairs again). Split by what separates the two steps: ``executability`` (one ran, one failed: the
  on-the-spot reward already ranks them), ``both_ran`` (the pairs the search asks the PRM about)
  and ``both_failed``; ``unknown`` for rows without the ``ok`` flag (datasets exported before issue
  38: rebuild them with ``build-trees --relabel``). Each with its number of pairs and a seeded 95%
  percentile bootstrap interval that resamples **queries** (a query's pairs share its tools and
  its tree), :func:`decided_metrics`.
- **best-of-k among runnable siblings** (:func:`best_of_k`): in each sibling group with at least
  two steps that ran, the value (the tree's ``latent_reward``) of the step the PRM scores highest,
  against a random pick (the group's mean) and the oracle (its best), with the PRM's gain over random
  bootstrapped over queries.
- over all rows: **AUC** (Mann-Whitney U with average ranks for ties), **accuracy@0.5**, **Brier
  score**, and **ECE** with a reliability diagram (PNG) over 10 bins.

``codetool eval-prm`` (``codetool.commands.eval_prm``) rebuilds the held-out split from the
checkpoint's ``prm_config.json`` (``split``): the same query ids that ``codetool train-prm`` kept
out of training.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

KINDS = ("executability", "both_ran", "both_failed", "unknown")


@dataclass(frozen=True)
class Pair:
    """A labelled sibling pair: the row indices of its more promising and its other step, the query
    it belongs to, and what separates the two steps (one of :data:`KINDS`)."""

    better: int
    worse: int
    query: str
    kind: str


def _kind(ok_a, ok_b) -> str:
    if ok_a is None or ok_b is None or ok_a < 0 or ok_b < 0:
        return "unknown"
    if bool(ok_a) != bool(ok_b):
        return "executability"
    return "both_ran" if ok_a else "both_failed"


def pairs_from_ids(pair_ids: Sequence, labels: Sequence, ok: Sequence, queries: Sequence) -> list[Pair]:
    """The labelled pairs of rows given each row's pair id (``-1``/``None``: in no pair), label,
    ``ok`` (1 ran, 0 failed, ``-1``/``None`` unknown) and query. Two rows with one id and labels 1
    and 0 make a pair; a pair whose rows carry the same label ranks nothing and is left out."""
    members: dict = defaultdict(list)
    for i, pid in enumerate(pair_ids):
        if pid is not None and pid != -1:
            members[pid].append(i)
    out = []
    for rows in members.values():
        pos = [i for i in rows if int(labels[i]) == 1]
        neg = [i for i in rows if int(labels[i]) != 1]
        if len(pos) == 1 and len(neg) == 1:
            out.append(Pair(pos[0], neg[0], str(queries[pos[0]]), _kind(ok[pos[0]], ok[neg[0]])))
    return out


def row_pair_ids(rows: list[dict], groups: Sequence) -> tuple[list, list]:
    """Per row, its pair id and ``ok`` flag: the ``pair`` and ``ok`` fields build-trees writes, else
    (rows of older datasets, which lack the field, also beside newer rows) consecutive rows of one
    sibling group with labels 1 and 0 (build-trees writes each pair as two adjacent rows) and ``ok``
    unknown."""
    ids: list = [r.get("pair", -1) if "pair" in r else -1 for r in rows]
    ok = [(-1 if r.get("ok") is None else int(bool(r["ok"]))) for r in rows]
    i = 0
    while i + 1 < len(rows):
        if ("pair" not in rows[i] and "pair" not in rows[i + 1] and groups[i] == groups[i + 1]
                and {int(rows[i]["label"]), int(rows[i + 1]["label"])} == {0, 1}):
            ids[i] = ids[i + 1] = ("adjacent", i)
            i += 2
        else:
            i += 1
    return ids, ok


def pairwise_accuracy(scores, pairs: list[Pair]) -> tuple[float, int]:
    """``(accuracy, pairs)``: the share of labelled pairs whose more promising step scores higher
    (a tie counts 1/2); NaN when there is no pair."""
    if not pairs:
        return float("nan"), 0
    wins = sum(_win(scores, p) for p in pairs)
    return wins / len(pairs), len(pairs)


def _win(scores, p: Pair) -> float:
    a, b = float(scores[p.better]), float(scores[p.worse])
    return 1.0 if a > b else 0.5 if a == b else 0.0


def _cluster_interval(per_query: dict, samples: int, seed: int) -> tuple[float, float] | None:
    """95% percentile bootstrap of ``sum(num) / sum(den)`` over the queries of ``per_query`` (query
    -> (num, den)), resampled with replacement, seeded; ``None`` for no query."""
    if not per_query:
        return None
    num, den = np.array(list(per_query.values()), dtype=np.float64).T
    pick = np.random.default_rng(seed).integers(0, len(num), size=(samples, len(num)))
    ratios = num[pick].sum(axis=1) / np.maximum(den[pick].sum(axis=1), 1e-12)
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def pair_interval(scores, pairs: list[Pair], samples: int = 1000, seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of :func:`pairwise_accuracy`, resampling queries (``None``: no pair)."""
    per_query: dict = defaultdict(lambda: [0.0, 0.0])
    for p in pairs:
        per_query[p.query][0] += _win(scores, p)
        per_query[p.query][1] += 1
    return _cluster_interval(per_query, samples, seed)


def decided_metrics(scores, pairs: list[Pair], samples: int = 1000, seed: int = 0) -> dict[str, dict]:
    """Pairwise accuracy of ``all`` pairs and of each kind that occurs (:data:`KINDS`): per part its
    ``accuracy`` (``None`` without pairs), ``pairs``, ``queries`` and ``ci95`` (bootstrap over queries)."""
    out = {}
    for kind in ("all", *KINDS):
        part = pairs if kind == "all" else [p for p in pairs if p.kind == kind]
        if kind != "all" and not part:
            continue
        acc, n = pairwise_accuracy(scores, part)
        ci = pair_interval(scores, part, samples, seed)
        out[kind] = {"accuracy": None if n == 0 else acc, "pairs": n, "queries": len({p.query for p in part}),
                     "ci95": list(ci) if ci else None}
    return out


def best_of_k(scores, rows: list[dict], groups: Sequence, queries: Sequence, samples: int = 1000,
              seed: int = 0) -> dict:
    """Best-of-k selection among the runnable siblings of each group (module docstring).

    Args:
        rows (`list[dict]`): with ``ok``, ``latent_reward`` and ``source`` (a node appearing in
            several rows counts once, its first score).
        groups, queries: per row, its sibling group and its query.
    Returns:
        ``groups`` (sibling groups with >= 2 runnable steps), ``informative`` (of them, those whose
        steps differ in value), mean value of the ``prm`` pick (ties: their mean), of a ``random``
        pick and of the ``oracle``, ``prm_best`` (share of groups where the PRM picks a best step;
        ties count in proportion), ``gain_ci95`` (bootstrap over queries of prm minus random).
    """
    nodes: dict = defaultdict(dict)
    for i, row in enumerate(rows):
        if row.get("ok") and row.get("latent_reward") is not None:
            nodes[groups[i]].setdefault(row.get("source", i), (float(scores[i]), float(row["latent_reward"]), i))
    picked, rnd, best, hits, informative = [], [], [], [], 0
    per_query: dict = defaultdict(lambda: [0.0, 0.0])
    for members in nodes.values():
        if len(members) < 2:
            continue
        s = np.array([m[0] for m in members.values()])
        v = np.array([m[1] for m in members.values()])
        top = v[s == s.max()]
        picked.append(float(top.mean()))
        rnd.append(float(v.mean()))
        best.append(float(v.max()))
        hits.append(float((top == v.max()).mean()))
        informative += int(v.max() > v.min())
        query = queries[next(iter(members.values()))[2]]
        per_query[query][0] += picked[-1] - rnd[-1]
        per_query[query][1] += 1
    if not picked:
        return {"groups": 0, "informative": 0, "prm": None, "random": None, "oracle": None, "prm_best": None,
                "gain_ci95": None}
    ci = _cluster_interval(per_query, samples, seed)
    return {"groups": len(picked), "informative": informative, "prm": float(np.mean(picked)),
            "random": float(np.mean(rnd)), "oracle": float(np.mean(best)), "prm_best": float(np.mean(hits)),
            "gain_ci95": list(ci) if ci else None}


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


def prm_metrics(scores, labels, pairs: list[Pair] | None = None) -> dict[str, float]:
    """The scalar metrics as a flat dict (for logs and JSON): ``pairwise_accuracy`` and ``pairs``
    over the labelled ``pairs`` (``pairwise_accuracy_both_ran`` and ``pairs_both_ran`` over those
    whose steps both ran, and the same for ``executability``), and the row metrics."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(int)
    pairs = pairs or []
    pair_acc, n_pairs = pairwise_accuracy(scores, pairs)
    out = {"pairwise_accuracy": pair_acc, "pairs": n_pairs}
    for kind in ("both_ran", "executability"):
        acc, n = pairwise_accuracy(scores, [p for p in pairs if p.kind == kind])
        out[f"pairwise_accuracy_{kind}"], out[f"pairs_{kind}"] = acc, n
    table = calibration_bins(scores, labels)
    ece = sum(b["count"] * abs(b["mean_score"] - b["positive_rate"]) for b in table if b["count"]) / max(len(scores), 1)
    return {**out, "auc": roc_auc(scores, labels),
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
