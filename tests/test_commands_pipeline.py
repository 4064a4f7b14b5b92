"""``codetool pipeline``: the recipes load, stages skip, resume and rerun by their hashes, and the
whole method runs end to end on real benchmark queries with a scripted policy and a tiny PRM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codetool import CodetoolError
from codetool.commands.pipeline import PipelineConfig, run_pipeline
from codetool.config import ConfigError, load_config
from codetool.executor import ExecutorConfig
from codetool.jobs.pipeline import STAGES, EvalSetConfig, MethodConfig
from codetool.jsonl import read_jsonl
from codetool.judge.config import JudgeConfig
from codetool.models.backends import ScriptedBackend
from codetool.prm.config import PRMConfig
from codetool.search.config import SearchConfig
from codetool.tree.config import TreeConfig

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs" / "pipeline").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_recipe_loads(recipe):
    cfg = load_config(PipelineConfig, recipe)
    assert cfg.name == recipe.stem and cfg.methods and cfg.evals


def test_bad_stage_and_duplicate_methods_are_config_errors():
    with pytest.raises(ConfigError, match="unknown pipeline stage 'tree'"):
        PipelineConfig(stages=["tree"])
    with pytest.raises(ConfigError, match="unique"):
        PipelineConfig(methods=[MethodConfig(name="a"), MethodConfig(name="a")])


@pytest.fixture
def recorded(monkeypatch):
    """Replaces the stages (each the command it calls) by recorders; a stage listed in ``crash``
    raises once."""
    from codetool.commands import pipeline

    calls: list[str] = []
    crash: set[str] = set()

    def make(name):
        def stage(*args):
            calls.append(name)
            if name in crash:
                crash.discard(name)
                raise RuntimeError(f"{name} crashed")
            return {"ran": name}
        return stage

    for name in STAGES:
        monkeypatch.setattr(pipeline, f"stage_{name}", make(name))
    return calls, crash


def test_stages_skip_when_current_and_rerun_downstream_of_a_change(recorded, tmp_path):
    calls, crash = recorded
    cfg = PipelineConfig(name="p", runs_dir=str(tmp_path))
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "ran")
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "skipped")
    record = json.loads((tmp_path / "p" / "train" / "stage.json").read_text())
    assert record["status"] == "done" and record["ran"] == "train"

    # a search setting changed: trees and train stay, search and eval rerun
    calls.clear()
    changed = PipelineConfig(name="p", runs_dir=str(tmp_path), search=SearchConfig(max_steps=2))
    assert run_pipeline(changed) == {"trees": "skipped", "train": "skipped", "search": "ran", "eval": "ran"}
    # --force trees reruns everything after it too
    calls.clear()
    forced = PipelineConfig(name="p", runs_dir=str(tmp_path), search=SearchConfig(max_steps=2), force=["trees"])
    assert run_pipeline(forced) == dict.fromkeys(STAGES, "ran") and calls == list(STAGES)


def test_a_crashed_stage_resumes_in_place(recorded, tmp_path):
    calls, crash = recorded
    cfg = PipelineConfig(name="p", runs_dir=str(tmp_path))
    crash.add("search")
    with pytest.raises(RuntimeError, match="search crashed"):
        run_pipeline(cfg)
    partial = tmp_path / "p" / "search" / "partial.jsonl"
    partial.write_text('{"query_id": "q1"}\n')  # what the crashed stage had written
    record = json.loads((tmp_path / "p" / "search" / "stage.json").read_text())
    assert record["status"] == "failed" and record["error"] == "RuntimeError: search crashed"
    calls.clear()
    assert run_pipeline(cfg) == {"trees": "skipped", "train": "skipped", "search": "ran", "eval": "ran"}
    assert partial.exists()  # kept: the stage's own command resumes from it


def test_a_given_prm_checkpoint_skips_training_and_no_prm_skips_trees(recorded, tmp_path):
    calls, _ = recorded
    given = PipelineConfig(name="a", runs_dir=str(tmp_path), prm_checkpoint="http://127.0.0.1:9/prm")
    assert run_pipeline(given)["train"] == "not run" and "train" not in calls
    calls.clear()
    no_prm = PipelineConfig(name="b", runs_dir=str(tmp_path), methods=[MethodConfig(name="s", latent="none")])
    assert run_pipeline(no_prm) == {"trees": "not run", "train": "not run", "search": "ran", "eval": "ran"}


def test_each_stage_is_called_with_its_commands_config(monkeypatch, tmp_path):
    from codetool.commands import pipeline
    from codetool.jobs.queries import RunConfig

    seen: dict[str, tuple] = {}
    for name in STAGES:
        monkeypatch.setattr(pipeline, f"stage_{name}", lambda *args, name=name: seen.setdefault(name, args) and {})
    cfg = PipelineConfig(name="p", runs_dir=str(tmp_path), seeds=[0, 1])
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "ran")
    (trees,), (train,) = seen["trees"], seen["train"]
    assert isinstance(trees, TreeConfig) and trees.output == str(tmp_path / "p" / "trees" / "trees.jsonl")
    assert isinstance(train, PRMConfig) and train.dataset == [str(tmp_path / "p" / "trees" / "prm_dataset"
                                                                    / "train.jsonl")]
    top, runs, prm = seen["search"]
    assert top is cfg and prm == train.output_dir and seen["eval"] == seen["search"]
    assert all(isinstance(r, RunConfig) for r in runs) and len(runs) == 2 * len(cfg.methods) * len(cfg.evals)


def test_trees_without_rows_stop_with_a_fix(monkeypatch, tmp_path):
    from codetool.commands import pipeline

    monkeypatch.setattr(pipeline, "build_trees_command", lambda cfg: 0)
    cfg = PipelineConfig(name="p", runs_dir=str(tmp_path), stages=["trees"])
    with pytest.raises(CodetoolError, match="no PRM training rows.*max_depth"):
        run_pipeline(cfg)


def scripted_policy():
    """First step: one candidate prints a tool result, its sibling fails; second step: finish."""
    counter = {"n": 0}

    def reply(prompt):
        counter["n"] += 1
        if len(prompt) <= 3:  # system, user, the opening fence: the first step
            if counter["n"] % 2:
                return "print('looked it up')\n```"
            return "raise KeyError('no such field')\n```"
        return "finish('Here is what I found: 42.')\n```"
    return ScriptedBackend(reply)


def test_pipeline_end_to_end(monkeypatch, tiny_model_dir, shared_data, tmp_path, canary_env):
    import codetool.assemble as assemble

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: scripted_policy())
    cfg = PipelineConfig(
        name="e2e", runs_dir=str(tmp_path),
        trees=TreeConfig(branching=2, max_depth=2, limit=4, val_fraction=0.25),
        train=PRMConfig(model=str(tiny_model_dir), num_train_epochs=1, per_device_train_batch_size=4, eval_steps=0,
                        save_steps=100, logging_steps=1),
        search=SearchConfig(max_steps=2, max_new_tokens=16, concurrency=4),
        methods=[MethodConfig(name="single-sample", k=1, w_latent=0.0, latent="none", temperature=0.0),
                 MethodConfig(name="spot+latent", k=2, latent="prm")],
        evals=[EvalSetConfig(benchmark="stabletoolbench", limit=2), EvalSetConfig(benchmark="restbench-tmdb", limit=2)],
        judge=JudgeConfig(model="none"), executor=ExecutorConfig(isolation="fallback", timeout_s=10), seeds=[0, 1])
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "ran")
    root = tmp_path / "e2e"
    assert (root / "train" / "prm").is_dir()
    for method in ("single-sample", "spot+latent"):  # one file per seed, never mixed
        assert sorted(p.name for p in (root / "search" / method).glob("*.jsonl")) == [
            "G1_instruction.seed0.jsonl", "G1_instruction.seed1.jsonl",
            "restbench-tmdb.seed0.jsonl", "restbench-tmdb.seed1.jsonl"]
    latent = list(read_jsonl(root / "search" / "spot+latent" / "G1_instruction.seed1.jsonl"))
    assert len(latent) == 2 and all(t["final_answer"] == "Here is what I found: 42." for t in latent)
    scores = [c["r_latent"] for t in latent for s in t["steps"] for c in s["candidates"]]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)  # the trained PRM scored the candidates
    report = (root / "report.md").read_text()
    assert "single-sample" in report and "spot+latent" in report and "restbench" in report.lower()
    data = json.loads((root / "report.json").read_text())
    # the one-screen summary: judge-free metrics over both seeds, the step-rewards plot, the PRM section
    assert data["summary"]["seeds"] == ["0", "1"]
    cell = data["summary"]["methods"]["spot+latent"]["stabletoolbench"]
    assert cell["n"] == [2, 2] and len(cell["finish"]["values"]) == 2 and cell["finish"]["mean"] == 1.0
    assert cell["finish"]["spread"] == 0.0 and cell["correct_path"] is None
    assert data["summary"]["methods"]["single-sample"]["restbench-tmdb"]["path_score"] is not None
    summary = report.split("## Summary")[1].split("## Configuration")[0]
    assert "Mean ± spread over 2 seeds (half the range over 2 seeds)" in summary
    assert "| spot+latent | stabletoolbench | 2 |" in summary and "100.0 ± 0.0" in summary
    assert (root / "step_rewards.png").is_file() and "![step_rewards](step_rewards.png)" in report
    assert report.index("## Did the PRM help?") < report.index("## Summary")  # the first screen answers it
    assert "What the PRM learned" in summary and (root / "prm_eval" / "metrics.json").is_file()
    assert "weak judge" not in report  # no judge here (the weak-judge warning: tests/test_eval_summary.py)
    everything = "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.suffix in (".json", ".jsonl", ".md"))
    assert canary_env not in everything
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "skipped")


def test_a_given_prm_is_measured_on_the_held_out_trees_too(tmp_path):
    """Before (issue 40): a PRM passed in (prm_checkpoint) got no accuracy in the report."""
    from codetool.jobs.pipeline import held_out_rows

    cfg = PipelineConfig(name="g", runs_dir=str(tmp_path), prm_checkpoint="http://127.0.0.1:9/prm")
    rows = tmp_path / "g" / "trees" / "prm_dataset" / "validation.jsonl"
    assert held_out_rows(cfg, cfg.prm_checkpoint) is None  # no trees yet
    rows.parent.mkdir(parents=True)
    rows.write_text('{"label": 1}\n')
    assert held_out_rows(cfg, cfg.prm_checkpoint) == rows
    no_prm = PipelineConfig(name="g", runs_dir=str(tmp_path), methods=[MethodConfig(name="s", latent="none")])
    assert held_out_rows(no_prm, "http://127.0.0.1:9/prm") is None


def test_an_evaluation_set_can_be_your_own_queries_and_spec(tmp_path):
    from codetool.jobs.pipeline import run_configs

    root = Path(__file__).resolve().parents[1] / "examples" / "library"
    cfg = load_config(PipelineConfig, overrides={"name": "own", "runs_dir": str(tmp_path), "evals": (
        f"[{{queries: {root / 'queries.json'}, tools: {root / 'openapi.json'}}}]")})
    [ev] = cfg.evals
    assert ev.benchmark == "toolbench" and ev.slug == "queries"
    runs = run_configs(cfg, "none")
    assert {(r.queries, r.tools) for r in runs} == {(str(root / "queries.json"), str(root / "openapi.json"))}
    assert all(r.output.endswith("/queries.jsonl") for r in runs)
    with pytest.raises(ConfigError, match="your own"):
        EvalSetConfig(benchmark="toolbench")


def test_a_locked_stage_output_names_the_pipeline_s_options(monkeypatch, tmp_path):
    """A second pipeline on a run whose trees stage another one is building (its record: same
    settings, not done): the lock error named ``--output``, which pipeline lacks."""
    from codetool.commands import build_trees, pipeline
    from codetool.resume import OutputLock

    def no_model(*args, **kwargs):
        raise AssertionError("the lock is taken before any tree is built")

    monkeypatch.setattr(build_trees, "build_missing", no_model)
    cfg = PipelineConfig(name="p", runs_dir=str(tmp_path), stages=["trees"],
                         trees=TreeConfig(queries="world:train:0:1"))
    real = pipeline.build_trees_command
    monkeypatch.setattr(pipeline, "build_trees_command", lambda c: no_model())
    with pytest.raises(AssertionError):
        run_pipeline(cfg)  # leaves the stage's record (failed, these settings): a rerun resumes in place
    monkeypatch.setattr(pipeline, "build_trees_command", real)
    trees = tmp_path / "p" / "trees" / "trees.jsonl"
    with OutputLock(trees), pytest.raises(CodetoolError) as info:
        run_pipeline(cfg)
    said = str(info.value)
    assert f"another run is writing {trees}" in said and "--name (or --runs_dir)" in said
    assert "--output" not in said
