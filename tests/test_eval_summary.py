"""The report's one-screen summary: judge-free metrics per seed and their spread, the weak-judge
warning beside judged numbers, and the PRM's bootstrap interval (issue 16)."""

from __future__ import annotations

import pytest

from codetool.commands.eval import EvalConfig, run_eval
from codetool.eval.summary import judge_free, render_summary, seed_of, seed_summary, spread
from codetool.executor.result import ExecutionResult
from codetool.jsonl import write_jsonl
from codetool.judge.records import ScriptedJudge
from codetool.prm.evaluate import Pair, pair_interval
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


def test_bootstrap_interval_of_pairwise_accuracy_resamples_queries():
    # query a ranks its pair right, query b wrong: resamples of 2 queries give 0, 1/2 or 1
    pairs = [Pair(0, 1, "a", "both_ran"), Pair(2, 3, "b", "both_ran")]
    scores = [0.9, 0.1, 0.2, 0.8]
    assert pair_interval(scores, pairs, seed=0) == (0.0, 1.0)
    assert pair_interval(scores, pairs, seed=3) == pair_interval(scores, pairs, seed=3)
    assert pair_interval([0.9, 0.1, 0.7, 0.3], pairs) == (1.0, 1.0)
    assert pair_interval([0.9, 0.1], []) is None  # no labelled pair


def test_the_prm_section_splits_the_pairs_by_what_decided_them():
    from codetool.eval.summary import prm_lines

    prm = {"rows": 8, "bootstrap_samples": 1000, "bootstrap_seed": 0, "ece": 0.1, "auc": 0.7,
           "decided": {"all": {"accuracy": 0.75, "pairs": 4, "queries": 2, "ci95": [0.5, 1.0]},
                       "executability": {"accuracy": 1.0, "pairs": 2, "queries": 1, "ci95": [1.0, 1.0]},
                       "both_ran": {"accuracy": 0.5, "pairs": 2, "queries": 2, "ci95": [0.0, 1.0]}},
           "best_of_k": {"groups": 2, "informative": 2, "prm": 0.775, "random": 0.7375, "oracle": 0.925,
                         "prm_best": 0.5}}
    text = "\n".join(prm_lines(prm))
    assert "| both steps ran | 2 | 2 | 50.0% | 0.0-100.0 |" in text
    assert "| decided by executability | 2 | 1 | 100.0% | n/a (one query) |" in text  # no "100.0-100.0"
    assert "random pick 0.738" in text and "the best 0.925" in text
    old = "\n".join(prm_lines({"pairwise_accuracy": 0.83, "pairs": 12, "rows": 10}))
    assert "positive x negative row combinations" in old  # an older metrics.json is labelled for what it is


def test_the_report_gives_paired_differences_between_methods_over_queries(tmp_path):
    from types import SimpleNamespace

    from codetool.eval.summary import paired_lines, paired_section

    ok, none = [("lookup", "ok")], []
    # CodeTool (spot+latent) grounds queries 0-3 in both seeds; spot-only grounds 0-1 in seed 0, 0 in seed 1
    for seed, spot in ((0, (0, 1)), (1, (0,))):
        write_jsonl(tmp_path / f"spot+latent.seed{seed}.jsonl",
                    [ran(traj(q, "finish", ok, method="spot+latent")) for q in range(4)])
        write_jsonl(tmp_path / f"spot-only.seed{seed}.jsonl",
                    [ran(traj(q, "finish", ok if q in spot else none, method="spot-only")) for q in range(4)])
    paths = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    runs = [SimpleNamespace(method=m, trajectories=[traj(q, "finish", ok, method=m) for q in range(4)])
            for m in ("spot-only", "spot+latent")]
    labels = {"spot-only": [["Solved"], ["Unsure"], ["Unsolved"], ["Unsolved"]], "spot+latent": [["Solved"]] * 4}
    paired = paired_section(paths, ["spot-only", "spot+latent"], labels, runs, samples=500)
    assert paired["baseline"] == "spot+latent"
    [g] = paired["grounded"]["stabletoolbench"]
    # per query, spot-only minus CodeTool over the seed means: 1-1, 0.5-1, 0-1, 0-1 -> mean -0.625
    assert (g["a"], g["b"], g["n"]) == ("spot-only", "spot+latent", 4) and g["mean"] == pytest.approx(-0.625)
    assert g["low"] <= g["mean"] <= g["high"] < 0
    [p] = paired["pass"]["stabletoolbench"]
    assert p["mean"] == pytest.approx((0 - 0.5 - 1 - 1) / 4)
    text = "\n".join(paired_lines(paired))
    assert "| grounded | stabletoolbench | spot-only | 4 | -62.5 |" in text


def test_paired_grounded_success_is_the_reports_rule_and_skips_what_never_ran(tmp_path):
    """The paired section scores with the rule of every other success number: an answer that does
    not use the tool's result is no success, and an episode the machine could not run is left out."""
    from codetool.eval.summary import paired_section

    ok = [("lookup", "ok")]
    invented = [ran(traj(q, "finish", ok, answer="Kestrel Ember, 42 units", method="spot-only")) for q in range(3)]
    lost = Trajectory("3", "question 3", "stabletoolbench", "G1", "spot-only", finish_type="error",
                      available_tools=TOOLS, extra={"not_executed": {"step": 0, "candidates": 1, "attempts": 3}})
    write_jsonl(tmp_path / "spot-only.seed0.jsonl", invented + [lost.to_dict()])
    write_jsonl(tmp_path / "spot+latent.seed0.jsonl",
                [ran(traj(q, "finish", ok, method="spot+latent")) for q in range(4)])
    paths = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    [g] = paired_section(paths, ["spot-only", "spot+latent"])["grounded"]["stabletoolbench"]
    assert g["n"] == 3 and g["mean"] == pytest.approx(-1.0)  # 0 - 1 on queries 0-2; query 3 not counted
