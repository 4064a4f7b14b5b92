"""Tree labels on hand-built trees, checked against values computed by hand."""

import math

import pytest

from codetool.rewards import latent_reward
from codetool.tree.dataset import split_query_ids, tree_rows
from codetool.tree.labels import children_of, label_tree, path_to, sibling_pairs


def _tree():
    # 1 (ok) ── 1-1 (leaf, success)
    #        └─ 1-2 ── 1-2-1 ── 1-2-1-1 (leaf, fail)
    #                         └ 1-2-1-2 (leaf, success)
    #               └─ 1-2-2 (leaf, fail)
    # 2 (code failed, leaf, fail)
    return {
        "1": {"parent": None, "ok": True, "leaf": False},
        "1-1": {"parent": "1", "ok": True, "leaf": True, "success": True},
        "1-2": {"parent": "1", "ok": True, "leaf": False},
        "1-2-1": {"parent": "1-2", "ok": True, "leaf": False},
        "1-2-1-1": {"parent": "1-2-1", "ok": True, "leaf": True, "success": False},
        "1-2-1-2": {"parent": "1-2-1", "ok": True, "leaf": True, "success": True},
        "1-2-2": {"parent": "1-2", "ok": True, "leaf": True, "success": False},
        "2": {"parent": None, "ok": False, "leaf": True, "success": False},
    }


def test_lr_tau_and_latent_reward_by_hand():
    tree = label_tree(_tree())
    # node 1: leaves 1-1 (depth 1, win), 1-2-1-1 (3, loss), 1-2-1-2 (3, win), 1-2-2 (2, loss)
    assert tree["1"]["n_leaves"] == 4
    assert tree["1"]["lr_soft"] == pytest.approx(0.5)
    assert tree["1"]["lr_hard"] == 1.0
    assert tree["1"]["tau"] == pytest.approx((1 + 3 + 3 + 2) / 4)
    assert tree["1"]["latent_reward"] == pytest.approx(0.9 ** 0.5 * 0.95 ** (2.25 / 20))
    # node 1-2: leaves 1-2-1-1 (2, loss), 1-2-1-2 (2, win), 1-2-2 (1, loss)
    assert tree["1-2"]["lr_soft"] == pytest.approx(1 / 3)
    assert tree["1-2"]["tau"] == pytest.approx(5 / 3)
    # a leaf: its own success, tau 0
    assert tree["1-1"]["lr_soft"] == 1.0 and tree["1-1"]["tau"] == 0.0
    assert tree["1-1"]["latent_reward"] == pytest.approx(1.0)
    assert tree["2"]["lr_hard"] == 0.0 and tree["2"]["latent_reward"] == pytest.approx(0.9)


def test_tau_definition_field_case():
    # field case tau-definition: leaves at depths 1 and 3 below a node -> mean 2, sum 4.
    tree = {
        "1": {"parent": None, "ok": True, "leaf": False},
        "1-1": {"parent": "1", "ok": True, "leaf": True, "success": True},
        "1-2": {"parent": "1", "ok": True, "leaf": False},
        "1-2-1": {"parent": "1-2", "ok": True, "leaf": False},
        "1-2-1-1": {"parent": "1-2-1", "ok": True, "leaf": True, "success": False},
    }
    assert label_tree({k: dict(v) for k, v in tree.items()})["1"]["tau"] == 2.0
    assert label_tree({k: dict(v) for k, v in tree.items()}, tau_mode="sum")["1"]["tau"] == 4.0
    with pytest.raises(ValueError, match="tau_mode"):
        label_tree(tree, tau_mode="median")


def test_sibling_pairs_executability_first_then_success_under_both_rules():
    tree = label_tree(_tree())
    # (1 vs 2): 2 failed to execute -> 1 wins; (1-1 vs 1-2): soft LR 1 > 1/3 -> 1-1 wins;
    # (1-2-1 vs 1-2-2): hard LR 1 > 0 -> 1-2-1 wins; (1-2-1-1 vs 1-2-1-2): success wins.
    expected = {("1", "2"), ("1-1", "1-2"), ("1-2-1", "1-2-2"), ("1-2-1-2", "1-2-1-1")}
    pairs, counts = sibling_pairs(tree)
    assert set(pairs) == expected
    assert counts["decided"] == {"executability": 1, "success_share": 3, "latent_reward": 0}
    assert sum(counts["dropped"].values()) == 0
    pairs, counts = sibling_pairs(tree, "latent")
    assert set(pairs) == expected
    assert counts["decided"] == {"executability": 1, "success_share": 0, "latent_reward": 3}
    # executability decides even against a higher latent reward and LR
    tree["2"].update(latent_reward=1.0, lr_soft=1.0, lr_hard=1.0)
    assert ("1", "2") in sibling_pairs(tree)[0] and ("1", "2") in sibling_pairs(tree, "latent")[0]
    with pytest.raises(ValueError, match="label rule"):
        sibling_pairs(tree, "tau")


