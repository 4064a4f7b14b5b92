"""``codetool eval`` end to end on hand-made runs: report files, tables, plots, comparison, secrets."""

from __future__ import annotations

import json

import pytest

from codetool.commands.eval import EvalConfig, run_eval
from codetool.config import ConfigError
from codetool.eval.runs import load_runs
from codetool.executor.result import ExecutionResult
from codetool.jsonl import read_jsonl, write_jsonl
from codetool.judge.config import JudgeConfig
from codetool.judge.records import ScriptedJudge
from codetool.search.records import Candidate, Step, Trajectory

TMDB = [{"name": "search_movie", "tool": "tmdb", "api": "search", "method": "GET", "path": "/search/movie"},
        {"name": "movie_credits", "tool": "tmdb", "api": "credits", "method": "GET", "path": "/movie/{movie_id}/credits"}]


def _step(i, calls, ok=True, k=2, score=1.0):
    cands = [Candidate(0, "c", f"step_{i}()", ExecutionResult.from_dict({"ok": ok, "stdout": "out", "tool_calls": [
        {"name": n, "arguments": {}, "status": "ok", "response": "{}"} for n in calls]}), r_spot=float(ok),
        r_latent=0.7, score=score, chosen=True)]
    cands += [Candidate(j, "c", "broken(", ExecutionResult(ok=False), score=score - 0.8) for j in range(1, k)]
    return Step(i, cands, 0)


def make_run(method, answers, secret=""):
    trajs = []
    for q, (group, answer) in enumerate(answers):
        finish = "finish" if answer else "max_steps"
        trajs.append(Trajectory(str(q), f"question {q}", "stabletoolbench", group, method,
                                steps=[_step(0, ["search_movie"]), _step(1, [])], final_answer=answer,
                                finish_type=finish, prompt_tokens=300, completion_tokens=40, wall_time_s=2.0,
                                tool_cost=1.5, phase_seconds={"generation": 1.5, "execution": 0.5},
                                extra={"note": secret} if secret else {}))
    gold = ["GET /search/movie ", "GET /movie/{id}/credits"]
    for q, calls in enumerate([["search_movie", "movie_credits"], ["movie_credits"]]):
        trajs.append(Trajectory(f"t{q}", f"who directed film {q}?", "restbench-tmdb", None, method,
                                steps=[_step(0, calls)], final_answer=f"director {q}", finish_type="finish",
                                available_tools=TMDB, extra={"gold_path": gold}))
    return trajs


def label(req):
    return "Solved" if "good" in req.answer else ("Unsure" if req.trajectory is None else "Unsolved")


