"""``codetool eval-decision``: the config's checks, the report files, reuse, measured routes."""

from __future__ import annotations

import json
import math

import pytest

from codetool import CodetoolError
from codetool.commands import eval_decision as ed
from codetool.commands.eval_decision import DecisionEvalConfig
from codetool.decide.stage import NONE
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.models.backends import ScriptedBackend
from codetool.search.records import Candidate, Step, Trajectory


def test_config_is_checked_early():
    from codetool.config import ConfigError
    from codetool.search.config import SearchConfig

    with pytest.raises(ConfigError, match="search.latent none"):
        DecisionEvalConfig(run_search=True, search=SearchConfig())
    with pytest.raises(ConfigError, match="thresholds"):
        DecisionEvalConfig(thresholds=[1.5])
    with pytest.raises(ConfigError, match="n_tool"):
        DecisionEvalConfig(n_tool=0, n_free=0)


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
    with pytest.raises(CodetoolError, match="same groups"):
        ed.eval_decision_command(DecisionEvalConfig(data=str(shared_data), n_tool=5, n_free=3, free_queries=str(free),
                                                    output=str(tmp_path / "x"), reuse=str(out / "records.jsonl")))


def test_measured_routes_give_the_saving_against_always_search(tmp_path, shared_data, monkeypatch):
    def traj(qid, tokens, seconds, calls, routing=None):
        cand = Candidate(0, "", "pass", ExecutionResult(ok=True, tool_calls=[ToolCall(n) for n in calls]))
        return Trajectory(qid, "q", prompt_tokens=tokens, wall_time_s=seconds, routing=routing,
                          steps=[Step(0, [cand])])

    def fake_run_routes(items, decisions, search, policy, router, **_):
        fast = {it.item_id: traj(it.item_id, d.prompt_tokens + d.scored_tokens + 50, d.seconds + 1.0,
                                 [d.tool], {"fallback": None})
                for it, d in zip(items, decisions) if d.tool}
        full = {it.item_id: traj(it.item_id, 400, 20.0, it.gold[:1] or ["x"]) for it in items}
        return fast, full

    monkeypatch.setattr("codetool.models.backends.make_backend", lambda spec, **kw: _fake_backend())
    monkeypatch.setattr(ed, "run_routes", fake_run_routes)
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