def test_siblings_without_success_difference_are_dropped_and_counted():
    tree = label_tree({
        "1": {"parent": None, "ok": True, "leaf": True, "success": False},
        "2": {"parent": None, "ok": True, "leaf": True, "success": False},
    })
    pairs, counts = sibling_pairs(tree)
    assert pairs == [] and counts["dropped"]["no_success_difference"] == 1
    pairs, counts = sibling_pairs(tree, "latent")
    assert pairs == [] and counts["dropped"]["both_failed"] == 1
    # both successful leaves: an exact latent tie
    for n in tree.values():
        n["success"] = True
    pairs, counts = sibling_pairs(label_tree(tree), "latent")
    assert pairs == [] and counts["dropped"]["tie"] == 1


def _twins(code_a: str, code_b: str, obs_a: str = "Output:\n{'value': 521.95}", obs_b: str | None = None):
    # two first steps, each with one successful and one failed leaf below in different shares:
    # 1 -> 1-1 (success), 1-2 (success); 2 -> 2-1 (success), 2-2 (fail)
    obs_b = obs_a if obs_b is None else obs_b
    tree = {"1": {"parent": None, "ok": True, "leaf": False, "code": code_a, "observation": obs_a},
            "2": {"parent": None, "ok": True, "leaf": False, "code": code_b, "observation": obs_b}}
    for parent, wins in (("1", (True, True)), ("2", (True, False))):
        for i, win in enumerate(wins, 1):
            tree[f"{parent}-{i}"] = {"parent": parent, "ok": True, "leaf": True, "success": win,
                                     "code": f"finish('{parent}-{i}')", "observation": ""}
    return label_tree(tree)


@pytest.mark.parametrize("rule", ["ours", "latent"])
def test_two_samples_of_the_same_step_are_no_pair(rule):
    # The same call sampled twice: its subtrees differ by the later steps' sampling alone, and the PRM
    # would read one input under both labels (48 testbed trees: 53 of 160 pairs were such twins).
    call = 'result = convert_units(value=840, from_unit="km", to_unit="mi")\nprint(result)'
    pairs, counts = sibling_pairs(_twins(call, call + "  \n\n"), rule)  # trailing whitespace aside
    assert ("1", "2") not in pairs and counts["dropped"]["same_step"] == 1
    assert ("1-1", "1-2") not in pairs and ("2", "1") not in pairs
    # one character of code apart, or the same code with another observation: a pair
    other = call.replace("840", "480")
    assert ("1", "2") in sibling_pairs(_twins(call, other), rule)[0]
    assert ("1", "2") in sibling_pairs(_twins(call, call, obs_b="Error: ToolError: timeout"), rule)[0]
    planned = _twins(call, call)  # the same code under another plan (step_text): the PRM reads two inputs
    planned["2"]["text"] = f"Convert first.\n```python\n{call}\n```"
    assert ("1", "2") in sibling_pairs(planned, rule)[0]


def test_latent_reward_formula_and_errors():
    assert latent_reward(1.0, 0.0) == 1.0
    assert latent_reward(0.0, 20.0) == pytest.approx(0.9 * 0.95)
    assert math.isclose(latent_reward(0.25, 4, alpha=0.5, beta=0.5, max_len=2), 0.5 ** 0.75 * 0.25)
    for bad in ({"lr": 1.5, "tau": 0}, {"lr": 0.5, "tau": -1}):
        with pytest.raises(ValueError):
            latent_reward(**bad)


def test_paths_children_and_rows():
    tree = label_tree(_tree())
    assert path_to(tree, "1-2-1-2") == ["1", "1-2", "1-2-1", "1-2-1-2"]
    assert children_of(tree)[None] == ["1", "2"]
    for node_id, node in tree.items():
        node.update(code=f"step_{node_id.replace('-', '_')}()", observation=f"out {node_id}")
    record = {"query_id": "q7", "query": "Q?", "tools": "def f(): ...", "nodes": tree,
              "pairs": sibling_pairs(tree)[0]}  # observation_history absent: "all"
    rows, skipped = tree_rows(record)
    assert skipped == 0 and len(rows) == 8 and sum(r["label"] for r in rows) == 4
    row = next(r for r in rows if r["source"] == "q7:1-2-1-2")
    assert row["label"] == 1 and [h["code"] for h in row["history"]] == ["step_1()", "step_1_2()", "step_1_2_1()"]
    assert row["candidate"] == "step_1_2_1_2()" and row["candidate_output"] == "out 1-2-1-2"
    tree["2"]["code"] = None  # no code block: left out, counted
    rows, skipped = tree_rows(record)
    assert skipped == 1 and len(rows) == 6
    rows, _ = tree_rows(record, emit="nodes")
    assert len(rows) == 7