def test_report_end_to_end(tmp_path, canary_env):
    base = tmp_path / "base.jsonl"
    ours = tmp_path / "ours.jsonl"
    write_jsonl(base, [t.to_dict() for t in make_run("greedy", [("G1", "good"), ("G1", "meh"), ("G2", None)])])
    write_jsonl(ours, [t.to_dict() for t in make_run("spot+latent", [("G1", "good"), ("G1", "good"), ("G2", "good")],
                                                     secret=canary_env)])
    judge = ScriptedJudge(label, winner="b", name="scripted-test")
    cfg = EvalConfig(trajectories=[str(ours)], compare=[str(base)], out=str(tmp_path / "out"),
                     judge=JudgeConfig(rounds=2), export_stabletoolbench=str(tmp_path / "stb"))
    report = run_eval(cfg, judge)
    out = tmp_path / "out"
    assert report["methods"] == ["greedy", "spot+latent"] and report["reference"] == "greedy"
    stb = report["benchmarks"]["stabletoolbench"]["methods"]
    # greedy: G1 = (1 + 0) / 2 = 0.5, G2 = 0 (no finish) -> average 0.25
    assert stb["greedy"]["groups"]["G1"]["pass_rate"]["mean"] == 0.5
    assert stb["greedy"]["overall"]["pass_rate"]["mean"] == 0.25
    assert stb["spot+latent"]["overall"]["pass_rate"]["mean"] == 1.0
    assert stb["greedy"]["overall"]["metrics"]["scep_code_steps"] == 1.0   # chosen steps all ran
    assert stb["greedy"]["overall"]["metrics"]["scep"] is None  # the public count needs reference re-runs
    assert stb["greedy"]["overall"]["metrics"]["scep_all_candidates"] == pytest.approx(1 / 2)
    rest = report["benchmarks"]["restbench-tmdb"]["methods"]["greedy"]["overall"]
    assert rest["path"]["correct_path_rate"] == 0.5 and rest["pass_rate"]["mean"] == 0.0  # "director" is Unsolved
    assert rest["path"]["success_basis"] == "judge" and rest["path"]["delta_solution_len"] is None
    win = report["win_rates"]["spot+latent vs greedy"]
    # G1: q0 both solved -> judge says "b" ... swapped on odd rounds; q1 only ours solved; G2 ours solved
    assert win["stabletoolbench"]["groups"]["G2"]["win"] == 1.0 and "restbench-tmdb" not in win
    assert win["stabletoolbench"]["groups"]["G1"]["n"] == 2
    for name in ("report.json", "report.md", "verdicts.jsonl", "bars_stabletoolbench.png",
                 "bars_restbench-tmdb.png", "steps.png", "rewards.png"):
        assert (out / name).is_file(), name
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in ("steps.png", "rewards.png"))
    md = (out / "report.md").read_text()
    assert "scripted-test" in md and "## stabletoolbench" in md and "### Side by side" in md
    assert "| G1 | 2 | 50.0 ± 0.0 |" in md and "## Win rates (SoWR)" in md and "correct path % (0/1)" in md
    assert "path score % (frac.)" in md and "SCEP all cand. %" in md
    # the comparability block: judge, protocol, rounds, subset, answer sources, reference, deviations
    block = report["comparability"]
    assert (block["protocol"], block["rounds"], block["judge_model"]) == ("stabletoolbench", 2, "scripted-test")
    assert block["sowr_reference"]["method"] == "greedy" and not block["sowr_reference"]["field_reference"]
    assert block["answer_sources"]["greedy"] == {"finish": 4, "none": 1}
    assert block["subset"]["stabletoolbench"]["groups"] == {"G1": 2, "G2": 1}
    devs = " ".join(block["deviations"])
    assert block["target"] == "stabletoolbench" and "not gpt-4-turbo-preview" in devs
    assert "judge.rounds is 2, not 3" in devs and "our judge prompts" in devs
    assert "run settings not recorded" in devs and "trees.label_rule" in devs  # no recipe, no pipeline
    assert "not ChatGPT CoT" in devs and "RestGPT's correct path rate" in devs and "not a full group" in devs
    assert "## Comparability" in md and "Deviations from StableToolBench's own procedure in this run" in md
    split = stb["greedy"]["overall"]["pass_rate_by_answer_source"]
    assert split["finish"]["mean"] == 0.5 and split["none"]["mean"] == 0.0
    for path in [*out.iterdir(), *(tmp_path / "stb").rglob("*.json")]:
        assert canary_env not in path.read_text(errors="replace"), path
    assert (tmp_path / "stb" / "spot+latent" / "G1.json").is_file()
    assert not (tmp_path / "stb" / "greedy" / "all.json").exists()  # RestBench is not exported


def test_judge_free_report_and_weak_flag(tmp_path):
    path = tmp_path / "run.jsonl"
    write_jsonl(path, [t.to_dict() for t in make_run("m", [("G1", "good")])])
    report = run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "a"), plots=False), None)
    md = (tmp_path / "a" / "report.md").read_text()
    assert report["judge"]["name"] == "none" and "n/a" in md and not (tmp_path / "a" / "steps.png").exists()
    assert report["benchmarks"]["restbench-tmdb"]["methods"]["m"]["overall"]["path"]["success_basis"] == "correct_path"
    weak = ScriptedJudge("Solved", name="local:default", weak=True)
    run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "b"), plots=False), weak)
    assert "Warning: weak judge" in (tmp_path / "b" / "report.md").read_text()


def test_compare_by_method_name_and_errors(tmp_path):
    path = tmp_path / "mixed.jsonl"
    trajs = make_run("a", [("G1", "good")]) + make_run("b", [("G1", "meh")]) + make_run("c", [("G1", "good")])
    write_jsonl(path, [t.to_dict() for t in trajs])
    runs = load_runs([str(path)])
    assert [r.method for r in runs] == ["a", "b", "c"]
    report = run_eval(EvalConfig(trajectories=[str(path)], compare=["c", "a"], out=str(tmp_path / "o"),
                                 plots=False), ScriptedJudge(label, winner="tie"))
    assert report["methods"] == ["c", "a"] and list(report["win_rates"]) == ["a vs c"]
    with pytest.raises(ConfigError, match="names no loaded method"):
        run_eval(EvalConfig(trajectories=[str(path)], compare=["zzz"], out=str(tmp_path / "o")), None)
    with pytest.raises(ConfigError, match="no trajectory files"):
        EvalConfig()


