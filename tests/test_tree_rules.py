"""Leaf success modes and label rules on hand-built trees (issue 14), values computed by hand."""

from __future__ import annotations

import pytest

from codetool.config import ConfigError, load_config
from codetool.rewards import latent_reward
from codetool.tree.build import label_record, summarize
from codetool.tree.config import TreeConfig
from codetool.tree.labels import label_tree, leaf_success, sibling_pairs

TOOLS = ["get_weather", "get_city"]


def call(name: str, status: str = "ok") -> dict:
    # every response here says what the answers below state (the grounded check reads it, issue 37)
    return {"name": name, "status": status, "response": '{"city": "Paris", "weather": "sunny, it rains"}'}


def node(parent, *, ok=True, leaf=False, ended=None, answer=None, calls=()):
    return {"parent": parent, "ok": ok, "leaf": leaf, "ended": ended, "final_answer": answer,
            "result": {"tool_calls": list(calls)}, "tool_calls": len(calls), "success": None}


def success_of(tree, mode, tool_names=TOOLS):
    for node_id, n in tree.items():
        if n["leaf"]:
            n["success"] = leaf_success(tree, node_id, mode, tool_names=tool_names)
    return {k: n["success"] for k, n in tree.items() if n["leaf"]}


def tool_free_finish_tree():
    # 1: finish("made up") at once, no tool call.
    # 2: get_weather(...) ok -> 2-1 finish("it rains") (a grounded success), 2-2 give_up.
    return {
        "1": node(None, leaf=True, ended="finish", answer="made up"),
        "2": node(None, calls=[call("get_weather")]),
        "2-1": node("2", leaf=True, ended="finish", answer="it rains"),
        "2-2": node("2", leaf=True, ended="give_up"),
    }


def test_success_modes_by_hand():
    tree = {
        "1": node(None, leaf=True, ended="finish", answer="made up"),            # tool-free finish
        "2": node(None, calls=[call("get_weather", "error")]),                   # failed call
        "2-1": node("2", leaf=True, ended="finish", answer="sunny"),             # no successful call
        "2-2": node("2", leaf=True, calls=[call("get_city")], ended="finish", answer="Paris"),
        "3": node(None, calls=[call("print_helper")]),                           # not a listed tool
        "3-1": node("3", leaf=True, ended="finish", answer="Paris"),
        "3-2": node("3", leaf=True, ended="finish", answer="   ", calls=[call("get_city")]),  # empty
        "4": node(None, ok=False, leaf=True),                                    # code failed
        "5": node(None, calls=[call("get_city")]),
        "5-1": node("5", leaf=True, ended="give_up"),
    }
    assert success_of(tree, "grounded") == {"1": False, "2-1": False, "2-2": True, "3-1": False, "3-2": False,
                                            "4": False, "5-1": False}
    # executed: every step on the path ran cleanly (the public code); "2" has ok=True here
    assert success_of(tree, "executed") == {"1": True, "2-1": True, "2-2": True, "3-1": True, "3-2": True,
                                            "4": False, "5-1": True}
    tree["2"]["ok"] = False  # a tool error makes R_spot 0, and the whole path unexecuted
    assert success_of(tree, "executed")["2-2"] is False
    # a query without tools: a non-empty finish is enough; None: any recorded call counts
    assert success_of(tree, "grounded", tool_names=[])["1"] is True
    assert success_of(tree, "grounded", tool_names=None)["3-1"] is True
    with pytest.raises(ValueError, match="success mode"):
        leaf_success(tree, "1", "answered")


@pytest.mark.parametrize("rule", ["ours", "latent"])
@pytest.mark.parametrize("mode", ["grounded", "judged"])
def test_tool_free_finish_loses_to_a_tool_calling_success(rule, mode):
    tree = tool_free_finish_tree()
    success_of(tree, "grounded")  # judged = grounded + a judge that says Solved to every answer
    label_tree(tree)
    assert tree["1"]["latent_reward"] == pytest.approx(0.9)
    assert tree["2"]["lr_soft"] == 0.5 and tree["2"]["tau"] == 1.0
    pairs, counts = sibling_pairs(tree, rule)
    assert ("2", "1") in pairs
    assert ("2-1", "2-2") in pairs


def test_tool_free_finish_under_executed_success():
    # executed (the public code) counts the made-up answer a success: the reference rule then
    # sees no success difference at the top (both hard LR 1, soft 1 vs 1) and drops the pair.
    tree = tool_free_finish_tree()
    success_of(tree, "executed")
    label_tree(tree)
    pairs, counts = sibling_pairs(tree, "ours")
    assert ("2", "1") not in pairs and ("1", "2") not in pairs
    assert counts["dropped"]["no_success_difference"] == 2  # (1, 2) and (2-1, 2-2)


