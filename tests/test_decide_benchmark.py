"""The decision benchmark's parts: labelled set, When2Tool-style metrics, threshold sweep."""

from __future__ import annotations

import pytest

from codetool.decide.labelled import build_items, load_tool_free
from codetool.decide.metrics import (
    SEARCH,
    action_metrics,
    answer_matches,
    baseline_row,
    first_action,
    sweep_thresholds,
    threshold_row,
)
from codetool.decide.records import Cost, DecisionRecord, RouteCosts
from codetool.decide.stage import NONE
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.search.records import Candidate, Step, Trajectory


def test_packaged_tool_free_queries_are_many_varied_and_well_formed():
    rows = load_tool_free()
    assert len(rows) >= 100
    assert len({r["id"] for r in rows}) == len(rows) and len({r["query"] for r in rows}) == len(rows)
    categories = {r["category"] for r in rows}
    assert {"general_knowledge", "arithmetic", "unit_conversion", "writing", "definition", "reasoning",
            "code"} <= categories
    assert sum("answer" in r for r in rows) >= 60


def test_a_bad_tool_free_file_is_a_user_error(tmp_path):
    from codetool import CodetoolError

    bad = tmp_path / "free.jsonl"
    bad.write_text('{"id": "a", "query": "q", "category": "c"}\n{not json\n')
    with pytest.raises(CodetoolError, match="line 2: not valid JSON"):
        load_tool_free(bad)
    bad.write_text('{"id": "a", "query": "q"}\n')
    with pytest.raises(CodetoolError, match="line 1: needs id, query and category"):
        load_tool_free(bad)
    with pytest.raises(CodetoolError, match="not found"):
        load_tool_free(tmp_path / "missing.jsonl")


def test_action_metrics_on_hand_made_cases():
    rows = [DecisionRecord(needs_tool=True, gold=["a"]), DecisionRecord(needs_tool=True, gold=["a", "b"]),
            DecisionRecord(needs_tool=True, gold=["a"]), DecisionRecord(needs_tool=True, gold=["a"])]
    rows += [DecisionRecord(needs_tool=False) for _ in range(4)]
    actions = ["a", "c", NONE, SEARCH, NONE, "a", SEARCH, None]
    m = action_metrics(rows, actions)
    assert (m["n"], m["n_tool"], m["n_free"]) == (8, 4, 4)
    assert m["tool_invocation_accuracy"] == 0.25 and m["tool_selection_error"] == 0.25
    assert m["hallucination_rate"] == 0.25 and m["deferred_rate"] == 0.25
    assert m["unnecessary_tool_rate"] == 0.75
    assert m["decision_accuracy"] == 0.25 and m["necessity_accuracy"] == 0.5
    # a second gold function counts as right; no tool-free rows gives None, not a division error
    m = action_metrics(rows[:2], ["a", "b"])
    assert m["tool_invocation_accuracy"] == 1.0 and m["unnecessary_tool_rate"] is None


def _rec(needs_tool, gold, choice, conf, direct, fast, search, fast_first=None, search_first=None):
    def cost(tokens):
        return None if tokens is None else Cost(tokens, tokens / 10)

    return DecisionRecord(needs_tool=needs_tool, gold=gold, choice=choice, confidence=conf, method="logprobs",
                          costs=RouteCosts(cost(10), direct=cost(direct), fast=cost(fast), search=cost(search)),
                          fast_first_action=fast_first, search_first_action=search_first)


RECORDS = [_rec(True, ["a"], "a", 0.9, 20, 30, 100, "a", "a"),
           _rec(False, [], NONE, 0.8, 20, None, 80, None, "b"),
           _rec(True, ["a"], NONE, 0.3, 20, None, 90, None, "a")]


