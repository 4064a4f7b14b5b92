"""PRM evaluation metrics (codetool.prm.evaluate), against hand-computed values."""

from __future__ import annotations

import math

import pytest

from codetool.prm.evaluate import (
    best_of_k,
    calibration_bins,
    decided_metrics,
    pairs_from_ids,
    pairwise_accuracy,
    plot_calibration,
    prm_metrics,
    roc_auc,
    row_pair_ids,
)


def hand_labelled():
    """Two queries. A: siblings a (ran, latent 0.9), b (ran, 0.6), c (failed, 0.3), labelled a>c and
    b>c (executability) and a>b (both ran); B: d (ran, 0.95) > e (ran, 0.5). Rows as build-trees
    writes them, two per labelled pair."""
    node = {"a": (True, 0.9, 0.6), "b": (True, 0.6, 0.7), "c": (False, 0.3, 0.2), "d": (True, 0.95, 0.9),
            "e": (True, 0.5, 0.1)}  # ok, latent reward, PRM score
    rows, scores = [], []
    for query, better, worse in (("A", "a", "c"), ("A", "b", "c"), ("A", "a", "b"), ("B", "d", "e")):
        for name, label in ((better, 1), (worse, 0)):
            ok, latent, score = node[name]
            rows.append({"query_id": query, "query": query, "history": [], "label": label, "ok": ok,
                         "latent_reward": latent, "source": f"{query}:{name}", "pair": f"{query}:{better}>{worse}"})
            scores.append(score)
    return rows, scores


def test_pairwise_accuracy_counts_labelled_pairs_split_by_what_decided_them():
    rows, scores = hand_labelled()
    groups = [r["query_id"] for r in rows]  # one sibling group per query here
    ids, ok = row_pair_ids(rows, groups)
    pairs = pairs_from_ids(ids, [r["label"] for r in rows], ok, groups)
    assert [(p.kind, p.query) for p in pairs] == [("executability", "A"), ("executability", "A"), ("both_ran", "A"),
                                                  ("both_ran", "B")]
    # a>c and b>c right, a>b wrong (b scores 0.7 > a's 0.6), d>e right: 3 of 4
    assert pairwise_accuracy(scores, pairs) == (0.75, 4)
    # (every positive x negative row of query A would give (2 + 2.5 + 2) / 9 = 0.72 there: not what was labelled)
    decided = decided_metrics(scores, pairs, samples=400, seed=0)
    assert (decided["executability"]["accuracy"], decided["executability"]["pairs"]) == (1.0, 2)
    assert (decided["both_ran"]["accuracy"], decided["both_ran"]["pairs"], decided["both_ran"]["queries"]) == (0.5, 2, 2)
    assert decided["both_ran"]["ci95"] == [0.0, 1.0] and decided["executability"]["ci95"] == [1.0, 1.0]
    assert "both_failed" not in decided and decided["all"]["pairs"] == 4
    metrics = prm_metrics(scores, [r["label"] for r in rows], pairs)
    assert (metrics["pairwise_accuracy_both_ran"], metrics["pairs_both_ran"], metrics["pairs"]) == (0.5, 2, 4)
    acc, n = pairwise_accuracy([0.1], [])
    assert math.isnan(acc) and n == 0


def test_best_of_k_among_runnable_siblings_against_random_and_oracle():
    rows, scores = hand_labelled()
    best = best_of_k(scores, rows, [r["query_id"] for r in rows], [r["query_id"] for r in rows], samples=200)
    # A: runnable a (0.9, PRM 0.6) and b (0.6, PRM 0.7): the PRM picks b; B: d (0.95) over e (0.5)
    assert (best["groups"], best["informative"]) == (2, 2)
    assert best["prm"] == pytest.approx((0.6 + 0.95) / 2) and best["random"] == pytest.approx((0.75 + 0.725) / 2)
    assert best["oracle"] == pytest.approx((0.9 + 0.95) / 2) and best["prm_best"] == 0.5


def test_older_datasets_pair_adjacent_rows_and_leave_ok_unknown():
    rows = [{"label": 1}, {"label": 0}, {"label": 1}, {"label": 1}, {"label": 0}]
    ids, ok = row_pair_ids(rows, ["g", "g", "h", "k", "k"])
    assert ids == [("adjacent", 0)] * 2 + [-1] + [("adjacent", 3)] * 2 and ok == [-1] * 5
    pairs = pairs_from_ids(ids, [r["label"] for r in rows], ok, ["q"] * 5)
    assert [(p.better, p.worse, p.kind) for p in pairs] == [(0, 1, "unknown"), (3, 4, "unknown")]
    # an older file's rows beside a newer one's (red team: the newer rows' field switched the older
    # rows' pairing off): each row is paired by what it carries
    mixed = [{"label": 1, "pair": "q:1>2", "ok": True}, {"label": 0, "pair": "q:1>2", "ok": True}, *rows[:2]]
    ids, ok = row_pair_ids(mixed, ["n", "n", "g", "g"])
    assert ids == ["q:1>2", "q:1>2", ("adjacent", 2), ("adjacent", 2)]
    assert len(pairs_from_ids(ids, [r["label"] for r in mixed], ok, ["q"] * 4)) == 2


def test_roc_auc_hand_values():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert roc_auc([0.2, 0.9, 0.1], [0, 1, 0]) == pytest.approx(1.0)
    assert math.isnan(roc_auc([0.3, 0.4], [1, 1]))


def test_calibration_and_summary_metrics(tmp_path):
    table = calibration_bins([0.05, 0.95, 1.0], [0, 1, 1])
    assert [b["count"] for b in table] == [1] + [0] * 8 + [2]
    assert table[9]["mean_score"] == pytest.approx(0.975) and table[9]["positive_rate"] == 1.0
    metrics = prm_metrics([0.05, 0.95], [0, 1], pairs_from_ids([0, 0], [0, 1], [1, 1], ["q", "q"]))
    assert metrics["ece"] == pytest.approx(0.05) and metrics["brier"] == pytest.approx(0.0025)
    assert metrics["accuracy"] == 1.0 and metrics["pairwise_accuracy"] == 1.0 and metrics["auc"] == 1.0
    png = plot_calibration([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], tmp_path / "cal.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tree_rows_carry_their_pair_and_whether_their_step_ran():
    from codetool.tree.dataset import tree_rows

    def node(ok, parent=None):
        return {"parent": parent, "code": "x = 1", "text": "```python\nx = 1\n```", "observation": "ok", "ok": ok,
                "latent_reward": 0.5, "leaf": True}

    record = {"query_id": "G1_query/7", "query": "q", "tools": "t", "nodes": {"1": node(True), "2": node(False),
                                                                               "3": node(True)},
              "pairs": [["1", "2"], ["3", "2"], ["1", "3"]]}
    rows, _ = tree_rows(record)
    assert [(r["source"], r["label"], r["ok"], r["pair"]) for r in rows[:2]] == [
        ("G1_query/7:1", 1, True, "G1_query/7:1>2"), ("G1_query/7:2", 0, False, "G1_query/7:1>2")]
    ids, ok = row_pair_ids(rows, ["g"] * len(rows))
    pairs = pairs_from_ids(ids, [r["label"] for r in rows], ok, ["q"] * len(rows))
    assert [p.kind for p in pairs] == ["executability", "executability", "both_ran"]