def test_split_is_by_query_and_deterministic():
    ids = [f"q{i}" for i in range(10)]
    val = split_query_ids(ids + ids, 0.2, seed=3)
    assert len(val) == 2 and val == split_query_ids(list(reversed(ids)), 0.2, seed=3)
    assert len(split_query_ids(["a", "b"], 0.1)) == 1
    assert split_query_ids(["a"], 0.5) == set()


def test_rows_of_step_text_trees_carry_the_plans():
    """A tree grown with ``step_format: step_text`` exports each step's plan line (history and
    candidate); a code-only tree exports none."""
    tree = label_tree(_tree())
    for node_id, node in tree.items():
        code = f"step_{node_id.replace('-', '_')}()"
        node.update(code=code, observation=f"out {node_id}", text=f"Plan {node_id}.\n```python\n{code}\n```")
    record = {"query_id": "q7", "query": "Q?", "tools": "def f(): ...", "nodes": tree,
              "pairs": sibling_pairs(tree)[0], "step_format": "step_text"}
    row = next(r for r in tree_rows(record)[0] if r["source"] == "q7:1-2-1-2")
    assert row["candidate_plan"] == "Plan 1-2-1-2." and [h["plan"] for h in row["history"]] == [
        "Plan 1.", "Plan 1-2.", "Plan 1-2-1."]
    record["step_format"] = "code_only"
    row = next(r for r in tree_rows(record)[0] if r["source"] == "q7:1-2-1-2")
    assert row["candidate_plan"] == "" and all("plan" not in h for h in row["history"])


# ------------------------------------------------------------- not executed (issue 37)
def _lost(parent):
    """A node whose code the executor could not run (a failure of the machine, after its retries)."""
    return {"parent": parent, "ok": False, "leaf": True, "success": None, "executed": False,
            "result": {"outcome": "not_executed", "attempts": 3}}


def test_a_not_executed_node_is_no_information_for_its_pairs_and_its_ancestors():
    tree = {
        "1": {"parent": None, "ok": True, "leaf": False},
        "1-1": {"parent": "1", "ok": True, "leaf": True, "success": True},
        "1-2": _lost("1"),
        "2": {"parent": None, "ok": False, "leaf": True, "success": False},
    }
    label_tree(tree)
    # 1's only informative leaf is 1-1: LR 1, tau 1 (1-2 counts neither as a loss nor in tau)
    assert tree["1"]["n_leaves"] == 1 and tree["1"]["lr_soft"] == 1.0 and tree["1"]["tau"] == 1.0
    assert tree["1-2"]["lr_soft"] is None and tree["1-2"]["latent_reward"] is None
    pairs, counts = sibling_pairs(tree)
    # (1-1, 1-2) is dropped: 1-2 did not fail, it did not run; (1, 2) stands on executability
    assert pairs == [("1", "2")]
    assert counts["dropped"]["not_executed"] == 1 and counts["decided"]["executability"] == 1


def test_a_node_whose_every_leaf_was_not_executed_is_dropped_too():
    tree = {
        "1": {"parent": None, "ok": True, "leaf": False},
        "1-1": _lost("1"),
        "1-2": _lost("1"),
        "2": {"parent": None, "ok": True, "leaf": True, "success": False},
    }
    label_tree(tree)
    assert tree["1"]["n_leaves"] == 0 and tree["1"]["lr_hard"] is None
    for rule in ("ours", "latent"):
        pairs, counts = sibling_pairs(tree, rule)
        assert pairs == [] and counts["dropped"]["not_executed"] == 2, rule


def test_a_legacy_worker_lost_that_ran_nothing_counts_as_not_executed():
    legacy = {"parent": "1", "ok": False, "leaf": True, "success": False,
              "result": {"outcome": "worker_lost", "error_message": "WorkerLost: the state this step was forked "
                                                                    "from could not be copied (x); nothing ran."}}
    crashed = {"parent": "1", "ok": False, "leaf": True, "success": False,   # the code's own crash: a failure
               "result": {"outcome": "worker_lost", "error_message": "WorkerLost: the sandbox process exited "
                                                                     "with code 3 (os._exit or a crash)."}}
    base = {"1": {"parent": None, "ok": True, "leaf": False},
            "1-1": {"parent": "1", "ok": True, "leaf": True, "success": True}}
    tree = label_tree({**base, "1-2": legacy})
    assert sibling_pairs(tree)[1]["dropped"]["not_executed"] == 1
    tree = label_tree({**base, "1-2": crashed})
    assert sibling_pairs(tree)[0] == [("1-1", "1-2")]


def test_not_executed_nodes_give_no_dataset_row():
    tree = label_tree({"1": {"parent": None, "ok": True, "leaf": True, "success": True, "code": "x = 1",
                             "observation": ""},
                       "2": {**_lost(None), "code": "y = 1", "observation": ""}})
    record = {"query_id": "q", "query": "Q", "tools": "", "nodes": tree, "pairs": []}
    rows, skipped = tree_rows(record, emit="nodes")
    assert [r["source"] for r in rows] == ["q:1"] and skipped == 0
