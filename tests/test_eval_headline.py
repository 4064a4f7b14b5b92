"""The report's first screen (issue 40): did the PRM help, as paired differences over queries with
an interval, and its accuracy with its n; an imported run gets no per-step rewards plot."""

from __future__ import annotations

import json

import pytest

from codetool.commands.eval import EvalConfig, run_eval
from codetool.eval.headline import headline, verdict
from codetool.eval.runs import load_runs
from codetool.executor.result import ExecutionResult
from codetool.jsonl import write_jsonl
from codetool.judge.records import ScriptedJudge
from codetool.search.records import Candidate, Step, Trajectory

TOOLS = [{"name": "lookup", "tool": "t", "api": "lookup"}]


def traj(q: int, method: str, solved: bool, prm: bool) -> Trajectory:
    calls = [{"name": "lookup", "arguments": {}, "status": "ok" if solved else "error",
              "response": '{"title": "Dispossessed"}'}]
    cands = [Candidate(i, "c", "lookup()", ExecutionResult.from_dict({"ok": True, "tool_calls": calls}),
                       r_spot=1.0, r_latent=0.6 if prm else None, score=1.0 - i / 10, chosen=i == 0) for i in range(2)]
    return Trajectory(str(q), f"question {q}", "stabletoolbench", "G1", method, steps=[Step(0, cands, 0)],
                      final_answer="good: Dispossessed" if solved else "bad", finish_type="finish", available_tools=TOOLS,
                      extra={"fidelity": {"prm": {"interface": "ours"} if prm else None}})


@pytest.fixture
def runs(tmp_path):
    """spot+latent solves queries 0-9, spot-only 0-3, over 12 queries."""
    path = tmp_path / "G1.jsonl"
    write_jsonl(path, [traj(q, "spot+latent", q < 10, True).to_dict() for q in range(12)]
                + [traj(q, "spot-only", q < 4, False).to_dict() for q in range(12)])
    return path


def test_the_prm_method_is_compared_with_the_others_query_by_query(runs):
    data = headline(load_runs([str(runs)]), {}, [str(runs)])
    assert data["prm_methods"] == ["spot+latent"]
    [c] = data["comparisons"]
    assert (c["a"], c["b"], c["metric"], c["kind"], c["n"]) == ("spot+latent", "spot-only", "grounded success",
                                                                 "judge-free", 12)
    assert c["mean"] == pytest.approx(50.0)  # 6 of 12 queries gain a grounded success, none loses one
    assert 0 < c["low"] <= 50.0 <= c["high"] and verdict(c) == "better"


def test_the_report_opens_with_the_answer(runs, tmp_path):
    metrics = tmp_path / "prm_eval" / "metrics.json"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps({"prm": "checkpoints/prm/given", "pairwise_accuracy": 0.75, "pairs": 12,
                                   "pairwise_accuracy_ci95": [0.5, 1.0], "rows": 24}))
    judge = ScriptedJudge(lambda r: "Solved" if "good" in r.answer else "Unsolved")
    report = run_eval(EvalConfig(trajectories=[str(runs)], out=str(tmp_path / "out"), prm_metrics=str(metrics)), judge)
    md = (tmp_path / "out" / "report.md").read_text()
    first = md.split("## Summary")[0]
    assert "## Did the PRM help?" in first
    assert "| stabletoolbench | spot+latent − spot-only | grounded success | +50.0 |" in first
    assert "| stabletoolbench | spot+latent − spot-only | pass (SoPR) | +50.0 |" in first
    assert "PRM `checkpoints/prm/given`: pairwise accuracy **75%** (95% interval 50-100) on **12** held-out" in first
    assert [c["kind"] for c in report["headline"]["comparisons"]] == ["judge-free", "judged"]
    assert "step_rewards" not in first  # the plot is in the Plots section, with its caption


