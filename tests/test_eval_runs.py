"""The runs an evaluation compares (``codetool.eval.runs``) and the per-benchmark sections of the
report (``stabletoolbench.evaluate``, ``restbench.evaluate``, ``preference.win_rates``)."""

from __future__ import annotations

import pytest

from codetool.config import ConfigError
from codetool.eval import restbench, stabletoolbench
from codetool.eval.preference import win_rates
from codetool.eval.runs import Run, load_runs, open_runs, pick_run, run_warnings
from codetool.jsonl import write_jsonl
from codetool.judge.records import ScriptedJudge
from tests.test_commands_eval import make_run


def test_one_method_split_over_files_is_one_run(tmp_path):
    stb, rest = tmp_path / "G1_instruction.jsonl", tmp_path / "restbench-tmdb.jsonl"
    trajs = make_run("spot", [("G1", "good")])
    write_jsonl(stb, [t.to_dict() for t in trajs if t.benchmark == "stabletoolbench"])
    write_jsonl(rest, [t.to_dict() for t in trajs if t.benchmark != "stabletoolbench"])
    again = tmp_path / "again.jsonl"
    write_jsonl(again, [t.to_dict() for t in trajs if t.benchmark == "stabletoolbench"])
    runs = load_runs([str(stb), str(rest), str(again)])
    assert [r.method for r in runs] == ["spot", "spot@again"]  # the same query twice: kept apart
    assert {t.benchmark for t in runs[0].trajectories} == {"stabletoolbench", "restbench-tmdb"}
    assert runs[0].source == f"{stb}, {rest}"


def test_open_runs_orders_the_shown_methods_and_picks_the_reference(tmp_path):
    path = tmp_path / "mixed.jsonl"
    write_jsonl(path, [t.to_dict() for m in "abc" for t in make_run(m, [("G1", "good")])])
    shown, reference = open_runs([str(path)], ["c", "a"])
    assert [r.method for r in shown] == ["c", "a"] and reference.method == "c"
    shown, reference = open_runs([str(path)], [], "b")  # no compare: every run, the named reference
    assert [r.method for r in shown] == ["a", "b", "c"] and reference.method == "b"
    assert open_runs([str(path)])[1] is None
    with pytest.raises(ConfigError, match="'zzz' names no loaded method or file; methods: a, b, c"):
        pick_run(load_runs([str(path)]), "zzz")


def test_run_warnings_count_judge_failures_and_runs_without_code():
    imported = Run("cot", "x.json", make_run("cot", [("G1", "good")]))
    for traj in imported.trajectories:
        for step in traj.steps:
            for cand in step.candidates:
                cand.code = None
    assert run_warnings([imported], parse_failures=2, judge_errors=0) == [
        "2 judge replies could not be read after retries; they count as Unsolved.",
        "cot: no code steps (an imported function-calling run): SCEP is n/a."]
    # code steps without a re-run of the chosen path: the public SCEP is n/a, and the warning says how to get it
    [scep] = run_warnings([Run("m", "m.jsonl", make_run("m", [("G1", "good")]))])
    assert scep.startswith("m: the public SCEP is n/a") and "--search.reference_steps true" in scep


def test_the_benchmark_sections_split_stabletoolbench_from_restbench():
    run = Run("m", "m.jsonl", make_run("m", [("G1", "good"), ("G1", "meh"), ("G2", None)]))
    labels = {"m": [["Solved", "Solved"], ["Unsure", "Unsolved"], ["Unsolved", "Unsolved"], ["Solved"] * 2,
                    ["Unsolved"] * 2]}
    stb = stabletoolbench.evaluate([run], labels, 2, ["stabletoolbench"])
    assert list(stb) == ["stabletoolbench"]
    g1 = stb["stabletoolbench"]["methods"]["m"]["groups"]["G1"]
    assert g1["n"] == 2 and g1["pass_rate"]["per_round"] == [0.75, 0.5] and "path" not in g1
    overall = stb["stabletoolbench"]["methods"]["m"]["overall"]
    assert overall["pass_rate"]["mean"] == pytest.approx((0.625 + 0.0) / 2)  # mean of the group rates
    assert overall["pass_rate_pooled"]["mean"] == pytest.approx((0.5 + 1 / 3) / 2)
    rest = restbench.evaluate([run], labels, 2)["restbench-tmdb"]["methods"]["m"]
    assert list(rest["groups"]) == ["all"] and rest["overall"]["pass_rate"]["mean"] == 0.5
    path = rest["overall"]["path"]
    assert path["n"] == 2 and path["correct_path_rate"] == 0.5 and path["success_basis"] == "judge"
    assert "per_query" not in rest["overall"]["path_trim"] and rest["overall"]["path_trim"]["n"] == 2
    judge_free = restbench.evaluate([run], {"m": None}, 2)["restbench-tmdb"]["methods"]["m"]["overall"]
    assert judge_free["pass_rate"] is None and judge_free["path"]["success_basis"] == "correct_path"
    assert restbench.evaluate([Run("x", "x", [])], {"x": None}, 2) == {}
    assert restbench.path_warnings("m", {"missing_gold": 1, "unmapped_calls": 0, "gold_first": 0}) == [
        "m: 1 RestBench trajectories have no gold path and are left out of the path rate (fill extra.gold_path "
        "or pass --restbench_gold)."]


def test_win_rates_skip_restbench_and_groups_the_reference_lacks():
    ours = Run("ours", "o", make_run("ours", [("G1", "good"), ("G2", "good")]))
    ref = Run("ref", "r", [t for t in make_run("ref", [("G1", "meh"), ("G2", "meh")]) if t.group != "G2"])
    out = win_rates([ours, ref], ref, ScriptedJudge(lambda r: "Solved" if "good" in r.answer else "Unsolved"), 1,
                    skip=["restbench-tmdb"])
    assert list(out) == ["ours vs ref"] and list(out["ours vs ref"]) == ["stabletoolbench"]
    entry = out["ours vs ref"]["stabletoolbench"]
    assert list(entry["groups"]) == ["G1"] and entry["groups"]["G1"]["win"] == 1.0
    assert entry["average"] == {"win": 1.0, "lose": 0.0, "tie": 0.0}
