"""The report's one-screen summary: judge-free metrics per seed and their spread, the weak-judge
warning beside judged numbers, and the PRM's bootstrap interval (issue 16)."""

from __future__ import annotations

import pytest

from codetool.commands.eval import EvalConfig, run_eval
from codetool.eval.summary import judge_free, render_summary, seed_of, seed_summary, spread
from codetool.executor.result import ExecutionResult
from codetool.jsonl import write_jsonl
from codetool.judge.records import ScriptedJudge
from codetool.prm.evaluate import bootstrap_pairwise
from codetool.search.records import Candidate, Step, Trajectory

TOOLS = [{"name": "lookup", "tool": "t", "api": "lookup"}]


def traj(q, finish, calls, answer="Saffron Lattice", method="m"):
    """One step whose chosen candidate made ``calls`` (``(name, status)`` pairs), each returning
    ``{"value": "Saffron Lattice"}``."""
    cand = Candidate(0, "c", "result = lookup()", ExecutionResult.from_dict({"ok": True, "tool_calls": [
        {"name": n, "arguments": {}, "status": s, "response": '{"value": "Saffron Lattice"}'} for n, s in calls]}),
        chosen=True)
    return Trajectory(str(q), f"question {q}", "stabletoolbench", "G1", method, steps=[Step(0, [cand], 0)],
                      final_answer=answer, finish_type=finish, available_tools=TOOLS)


def test_spread_is_half_the_range_for_two_seeds_and_std_for_more():
    assert spread([0.4, 0.6]) == pytest.approx(0.1)
    assert spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert spread([5.0]) == 0.0
    assert seed_of("runs/x/search/m/G1_instruction.seed12.jsonl") == "12" and seed_of("G1.jsonl") == ""


def test_judge_free_counts_listed_calls_and_grounded_success():
    trajs = [traj(0, "finish", [("lookup", "ok")]),                   # grounded
             traj(1, "finish", [("invented", "ok")]),                 # finished, no listed call
             traj(2, "finish", [("lookup", "error")]),                # listed call failed
             traj(3, "max_steps", [("lookup", "ok"), ("lookup", "ok")])]
    m = judge_free(trajs)
    assert m["finish"] == 0.75 and m["grounded"] == 0.25 and m["tool_calls"] == 1.0  # (1+0+1+2)/4
    assert m["scep"] is None and m["correct_path"] is None  # no reference re-runs recorded
    # an answer that does not use the result is no grounded success; an episode the machine could
    # not run leaves every share
    lost = Trajectory("9", "q", "stabletoolbench", "G1", "m", finish_type="error", available_tools=TOOLS,
                      extra={"not_executed": {"step": 0, "candidates": 1, "attempts": 3}})
    assert judge_free([traj(0, "finish", [("lookup", "ok")], answer="an answer")])["grounded"] == 0.0
    assert judge_free(trajs + [lost]) == judge_free(trajs)
    for t in trajs:
        t.extra["reference_steps"] = [{"status": 0, "res": ""}]
    assert judge_free(trajs)["scep"] == 1.0


def ran(t: Trajectory) -> dict:
    """``t`` as a record whose chosen step ran when re-run as the public code runs it."""
    t.extra["reference_steps"] = [{"status": 0, "res": ""}]
    return t.to_dict()


def test_seed_summary_gives_mean_and_spread_per_method(tmp_path):
    write_jsonl(tmp_path / "G1.seed0.jsonl", [ran(traj(0, "finish", [("lookup", "ok")])),
                                             ran(traj(1, "give_up", []))])
    write_jsonl(tmp_path / "G1.seed1.jsonl", [ran(traj(0, "finish", [("lookup", "ok")])),
                                             ran(traj(1, "finish", [("lookup", "ok")]))])
    summary = seed_summary([str(tmp_path / "G1.seed0.jsonl"), str(tmp_path / "G1.seed1.jsonl")])
    cell = summary["methods"]["m"]["stabletoolbench"]
    assert summary["seeds"] == ["0", "1"] and cell["n"] == [2, 2]
    assert cell["finish"] == {"mean": 0.75, "spread": 0.25, "values": [0.5, 1.0]}
    assert cell["tool_calls"]["mean"] == 0.75 and cell["tool_calls"]["spread"] == 0.25  # 0.5 and 1.0 calls
    lines = "\n".join(render_summary({"summary": summary}))
    assert "Mean ± spread over 2 seeds (half the range over 2 seeds)" in lines
    assert "| m | stabletoolbench | 2 | 100.0 ± 0.0 | 0.75 ± 0.25 | 75.0 ± 25.0 | 75.0 ± 25.0 |" in lines


def test_weak_local_judge_is_flagged_beside_judged_numbers(tmp_path):
    path = tmp_path / "run.jsonl"
    write_jsonl(path, [traj(0, "finish", [("lookup", "ok")]).to_dict()])
    weak = ScriptedJudge("Solved", name="local:default", weak=True)
    run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "out"), plots=False), weak)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "SoPR % (⚠ weak judge)" in md and "embedded 135M judge" in md and "cannot tell a right answer" in md
    assert md.index("## Summary") < md.index("## Comparability")
    strong = ScriptedJudge("Solved", name="gpt", weak=False)
    run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "strong"), plots=False), strong)
    assert "weak judge" not in (tmp_path / "strong" / "report.md").read_text()


def test_bootstrap_interval_of_pairwise_accuracy_resamples_sibling_groups():
    # group a ranks its pair right, group b wrong: resamples of 2 groups give 0, 1/2 or 1
    scores, labels, groups = [0.9, 0.1, 0.2, 0.8], [1, 0, 1, 0], ["a", "a", "b", "b"]
    assert bootstrap_pairwise(scores, labels, groups, seed=0) == (0.0, 1.0)
    assert bootstrap_pairwise(scores, labels, groups, seed=3) == bootstrap_pairwise(scores, labels, groups, seed=3)
    assert bootstrap_pairwise([0.9, 0.1, 0.7, 0.3], labels, groups) == (1.0, 1.0)
    assert bootstrap_pairwise([0.9, 0.1], [1, 1], ["a", "a"]) is None  # no pair with both labels