def give_up_tree():
    # 1: give_up at once. 2: explores two steps, and every leaf fails.
    return {
        "1": node(None, leaf=True, ended="give_up"),
        "2": node(None, calls=[call("get_city")]),
        "2-1": node("2", calls=[call("get_weather")]),
        "2-1-1": node("2-1", leaf=True),
        "2-1-2": node("2-1", leaf=True, ended="give_up"),
        "2-2": node("2", leaf=True),
    }


@pytest.mark.parametrize("rule,reason", [("ours", "no_success_difference"), ("latent", "both_failed")])
def test_immediate_give_up_beside_an_explorer_when_all_fail_gives_no_pair(rule, reason):
    tree = give_up_tree()
    success_of(tree, "grounded")
    label_tree(tree)
    # tau alone would rank the give_up first: 0.9 > 0.9 * 0.95^(1.67/20)
    assert tree["1"]["latent_reward"] > tree["2"]["latent_reward"]
    pairs, counts = sibling_pairs(tree, rule)
    assert pairs == []
    assert counts["dropped"][reason] == 3  # (1, 2), (2-1, 2-2), (2-1-1, 2-1-2)


def test_a_tau_only_difference_decides_only_under_latent():
    # 1 and 2 both succeed on every leaf; 1 gets there in one step, 2 in two.
    tree = {
        "1": node(None, calls=[call("get_city")]),
        "1-1": node("1", leaf=True, ended="finish", answer="Paris"),
        "1-2": node("1", leaf=True, ended="finish", answer="Paris"),
        "2": node(None, calls=[call("get_city")]),
        "2-1": node("2", calls=[call("get_weather")]),
        "2-1-1": node("2-1", leaf=True, ended="finish", answer="Paris"),
        "2-1-2": node("2-1", leaf=True, ended="finish", answer="Paris"),
        "2-2": node("2", calls=[call("get_weather")]),
        "2-2-1": node("2-2", leaf=True, ended="finish", answer="Paris"),
        "2-2-2": node("2-2", leaf=True, ended="finish", answer="Paris"),
    }
    success_of(tree, "grounded")
    label_tree(tree)
    assert tree["1"]["latent_reward"] == pytest.approx(latent_reward(1.0, 1.0))
    assert tree["2"]["latent_reward"] == pytest.approx(latent_reward(1.0, 2.0))
    pairs, counts = sibling_pairs(tree, "ours")
    assert ("1", "2") not in pairs and counts["decided"]["success_share"] == 0
    assert counts["dropped"]["no_success_difference"] == 5  # one pair per sibling group
    pairs, counts = sibling_pairs(tree, "latent")
    assert pairs == [("1", "2")] and counts["decided"]["latent_reward"] == 1
    assert counts["dropped"]["tie"] == 4  # equal leaves and equal subtrees tie exactly
    # sum mode (the public code) makes the gap wider but not different in sign
    label_tree(tree, tau_mode="sum")
    assert tree["2"]["tau"] == 8.0 and ("1", "2") in sibling_pairs(tree, "latent")[0]


def test_label_record_recomputes_success_and_counts_pairs():
    tree = tool_free_finish_tree()
    for node_id, n in tree.items():
        n.update(code=f"pass  # step {node_id}", text="", observation="")
    record = {"query_id": "q", "nodes": tree, "tool_names": TOOLS, "summary": {"seconds": 2.0}}
    label_record(record, TreeConfig(), recompute_success=True)
    assert record["summary"]["successful_leaves"] == 1
    assert [tuple(p) for p in record["pairs"]] == [("2", "1"), ("2-1", "2-2")]
    assert record["summary"]["pair_counts"]["decided"]["success_share"] == 2
    label_record(record, TreeConfig(success="executed"), recompute_success=True)
    assert record["summary"]["successful_leaves"] == 3 and record["pairs"] == []
    total = summarize([record, record])
    assert total["pairs_by_success_share"] == 0 and total["dropped_no_success_difference"] == 4
    assert total["pairs"] == 0 and total["seconds_per_tree"] == 2.0


def test_tree_config_rejects_bad_success_and_missing_judge():
    with pytest.raises(ConfigError, match="judge"):
        TreeConfig(success="judged", judge="none")
    with pytest.raises(ConfigError, match="grounded"):  # the old default is gone
        load_config(TreeConfig, overrides={"success": "answered"})
    with pytest.raises(ConfigError, match="reference"):
        load_config(TreeConfig, overrides={"label_rule": "tau"})
    assert TreeConfig().success == "grounded" and TreeConfig().label_rule == "ours"


def test_an_answer_from_a_finishing_step_that_failed_is_no_success():
    tree = {"1": node(None, calls=[call("get_weather")]),
            "1-1": node("1", leaf=True, ended="finish", answer="sunny", ok=False)}
    tree["1-1"]["result"]["ok"] = False  # finish() from a __del__, then the step raised
    assert success_of(tree, "grounded")["1-1"] is False
    tree["1-1"]["result"]["ok"] = True
    assert success_of(tree, "grounded")["1-1"] is True