def test_stabletoolbench_results_are_scored_too(shared_data, tmp_path):
    folder = shared_data / "StableToolBench" / "data_example" / "model_predictions_converted"
    report = run_eval(EvalConfig(trajectories=[str(folder / "virtual_chatgpt_cot"), str(folder / "virtual_chatgpt_dfs")],
                                 out=str(tmp_path), judge=JudgeConfig(rounds=3), plots=False),
                      ScriptedJudge("Solved"))
    methods = report["benchmarks"]["stabletoolbench"]["methods"]
    assert methods["virtual_chatgpt_cot"]["overall"]["pass_rate"]["mean"] == pytest.approx(2 / 3)
    assert any("SCEP is n/a" in w for w in report["warnings"])


def test_cli_runs_eval(tmp_path, capsys):
    from codetool.cli import main

    path = tmp_path / "run.jsonl"
    write_jsonl(path, [t.to_dict() for t in make_run("m", [("G1", "good")])])
    other = tmp_path / "other.jsonl"
    write_jsonl(other, [t.to_dict() for t in make_run("n", [("G1", "meh")])])
    status = main(["eval", "--judge.model", "none", "--out", str(tmp_path / "o"), "--compare", str(path), str(other)])
    assert status == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["methods"] == ["m", "n"] and (tmp_path / "o" / "bars_stabletoolbench.png").is_file()


def test_scep_counts_chosen_steps_only(tmp_path):
    # step 0: the chosen candidate fails, the unchosen one runs; step 1: chosen runs, unchosen fails
    def cand(i, ok, chosen):
        return Candidate(i, "c", f"x = {i}", ExecutionResult(ok=ok), r_spot=float(ok), chosen=chosen)
    traj = Trajectory("1", "q", "stabletoolbench", "G1", "m", steps=[
        Step(0, [cand(0, False, True), cand(1, True, False)], 0),
        Step(1, [cand(0, True, True), cand(1, False, False), cand(2, False, False)], 0)],
        final_answer="a", finish_type="finish")
    traj.extra["reference_steps"] = [{"status": 1, "res": ""}, {"status": 0, "res": ""}]  # the public re-runs
    path = tmp_path / "run.jsonl"
    write_jsonl(path, [traj.to_dict()])
    report = run_eval(EvalConfig(trajectories=[str(path)], out=str(tmp_path / "o"), plots=False), None)
    metrics = report["benchmarks"]["stabletoolbench"]["methods"]["m"]["overall"]["metrics"]
    assert metrics["scep"] == 0.5 and metrics["scep_code_steps"] == 0.5  # chosen: failed, ran
    assert metrics["scep_all_candidates"] == 0.4    # all five: 2 ran
    assert "| **overall** | 1 | n/a | 50.0 | 40.0 |" in (tmp_path / "o" / "report.md").read_text()


def test_chatgpt_cot_converted_answers_as_the_sowr_reference(shared_data, tmp_path):
    cot = (shared_data / "StableToolBench" / "toolbench" / "tooleval" / "results" / "default_evalset"
           / "gpt-3.5-turbo_CoT")
    ref = load_runs([str(cot / "G1_instruction.json")])[0]
    ours = []
    for t in ref.trajectories[:3]:  # our run on three of the same queries, solved by a finish call
        ours.append(Trajectory(t.query_id, t.query, "stabletoolbench", "G1_instruction", "ours", steps=[_step(0, [])],
                               final_answer=f"our answer {t.query_id}", finish_type="finish"))
    path = tmp_path / "ours.jsonl"
    write_jsonl(path, [t.to_dict() for t in ours])
    judge = ScriptedJudge(lambda req: "Solved" if "our answer" in req.answer else "Unsolved", winner="a")
    report = run_eval(EvalConfig(trajectories=[str(path)], reference=str(cot / "G1_instruction.json"),
                                 out=str(tmp_path / "o"), plots=False, judge=JudgeConfig(rounds=3)), judge)
    pair = report["win_rates"][f"ours vs {ref.method}"]["stabletoolbench"]["groups"]["G1_instruction"]
    assert pair["n"] == 3 and pair["win"] == 1.0 and pair["tie"] == 0.0 and pair["judged_pairs"] == 0
    assert report["comparability"]["sowr_reference"]["field_reference"]
    assert not any("not ChatGPT CoT" in d for d in report["comparability"]["deviations"])
    # only the reference's queries that our run has are judged
    ref_rows = [r for r in read_jsonl(tmp_path / "o" / "verdicts.jsonl") if r["method"] == ref.method]
    assert len(ref_rows) == 3


