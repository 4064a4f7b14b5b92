"""The decision benchmark: labelled set, When2Tool-style metrics, threshold sweep, report files."""

from __future__ import annotations

import json
import math

import pytest

from codetool.decide import benchmark as ed
from codetool.decide.benchmark import DecisionEvalConfig
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
from codetool.models.backends import ScriptedBackend
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


def test_config_is_checked_early():
    from codetool.config import ConfigError
    from codetool.search.config import SearchConfig

    with pytest.raises(ConfigError, match="search.latent none"):
        DecisionEvalConfig(run_search=True, search=SearchConfig())
    with pytest.raises(ConfigError, match="thresholds"):
        DecisionEvalConfig(thresholds=[1.5])
    with pytest.raises(ConfigError, match="n_tool"):
        DecisionEvalConfig(n_tool=0, n_free=0)


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
    cfg = DecisionEvalConfig(data=str(shared_data), n_tool=6, n_free=5, seed=3)
    items, skipped = build_items(cfg)
    tool, free = [i for i in items if i.needs_tool], [i for i in items if not i.needs_tool]
    assert len(tool) == 6 and len(free) == 5 and isinstance(skipped, dict)
    for it in tool:
        names = {a.name for a in it.apis}
        assert it.gold and set(it.gold) <= names and it.group == "G1_instruction"
    assert all(it.apis and it.tools_from and not it.gold for it in free)
    again, _ = build_items(cfg)
    assert [i.item_id for i in again] == [i.item_id for i in items]


def _fake_backend(prompt_or_none=None):
    def option_scores(prompt, options):
        # prefer NONE for short questions, else the last function offered
        query = prompt[-1]["content"]
        best = NONE if len(query) < 120 else options[-1]
        return [math.log(0.7 if o == best else 0.3 / (len(options) - 1)) for o in options]
    return ScriptedBackend(lambda prompt: "Paris is the answer.", option_scores=option_scores)