def test_threshold_rows_use_the_cost_and_first_action_of_the_route_taken():
    row = threshold_row(RECORDS, 0.5, 0.5)
    assert row["routes"] == {"direct": 1, "fast": 1, "search": 1}
    assert row["tokens_per_query"] == pytest.approx((40 + 30 + 100) / 3)
    assert row["seconds_per_query"] == pytest.approx((4 + 3 + 10) / 3)
    assert row["tool_invocation_accuracy"] == 1.0 and row["hallucination_rate"] == 0.0
    assert row["unnecessary_tool_rate"] == 0.0
    always_act = threshold_row(RECORDS, 0.0, 0.0)
    assert always_act["routes"] == {"direct": 2, "fast": 1, "search": 0}
    assert always_act["hallucination_rate"] == 0.5 and always_act["tokens_per_query"] == pytest.approx(100 / 3)
    never = threshold_row(RECORDS, 0.95, 0.95)
    assert never["routes"]["search"] == 3 and never["unnecessary_tool_rate"] == 1.0
    assert never["tokens_per_query"] == pytest.approx(100)  # decision + search on every query
    base = baseline_row(RECORDS)
    assert base["tokens_per_query"] == pytest.approx(90) and base["seconds_per_query"] == pytest.approx(9)
    assert base["tool_invocation_accuracy"] == 1.0 and base["unnecessary_tool_rate"] == 1.0


def test_unmeasured_routes_give_no_cost_and_deferred_actions():
    records = [_rec(True, ["a"], "a", 0.9, 20, None, None), _rec(True, ["a"], "b", 0.4, 20, None, None)]
    row = threshold_row(records, 0.5, 0.5)
    assert row["tokens_per_query"] is None and baseline_row(records) is None
    assert row["tool_invocation_accuracy"] == 0.5 and row["deferred_rate"] == 0.5  # fast uses the chosen name


def test_sweep_covers_every_recorded_confidence():
    rows = sweep_thresholds(RECORDS)
    assert [r["t_none"] for r in rows] == [0.0, 0.3, 0.8, 0.9, 1.0]
    assert [r["routes"]["search"] for r in rows] == [0, 0, 1, 2, 3]
    assert [r["t_none"] for r in sweep_thresholds(RECORDS, [0.5, 0.1])] == [0.1, 0.5]


def test_first_action_and_answer_matching():
    def cand(i, *names):
        return Candidate(i, "", "pass", ExecutionResult(ok=True, tool_calls=[ToolCall(n) for n in names]))

    traj = Trajectory("1", "q", steps=[Step(0, [cand(0, "wrong"), cand(1)], chosen=1),
                                       Step(1, [cand(0, "x", "y")], chosen=0)])
    assert first_action(traj) == "x" and first_action(Trajectory("2", "q")) == NONE and first_action(None) is None
    assert answer_matches("The capital is Paris.", "Paris")
    assert answer_matches("It is about 37.78 C", "about 37.8 degrees Celsius") is False
    assert answer_matches("That gives 1,024 in total", "1024")
    assert answer_matches("No, since 91 = 7 x 13.", "No (91 = 7 x 13)")
    assert not answer_matches("It is not prime; 91 is composite", "No (91 = 7 x 13)")
    assert answer_matches("You spend $13.5", "$13.50") and not answer_matches("391", "39")


def test_build_items_draws_a_labelled_mixed_set(shared_data):
    items, skipped = build_items(["G1_instruction"], 6, 5, seed=3, data=str(shared_data))
    tool, free = [i for i in items if i.needs_tool], [i for i in items if not i.needs_tool]
    assert len(tool) == 6 and len(free) == 5 and isinstance(skipped, dict)
    for it in tool:
        names = {a.name for a in it.apis}
        assert it.gold and set(it.gold) <= names and it.group == "G1_instruction"
    assert all(it.apis and it.tools_from and not it.gold for it in free)
    again, _ = build_items(["G1_instruction"], 6, 5, seed=3, data=str(shared_data))
    assert [i.item_id for i in again] == [i.item_id for i in items]
