"""Final answers written after the search from the execution log (CodeTool's practice)."""

from __future__ import annotations

import pytest

from codetool.config import ConfigError
from codetool.eval.metrics import answer_source
from codetool.executor.result import ExecutionResult
from codetool.models.backends import ScriptedBackend
from codetool.search.answer import (
    AnswerConfig,
    answer_messages,
    execution_log,
    needs_answer,
    write_final_answer,
    write_final_answers,
)
from codetool.search.records import Candidate, Step, Trajectory


def _traj(finish="max_steps", answer=None, stdout="population: 2100000"):
    cand = Candidate(0, "", "r = city_info(name='Paris')\nprint(r)", ExecutionResult.from_dict({
        "ok": True, "stdout": stdout, "tool_calls": [
            {"name": "city_info", "arguments": {"name": "Paris"}, "status": "ok", "response": '{"pop": 2100000}'}]}),
        r_spot=1.0, chosen=True)
    return Trajectory("7", "How many people live in Paris?", "stabletoolbench", "G1", "m", steps=[Step(0, [cand], 0)],
                      final_answer=answer, finish_type=finish)


def test_an_unfinished_episode_gets_an_answer_from_its_log(canary_env):
    traj = _traj(stdout=f"population: 2100000 key={canary_env}")
    backend = ScriptedBackend(["Paris has about 2.1 million inhabitants."])
    assert write_final_answer(traj, backend)
    assert traj.final_answer == "Paris has about 2.1 million inhabitants." and traj.finish_type == "max_steps"
    assert traj.extra["answer_source"] == "generated" and answer_source(traj) == "generated"
    [prompt], kwargs = backend.calls[0]
    text = prompt[0]["content"]
    assert "How many people live in Paris?" in text and "city_info" in text and '{"pop": 2100000}' in text
    assert canary_env not in text and kwargs["temperature"] == 0.0


def test_finished_given_up_and_empty_episodes_get_no_answer():
    backend = ScriptedBackend([])  # any call would raise: none must happen
    for traj in (_traj("finish", "done"), _traj("give_up"), Trajectory("1", "q", finish_type="max_steps")):
        assert not needs_answer(traj) and not write_final_answer(traj, backend)
    assert answer_source(_traj("finish", "done")) == "finish" and answer_source(_traj("give_up")) == "none"


def test_a_failed_or_empty_generation_changes_nothing():
    traj = _traj()
    assert not write_final_answer(traj, ScriptedBackend([]))  # raises inside: logged, kept as it was
    assert not write_final_answer(traj, ScriptedBackend(["   "]))
    assert traj.final_answer is None and "answer_source" not in traj.extra


def test_config_and_long_logs():
    assert AnswerConfig().enabled("stabletoolbench") and not AnswerConfig().enabled("restbench-tmdb")
    assert AnswerConfig(final_answer="on").enabled("restbench-tmdb")
    assert not AnswerConfig(final_answer="off").enabled("stabletoolbench")
    with pytest.raises(ConfigError, match="max_log_chars"):
        AnswerConfig(max_log_chars=5)
    traj = _traj(stdout="x" * 5000)
    log = execution_log(traj, max_chars=1000)
    assert log.startswith("[") and "earlier characters left out" in log and len(log) < 1100
    assert "{log}" not in answer_messages(traj)[0]["content"]


def test_a_stabletoolbench_run_writes_the_missing_answers_in_one_batch(shared_data, tmp_path):
    from codetool.commands.run import execute_run
    from codetool.config import load_config
    from codetool.jobs.queries import RunConfig
    from codetool.jsonl import read_jsonl

    def reply(prompt):
        if "## Execution log" in prompt[-1]["content"]:
            return "The answer from the log."
        return "x = 1\nprint(x)\n```"
    policy = ScriptedBackend(reply)
    base = {"benchmark": "stabletoolbench", "group": "G1_instruction", "data_dir": str(shared_data), "limit": 3,
            "search.k": 1, "search.max_steps": 1, "search.concurrency": 3, "executor.isolation": "fallback"}
    out = execute_run(load_config(RunConfig, overrides={**base, "output": str(tmp_path / "a.jsonl")}),
                      policy=policy, show_summary=False)
    records = list(read_jsonl(out))
    assert len(records) == 3 and all(r["finish_type"] == "max_steps" for r in records)
    assert all(r["final_answer"] == "The answer from the log." and r["extra"]["answer_source"] == "generated"
               for r in records)
    # the public code's re-run of each chosen step (SCEP as it counts it): `x = 1; print(x)` ran
    assert all(r["extra"]["reference_steps"] == [{"status": 0, "res": "1"}] for r in records)
    answer_calls = [c for c in policy.calls if "## Execution log" in c[0][0][-1]["content"]]
    assert len(answer_calls) == 1 and len(answer_calls[0][0]) == 3   # one batch of three
    # off by option, and off by default outside StableToolBench
    policy.calls.clear()
    out = execute_run(load_config(RunConfig, overrides={**base, "answer.final_answer": "off",
                                                        "output": str(tmp_path / "b.jsonl")}),
                      policy=policy, show_summary=False)
    assert all(r["final_answer"] is None for r in read_jsonl(out))
    assert not any("## Execution log" in c[0][0][-1]["content"] for c in policy.calls)


def test_the_final_answer_s_generation_counts_in_wall_time_and_generation_seconds(monkeypatch):
    from codetool.search import answer

    clock = iter([100.0, 103.0])  # the generate call takes 3 s
    monkeypatch.setattr(answer.time, "perf_counter", lambda: next(clock))
    trajs = [_traj(), _traj()]
    for t in trajs:
        t.wall_time_s, t.phase_seconds = 10.0, {"generation": 4.0, "execution": 1.0}
    assert write_final_answers(trajs, ScriptedBackend(["a", "b"])) == 2
    for t in trajs:  # each waited the whole call; the call's generation time is shared
        assert t.wall_time_s == pytest.approx(13.0)
        assert t.phase_seconds == {"generation": pytest.approx(5.5), "execution": 1.0}
    failed = _traj()
    clock = iter([0.0, 2.0])
    assert not write_final_answer(failed, ScriptedBackend([]))  # a failed call took its time too
    assert failed.wall_time_s == pytest.approx(2.0) and failed.phase_seconds == {"generation": pytest.approx(2.0)}