def test_a_judge_request_that_fails_after_its_retries_is_that_querys_error_record(tmp_path, monkeypatch):
    """One answer's judge request fails for good (the server's 5xx after the backend's retries): its
    verdicts are error records, every other query is judged, the report is written, eval exits 1; a
    rerun asks only the failed requests (issue 28). Before, the exception ended ``eval``."""
    from codetool import CodetoolError
    from codetool.commands import eval as report_mod
    from codetool.judge.llm import LLMJudge

    class Backend:
        name = "flaky"

        def __init__(self, broken: str):
            self.broken, self.prompts = broken, []

        def generate(self, prompts, n=1, **_):
            texts = [p[-1]["content"] for p in prompts]
            self.prompts += texts
            if any(self.broken and self.broken in t for t in texts):
                raise CodetoolError("http://judge/v1/chat/completions: HTTP 503 after 4 attempts")
            return [[type("C", (), {"text": '{"answer_status": "Solved", "reason": "ok"}'})()] for _ in texts]

    runs = tmp_path / "ours.jsonl"
    write_jsonl(runs, [t.to_dict() for t in make_run("spot+latent", [("G1", "fine"), ("G1", "doomed"), ("G1", "ok")])])
    cache = tmp_path / "out" / "judge_cache.jsonl"
    backend = Backend("doomed")
    judge = LLMJudge(backend, name="flaky", cache_path=str(cache), temperature=0.0, batch_size=8)
    monkeypatch.setattr(report_mod, "make_judge", lambda cfg, cache_path=None: judge)
    cfg = EvalConfig(trajectories=[str(runs)], out=str(tmp_path / "out"), judge=JudgeConfig(rounds=2, mode="json"),
                     plots=False)
    assert report_mod.eval_command(cfg) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["judge_errors"] == 2  # one query, two rounds
    assert any("2 judge requests failed" in w for w in report["warnings"])
    rows = {(r["benchmark"], r["query_id"]): r for r in read_jsonl(tmp_path / "out" / "verdicts.jsonl")}
    doomed = rows[("stabletoolbench", "1")]
    assert doomed["labels"] == ["Unsolved", "Unsolved"] and all("HTTP 503" in e for e in doomed["errors"])
    assert rows[("stabletoolbench", "0")]["labels"] == ["Solved", "Solved"] and "errors" not in rows[("stabletoolbench", "0")]
    pass_rate = report["benchmarks"]["stabletoolbench"]["methods"]["spot+latent"]["groups"]["G1"]["pass_rate"]
    assert pass_rate["mean"] == pytest.approx(2 / 3)
    # the rerun (the server is back) asks only the two failed requests; the rest come from the cache
    backend2 = Backend("")
    judge2 = LLMJudge(backend2, name="flaky", cache_path=str(cache), temperature=0.0, batch_size=8)
    monkeypatch.setattr(report_mod, "make_judge", lambda cfg, cache_path=None: judge2)
    assert report_mod.eval_command(cfg) == 0
    assert len(backend2.prompts) == 2 and all("doomed" in p for p in backend2.prompts)


@pytest.mark.parametrize(("blank_finish", "protocol", "mean"), [("unsolved", "stabletoolbench", 0.5),
                                                                 ("judge", "stabletoolbench", 1.0),
                                                                 ("unsolved", "codetool", 1.0)])
def test_judge_blank_finish_decides_a_blank_finish(tmp_path, blank_finish, protocol, mean):
    """judge.blank_finish (default unsolved) rules a finish("   ") out under the stabletoolbench
    protocol; judge sends its JSON text to the judge; the codetool protocol judges every answer."""
    assert JudgeConfig().blank_finish == "unsolved"
    trajs = [t for t in make_run("m", [("G1", "good"), ("G1", "   ")]) if t.benchmark == "stabletoolbench"]
    path = tmp_path / "run.jsonl"
    write_jsonl(path, [t.to_dict() for t in trajs])
    cfg = EvalConfig(trajectories=[str(path)], out=str(tmp_path / "o"), plots=False,
                     judge=JudgeConfig(rounds=1, blank_finish=blank_finish, protocol=protocol))
    report = run_eval(cfg, ScriptedJudge("Solved"))
    assert report["benchmarks"]["stabletoolbench"]["methods"]["m"]["overall"]["pass_rate"]["mean"] == mean