def test_the_prm_line_gives_no_interval_over_one_query_and_names_the_both_ran_pairs():
    from codetool.eval.headline import prm_line

    # the quickstart's held-out split is one query: a bootstrap over it printed "95% interval 86-86"
    one = {"prm": "runs/quickstart/train/prm", "pairwise_accuracy": 6 / 7, "pairs": 7, "pairwise_accuracy_ci95": [6 / 7, 6 / 7],
           "decided": {"all": {"accuracy": 6 / 7, "pairs": 7, "queries": 1},
                       "both_ran": {"accuracy": 0.0, "pairs": 1, "queries": 1}}}
    line = prm_line({"prm": one})
    assert "86%** (no interval: the pairs come from 1 held-out query) on **7**" in line and "86-86" not in line
    assert "on the 1 whose steps both ran (R_spot ties, the PRM's own job): **0%**" in line
    # a paired difference over one query is no verdict (red team: "+100.0 to +100.0", "better")
    assert verdict({"n": 1, "low": 100.0, "high": 100.0}) == "too few queries to tell"
    assert verdict({"n": 2, "low": 50.0, "high": 100.0}) == "better"
    two = {**one, "decided": {"all": {**one["decided"]["all"], "queries": 2}, "both_ran": {"pairs": 0}}}
    line = prm_line({"prm": two})
    assert "(95% interval 86-86)" in line and "no held-out pair whose steps both ran" in line


def test_an_imported_run_gets_no_step_rewards_plot(shared_data, tmp_path):
    folder = shared_data / "StableToolBench" / "data_example" / "model_predictions_converted"
    report = run_eval(EvalConfig(trajectories=[str(folder / "virtual_chatgpt_cot")], out=str(tmp_path)),
                      ScriptedJudge("Solved"))
    names = [p.rsplit("/", 1)[-1] for p in report["files"]["plots"]]
    assert "step_rewards.png" not in names and "steps.png" in names
    assert not (tmp_path / "step_rewards.png").exists()


def test_the_console_summary_fits_80_columns_without_cutting_headers(runs, tmp_path):
    """Before: one row per method with 10 columns; at 80 columns rich cut every header."""
    from rich.console import Console

    from codetool.commands.eval import summary_tables

    report = run_eval(EvalConfig(trajectories=[str(runs)], out=str(tmp_path / "o"), plots=False), None)
    console = Console(width=80, record=True)
    for table in summary_tables(report):
        console.print(table)
    text = console.export_text()
    assert "…" not in text and "spot+latent" in text and "SCEP %" in text
    assert max(map(len, text.splitlines())) <= 80


def test_a_judge_free_block_lists_only_what_applies(runs, tmp_path):
    """Before: a judge-free run listed every judge setting as a deviation, and a PRM that recorded
    no label rule showed 'trees.label_rule is []'."""
    from codetool.eval.comparability import check_settings

    report = run_eval(EvalConfig(trajectories=[str(runs)], out=str(tmp_path / "o"), plots=False), None)
    block = report["comparability"]
    assert not [d for d in block["deviations"] if d.startswith("judge.")] and block["not_applicable"]
    assert block["deviations"][0].startswith("no judge")
    lines, _ = check_settings({"trees.label_rule": [], "__source__": "x"}, "codetool", run_known=False)
    assert not any("is []" in line for line in lines) and any("trees.label_rule" in line and "not recorded" in line
                                                               for line in lines)


def test_your_own_queries_are_not_called_restbench(tmp_path):
    """Before: a run on your own API was listed as '3 of the 100 RestBench-TMDB queries'."""
    path = tmp_path / "own.jsonl"
    rows = [traj(q, "m", True, False) for q in range(3)]
    for t in rows:
        t.benchmark, t.group = "custom", "questions"
    write_jsonl(path, [t.to_dict() for t in rows])
    report = run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "o"), plots=False), None)
    notes = report["comparability"]["deviations"]
    assert not any("RestBench" in d for d in notes)
    assert "custom: your own queries (3); no published number to compare them with." in notes
