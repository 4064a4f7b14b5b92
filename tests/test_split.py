"""The one held-out split (codetool.split), shared by tree export, train-prm and eval-prm."""

from __future__ import annotations

import copy
import json

import pytest

from codetool.jsonl import read_jsonl
from codetool.prm.data import split_rows
from codetool.split import heldout_count, heldout_query_ids
from codetool.tree.dataset import export_dataset
from codetool.tree.labels import label_tree, sibling_pairs


@pytest.mark.parametrize(("n", "fraction", "k"), [
    (0, 0.2, 0), (1, 0.5, 0), (2, 0.1, 1), (3, 0.1, 1), (10, 0.2, 2), (10, 0.25, 2), (10, 0.26, 3),
    (7, 0.1, 1), (40, 0.25, 10), (5, 0.0, 0), (2, 0.9, 1), (4, 0.99, 3)])
def test_heldout_count_by_hand(n, fraction, k):
    # at least one of two or more, never more than ceil(n * fraction), always one left to train on
    assert heldout_count(n, fraction) == k


def test_tiny_datasets_hold_out_one_query_not_a_hash_share():
    ids = [f"q{i}" for i in range(8)]
    for seed in range(20):  # the old hash threshold held out 0..8 of 8 at 10 %
        assert len(heldout_query_ids(ids, 0.1, seed)) == 1


def test_split_is_deterministic_order_free_and_ranked_by_hash():
    ids = [f"q{i}" for i in range(10)]
    held = heldout_query_ids(ids + ids, 0.3, seed=3)
    assert len(held) == 3 and held == heldout_query_ids(list(reversed(ids)), 0.3, seed=3)
    assert heldout_query_ids(ids, 0.3, seed=3) != heldout_query_ids(ids, 0.3, seed=4)
    # a larger fraction only adds queries: the ranking depends on the id and seed alone
    assert held < heldout_query_ids(ids, 0.5, seed=3)


def _records(n: int) -> list[dict]:
    tree = label_tree({
        "1": {"parent": None, "ok": True, "leaf": True, "success": True},
        "2": {"parent": None, "ok": False, "leaf": True, "success": False},
    })
    for node_id, node in tree.items():
        node.update(code=f"step_{node_id}()", observation=f"out {node_id}")
    pairs = sibling_pairs(tree)[0]
    return [{"query_id": f"q{i}", "query": f"Q{i}?", "tools": "def f(): ...", "nodes": copy.deepcopy(tree),
             "pairs": pairs} for i in range(n)]


@pytest.mark.parametrize(("n", "fraction", "seed"), [(3, 0.1, 0), (12, 0.2, 0), (12, 0.25, 7)])
def test_tree_export_holds_out_what_train_prm_and_eval_prm_hold_out(tmp_path, n, fraction, seed):
    stats = export_dataset(_records(n), tmp_path, val_fraction=fraction, seed=seed)
    rows = list(read_jsonl(tmp_path / "prm_examples.jsonl"))
    # train-prm (no --eval_dataset) and eval-prm (--split heldout) both call split_rows
    train, held = split_rows(rows, fraction, seed)
    assert sorted({r["query_id"] for r in held}) == stats["val_query_ids"]
    assert {r["query_id"] for r in read_jsonl(tmp_path / "validation.jsonl")} == set(stats["val_query_ids"])
    assert len(stats["val_query_ids"]) == heldout_count(n, fraction)
    assert len(train) == stats["train"] and json.loads((tmp_path / "summary.json").read_text())["validation"] == len(held)
