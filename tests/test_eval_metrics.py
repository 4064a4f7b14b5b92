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
    assert m.scep is None  # the public code's SCEP needs the reference re-runs (none recorded here)
    assert m.scep_code_steps == pytest.approx(3 / 3)  # ours, chosen code steps: a0c0, a1c1, b0c1 all ran
    assert m.scep_chosen == m.scep_code_steps and m.executed_chosen == 3
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
    assert run_metrics([t]).scep is None and run_metrics([t]).scep_code_steps is None


def test_scep_counts_every_chosen_step_as_the_public_code():
    """eval_SCEP.py: status 0 over all recorded steps, a code-less chosen step is a failure (1)."""
    t = Trajectory("1", "q", steps=[Step(0, [cand(0, None, code=None)], 0), Step(1, [cand(0, True)], 0)],
                   extra={"reference_steps": [{"status": 1, "res": ""}, {"status": 0, "res": "ok"}]})
    u = Trajectory("2", "q", steps=[Step(0, [cand(0, True)], 0)], extra={"reference_steps": [{"status": 0, "res": ""}]})
    m = run_metrics([t, u, Trajectory("3", "q", steps=[Step(0, [cand(0, True)], 0)])])  # 3 has no re-runs: left out
    assert (m.scep, m.reference_steps, m.reference_successful) == (pytest.approx(2 / 3), 3, 2)
    assert m.scep_code_steps == 1.0  # ours leaves the code-less step out


def test_bootstrap_mean_over_queries():
    from codetool.eval.metrics import bootstrap_mean

    assert bootstrap_mean([]) is None
    assert bootstrap_mean([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)  # no spread, no width
    mean, low, high = bootstrap_mean([0, 0, 1, 1], samples=2000, seed=3)
    assert mean == 0.5 and 0.0 <= low < 0.5 < high <= 1.0
    assert bootstrap_mean([0, 0, 1, 1], samples=2000, seed=3) == (mean, low, high)  # seeded
    # a single query: its value, whatever the resampling
    assert bootstrap_mean([0.25]) == (0.25, 0.25, 0.25)


def test_what_the_machine_could_not_run_is_left_out_of_every_scep():
    lost = Candidate(1, "", "y = 1", ExecutionResult(ok=False, outcome="not_executed", attempts=3))
    legacy = Candidate(1, "", "y = 1", ExecutionResult(ok=False, outcome="worker_lost", error_message=(
        "WorkerLost: the state this step was forked from could not be copied (timeout); nothing ran.")))
    crashed = Candidate(1, "", "import os; os._exit(3)", ExecutionResult(ok=False, outcome="worker_lost",
                        error_message="WorkerLost: the sandbox process exited with code 3 (os._exit or a crash)."))
    t = Trajectory("1", "q", steps=[Step(0, [cand(0, True), lost], 0), Step(1, [cand(0, False), legacy], 0),
                                    Step(2, [cand(0, True), crashed], 0)],
                   extra={"reference_steps": [{"status": 0, "res": ""}, {"status": None, "res": "", "not_executed": True},
                                              {"status": 1, "res": ""}]})
    m = run_metrics([t])
    # candidates: 3 chosen (ran, failed, ran) + the crash (the code's own failure) count; lost and legacy do not
    assert m.executed_candidates == 4 and m.scep_all_candidates == pytest.approx(2 / 4)
    assert m.not_executed_candidates == 2 and m.scep_code_steps == pytest.approx(2 / 3)
    assert (m.reference_steps, m.reference_successful) == (2, 1) and m.scep == pytest.approx(1 / 2)
    chosen, rejected = candidate_rewards([t])
    assert len(chosen) == 3 and len(rejected) == 1  # only the crash among the rejected
