"""Trajectory records: typed results in memory, the same JSON on disk (issue 18)."""

import json

import pytest

from codetool.executor.result import HOST_ERROR, NO_CODE, OUTCOMES, ExecutionResult, ToolCall
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.expand import Node, expand
from codetool.search.records import Candidate, ImportedCall, ImportedResult, Step, Trajectory

# A candidate as a trajectory file holds it (every key ExecutionResult.to_dict writes, in its order).
CANDIDATE = {
    "index": 1, "text": "```python\nr = f(x=1)\nprint(r)\n```", "code": "r = f(x=1)\nprint(r)",
    "result": {"ok": True, "stdout": "7\n", "error_type": None, "error_message": None, "outcome": "ok",
               "output_truncated": False, "state_lost": False,
               "tool_calls": [{"name": "f", "arguments": {"x": 1}, "status": "ok", "latency_s": 0.25, "error": None,
                               "response": "7", "arguments_sha256": "ab"}],
               "final_answer": None, "give_up_reason": None, "duration_s": 0.5, "isolation": "rlimits",
               "attempts": 1, "timed_out": False},
    "r_spot": 1.0, "r_latent": 0.75, "cost": 0.5, "score": 1.25, "chosen": True, "prompt_tokens": 12,
    "completion_tokens": 9,
}


def test_candidate_json_round_trip_keeps_the_format_and_types_the_result():
    cand = Candidate.from_dict(CANDIDATE)
    assert isinstance(cand.result, ExecutionResult) and isinstance(cand.result.tool_calls[0], ToolCall)
    assert cand.result.tool_calls[0].latency_s == 0.25 and cand.result.stdout == "7\n"
    assert json.dumps(cand.to_dict()) == json.dumps(CANDIDATE)  # same keys, same order, same values


def test_unexecuted_candidate_is_none_in_memory_and_empty_on_disk():
    cand = Candidate.from_dict({**CANDIDATE, "result": {}})
    assert cand.result is None and cand.to_dict()["result"] == {}
    with pytest.raises(TypeError, match="from_dict"):
        Candidate(0, "t", None, {"ok": True})


def test_host_fault_is_a_defined_outcome_and_keeps_its_key_on_disk():
    from codetool.executor.result import host_error_result

    result = host_error_result("OSError: fork failed", "OSError")
    assert HOST_ERROR in OUTCOMES and result.outcome == HOST_ERROR and result.host_error == "OSError: fork failed"
    data = result.to_dict()
    assert data["host_error"] == "OSError: fork failed" and ExecutionResult.from_dict(data) == result
    assert ExecutionResult(ok=False, outcome="runtime_error").host_error is None
    assert "host_error" not in ExecutionResult(ok=True).to_dict()
    with pytest.raises(ValueError, match="outcome"):
        ExecutionResult(ok=False, outcome="crashed")


def test_imported_step_round_trips_verbatim():
    data = {"ok": None, "tool_calls": [{"name": "f", "arguments_text": "{bad", "arguments": None, "status": "unknown",
                                        "stb_message": "{'name': 'f'"}], "stb_assistant": False}
    cand = Candidate.from_dict({"index": 0, "text": "", "code": None, "result": data})
    assert isinstance(cand.result, ImportedResult) and not cand.result.assistant
    call = cand.result.tool_calls[0]
    assert isinstance(call, ImportedCall) and (call.name, call.status, call.arguments_text) == ("f", "unknown", "{bad")
    assert cand.to_dict()["result"] == data


def test_trajectory_round_trip_is_equal():
    traj = Trajectory("3", "q", steps=[Step(0, [Candidate.from_dict(CANDIDATE),
                                                Candidate.from_dict({**CANDIDATE, "index": 0, "result": {}})],
                                            chosen=0, observation="7")], finish_type="max_steps")
    data = json.loads(json.dumps(traj.to_dict()))
    back = Trajectory.from_dict(data)
    assert back == traj and back.to_dict() == data
    assert [c.name for c in back.executed_calls()] == ["f"]


class _Env:
    apis: list = []

    def render(self):
        return "def f(): ..."

    def api_for(self, name):
        return None


class _State:
    """An executor stand-in: ``run`` returns a typed result; ``fork`` raises when told to."""

    def __init__(self, broken=False):
        self.broken = broken

    def fork(self):
        if self.broken:
            raise OSError("no more processes")
        return self

    def run(self, code):
        return ExecutionResult(ok=True, stdout="1\n", tool_calls=[ToolCall("f")])

    def close(self):
        pass


def test_expand_leaves_a_typed_result_on_every_candidate():
    task = type("T", (), {"query": "q", "env": _Env()})()
    replies = iter(["```python\nprint(1)\n```", "No code today.", "```python\nprint(2)\n```"])
    policy = ScriptedBackend(lambda prompt: next(replies))
    cfg = SearchConfig(step_format="step_text", latent="none")
    [row] = expand(policy, [Node(_State(), [], task)], 2, cfg)
    ran, no_code = (e.candidate for e in row)
    assert isinstance(ran.result, ExecutionResult) and ran.result.tool_calls == [ToolCall("f")] and ran.r_spot == 1.0
    assert isinstance(no_code.result, ExecutionResult) and no_code.result.outcome == NO_CODE and no_code.r_spot == 0.0
    [[faulted]] = expand(policy, [Node(_State(broken=True), [], task)], 1, cfg)
    assert faulted.state is None and faulted.candidate.result.outcome == HOST_ERROR
    assert faulted.candidate.result.host_error == "OSError: no more processes"


def test_a_record_written_before_attempts_existed_reads_as_one_attempt():
    old = {k: v for k, v in CANDIDATE["result"].items() if k != "attempts"}
    result = ExecutionResult.from_dict(old)
    assert result.attempts == 1 and result.executed
    lost = ExecutionResult.from_dict({**old, "ok": False, "outcome": "not_executed", "attempts": 3})
    assert not lost.executed and lost.to_dict()["attempts"] == 3