def test_eval_decision_command_writes_the_report(tmp_path, shared_data, monkeypatch, canary_env):
    free = tmp_path / "free.jsonl"
    free.write_text("\n".join(json.dumps(r) for r in [
        {"id": "f1", "query": "What is the capital of France?", "category": "general_knowledge", "answer": "Paris"},
        {"id": "f2", "query": f"Write a haiku about {canary_env}.", "category": "writing"},
        {"id": "f3", "query": "What is 2 + 2?", "category": "arithmetic", "answer": "4"}]) + "\n")
    monkeypatch.setattr("codetool.models.backends.make_backend", lambda spec, **kw: _fake_backend())
    cfg = DecisionEvalConfig(data=str(shared_data), n_tool=4, n_free=3, free_queries=str(free),
                             output=str(tmp_path / "out"))
    assert ed.eval_decision_command(cfg) == 0
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["tool"] == 4 and report["counts"]["free"] == 3 and report["method"] == "logprobs"
    assert set(report["decision_by_scoring"]) == {"sum", "chars", "pmi-sum", "pmi-chars"}
    assert report["scoring"] == "pmi-sum"
    assert report["direct_answers"] == {"with_reference": 2, "correct": 1, "accuracy": 0.5}
    assert report["always_search"] is None and report["saving"] is None
    assert report["at_threshold"]["routes"]["direct"] + report["at_threshold"]["routes"]["fast"] + \
        report["at_threshold"]["routes"]["search"] == 7
    assert (out / "decision_sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| decision accuracy (first action right) |" in md and "Threshold sweep" in md
    assert len((out / "records.jsonl").read_text().splitlines()) == 7
    for name in ("report.json", "report.md", "records.jsonl"):
        assert canary_env not in (out / name).read_text()

    # a second pass reuses the recorded decisions and direct answers without calling the model
    def no_model(prompts, *args, **kwargs):
        raise AssertionError("the model was called despite reuse")
    idle = ScriptedBackend([], option_scores=lambda p, o: [0.0] * len(o))
    idle.generate = idle.option_logprobs = no_model
    monkeypatch.setattr("codetool.models.backends.make_backend", lambda spec, **kw: idle)
    again = DecisionEvalConfig(data=str(shared_data), n_tool=4, n_free=3, free_queries=str(free),
                               output=str(tmp_path / "again"), reuse=str(out / "records.jsonl"))
    assert ed.eval_decision_command(again) == 0
    second = json.loads((tmp_path / "again" / "report.json").read_text())
    assert second["decision"] == report["decision"] and second["direct_answers"] == report["direct_answers"]
    with pytest.raises(ed.CodetoolError, match="same groups"):
        ed.eval_decision_command(DecisionEvalConfig(data=str(shared_data), n_tool=5, n_free=3, free_queries=str(free),
                                                    output=str(tmp_path / "x"), reuse=str(out / "records.jsonl")))


def test_measured_routes_give_the_saving_against_always_search(tmp_path, shared_data, monkeypatch):
    def traj(qid, tokens, seconds, calls, routing=None):
        cand = Candidate(0, "", "pass", ExecutionResult(ok=True, tool_calls=[ToolCall(n) for n in calls]))
        return Trajectory(qid, "q", prompt_tokens=tokens, wall_time_s=seconds, routing=routing,
                          steps=[Step(0, [cand])])

    def fake_run_search(cfg, items, decisions, policy, out):
        fast = {it.item_id: traj(it.item_id, d.prompt_tokens + d.scored_tokens + 50, d.seconds + 1.0,
                                 [d.tool], {"fallback": None})
                for it, d in zip(items, decisions) if d.tool}
        full = {it.item_id: traj(it.item_id, 400, 20.0, it.gold[:1] or ["x"]) for it in items}
        return fast, full

    monkeypatch.setattr("codetool.models.backends.make_backend", lambda spec, **kw: _fake_backend())
    monkeypatch.setattr(ed, "_run_search", fake_run_search)
    cfg = DecisionEvalConfig(data=str(shared_data), n_tool=3, n_free=3, run_search=True, output=str(tmp_path / "o"))
    assert ed.eval_decision_command(cfg) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    assert report["always_search"]["tokens_per_query"] == 400 and report["always_search"]["unnecessary_tool_rate"] == 1.0
    for r in records:
        if r["costs"]["fast"] is not None:
            assert r["costs"]["fast"] == {"tokens": 50, "seconds": pytest.approx(1.0)}
    at = report["at_threshold"]
    assert report["saving"]["tokens"] == pytest.approx(1 - at["tokens_per_query"] / 400)
    assert all(r["tokens_per_query"] is not None for r in report["sweep"])


def test_run_search_with_the_real_executor_and_simulator(tmp_path, shared_data, monkeypatch):
    """Fast paths (a failing one falls back) and the always-search baseline, through the real
    executor and tool simulator, with a scripted policy."""
    import re

    def option_scores(prompt, options):
        query = prompt[-1]["content"]
        best = NONE if "Request: N/A" in query or len(query) < 150 else options[1]
        return [math.log(0.8 if o == best else 0.2 / (len(options) - 1)) for o in options]

    def reply(prompt):
        text = "\n".join(m["content"] for m in prompt)
        hint = re.search(r"Hint: the function (\w+) fits", text)
        if "Write the next step" in text:
            code = "finish('after the fallback')"
        elif hint:  # called without its required arguments: a tool error, so the search takes over
            code = f"r = {hint.group(1)}()\nfinish(str(r))"
        else:
            code = "print('searching')\nfinish('searched')"
        # with code_prefix the prompt ends with the opening fence and only the code comes back
        prefixed = prompt[-1]["role"] == "assistant" and prompt[-1]["content"].startswith("```")
        return code if prefixed else f"```python\n{code}\n```"

    monkeypatch.setattr("codetool.models.backends.make_backend",
                        lambda spec, **kw: ScriptedBackend(reply, option_scores=option_scores))
    cfg = DecisionEvalConfig(data=str(shared_data), n_tool=2, n_free=1, run_search=True, answer_direct=False,
                             output=str(tmp_path / "o"))
    cfg.search.max_steps = 2
    assert ed.eval_decision_command(cfg) == 0
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "o" / "records.jsonl").read_text().splitlines())}
    fast = [r for r in records.values() if r["choice"] != NONE]
    assert fast and all(r["fast_fallback"] == "code_error" and r["costs"]["fast"]["tokens"] > 0 for r in fast)
    assert all(r["fast_first_action"] == r["choice"] for r in fast)  # the fast step did call the chosen tool
    assert all(r["search_first_action"] == NONE and r["costs"]["search"]["tokens"] > 0 for r in records.values())
    trajs = [json.loads(line) for line in (tmp_path / "o" / "trajectories_fast.jsonl").read_text().splitlines()]
    assert all(t["final_answer"] == "after the fallback" and len(t["steps"]) == 2 for t in trajs)
    assert json.loads((tmp_path / "o" / "report.json").read_text())["always_search"]["tokens_per_query"] > 0
