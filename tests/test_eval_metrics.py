"""Judge-free run metrics on hand-made trajectories (SCEP, means, counts, chosen vs rejected)."""

from __future__ import annotations

import pytest

from codetool.eval.metrics import candidate_rewards, run_metrics
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.search.records import Candidate, Step, Trajectory


def cand(i, ok, code="x = 1", score=0.0, latent=None, calls=0):
    return Candidate(i, code or "", code, ExecutionResult(ok=ok, tool_calls=[ToolCall("f") for _ in range(calls)]),
                     score=score, r_latent=latent)


def test_run_metrics_by_hand():
    a = Trajectory("1", "q", steps=[
        Step(0, [cand(0, True, score=1.4, latent=0.4, calls=2), cand(1, False, score=0.2, latent=0.2)], 0),
        Step(1, [cand(0, False, score=0.1), cand(1, True, score=1.9, latent=0.9, calls=1)], 1),
    ], final_answer="a", finish_type="finish", prompt_tokens=100, completion_tokens=20, wall_time_s=3.0,
        tool_cost=2.5, phase_seconds={"generation": 2.0, "execution": 1.0})
    b = Trajectory("2", "q", steps=[
        Step(0, [cand(0, None, code=None), cand(1, True)], 1),  # a candidate without code is not executed
    ], finish_type="max_steps", prompt_tokens=50, completion_tokens=10, wall_time_s=1.0, tool_cost=0.5,
        phase_seconds={"generation": 1.0})
    m = run_metrics([a, b])
    assert m.n == 2 and m.executed_candidates == 5
    assert m.scep == pytest.approx(3 / 3)          # the paper's SCEP, chosen steps: a0c0, a1c1, b0c1 all ran
    assert m.scep_chosen == m.scep and m.executed_chosen == 3
    assert m.scep_all_candidates == pytest.approx(3 / 5)   # every candidate with code: ran a0c0, a1c1, b0c1
    assert m.answer_sources == {"finish": 1, "none": 1}
    assert m.mean_steps == 1.5 and m.mean_tool_calls == 1.5
    assert (m.mean_prompt_tokens, m.mean_completion_tokens, m.mean_seconds, m.mean_tool_cost) == (75, 15, 2.0, 1.5)
    assert m.finish_types == {"finish": 1, "give_up": 0, "max_steps": 1, "error": 0}
    assert m.phase_seconds == {"generation": 1.5, "execution": 1.0}
    chosen, rejected = candidate_rewards([a, b])
    assert chosen == [1.4, 1.9, 0.0] and rejected == [0.2, 0.1, 0.0]
    assert candidate_rewards([a], key="r_latent") == ([0.4, 0.9], [0.2])


def test_empty_and_codeless_runs():
    m = run_metrics([])
    assert m.n == 0 and m.scep is None and m.mean_steps == 0.0
    t = Trajectory("1", "q", steps=[Step(0, [cand(0, None, code=None)], 0)])
    assert run_metrics([t]).scep is None
