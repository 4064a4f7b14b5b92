"""The comparability block names every difference from the procedure it compares with, one check a line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from codetool.commands.eval import EvalConfig
from codetool.commands.pipeline import PipelineConfig
from codetool.config import load_config
from codetool.eval.comparability import (
    CHECKS,
    comparability_block,
    recipe_settings,
    render_block,
    target_of,
)
from codetool.judge.config import JudgeConfig
from codetool.search.records import Trajectory

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "configs" / "pipeline" / "paper-qwen2.5-7b.yaml"
STB_EVAL = REPO / "configs" / "eval" / "stabletoolbench.yaml"

REFERENCE = {  # what each target's reference does, for every run setting the block checks
    "answer.final_answer": "reference", "trees.label_rule": "reference", "trees.success": "executed",
    "trees.tau_mode": "sum", "prm.interface": "reference", "search.tie_break": "reference",
    "search.observation_cut": "head", "search.observation_history": "last", "search.step_format": "step_text",
    "search.max_observation_chars": 500, "search.reference_steps": True,
    "__source__": "test"}


def _default(key: str):
    obj = PipelineConfig()
    for part in key.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return KeyError
        obj = getattr(obj, part)
    return obj


def test_check_defaults_are_the_package_defaults():
    for check in CHECKS:
        if check.key.startswith("judge.") and check.default is None:
            continue  # resolved from the protocol
        # a setting the run records (prm.interface) is read from the first of its keys the config has
        value = next((v for v in map(_default, (check.key, *check.aliases)) if v is not KeyError), KeyError)
        assert value is not KeyError, f"{check.key}: no such setting"
        assert value == check.default, check.key


def _block(judge_cfg, *, settings=None, name="openai:gpt-4-turbo-2024-04-09@https://api.openai.com/v1",
           sources=("generated",), mode="tools", report=None, recorded=None, runs=None, benchmark="custom"):
    trajs = [Trajectory(str(i), "q", benchmark, "G1_instruction", "m", final_answer="a",
                        finish_type="max_steps" if s == "generated" else "finish",
                        extra={"answer_source": s} if s == "generated" else {}) for i, s in enumerate(sources)]
    for t in trajs:
        if recorded is not None:
            t.extra["fidelity"] = recorded
    run = SimpleNamespace(method="m", source="m.jsonl", trajectories=trajs)
    info = {"name": name, "kind": "openai", "weak": False, "mode": mode, "tool_fallbacks": 0}
    return comparability_block(report or {"benchmarks": {}, "win_rates": {}}, judge_cfg, runs or [run], None, info,
                               settings if settings is not None else REFERENCE)


CODETOOL_JUDGE = dict(protocol="codetool", prompts="codetool")
STB_JUDGE = dict(protocol="stabletoolbench", prompts="stabletoolbench", blank_finish="judge")


def test_no_deviation_only_when_everything_matches():
    block = _block(JudgeConfig(**CODETOOL_JUDGE))
    assert block["target"] == "codetool" and block["deviations"] == []
    assert block["settings_checked"] == len([c for c in CHECKS if "codetool" in c.expected])
    text = "\n".join(render_block(block))
    assert "No setting deviates from CodeTool's table" in text and "known differences below remain" in text
    assert any(d.startswith("on-the-spot reward:") for d in block["known_differences"])  # FIDELITY.md's difference
    assert any("judge requests carry a seed" in d for d in block["known_differences"])
    stb = _block(JudgeConfig(**STB_JUDGE), name="openai:gpt-4-turbo-preview@x", sources=("finish",),
                 settings={**REFERENCE, "answer.final_answer": "off"})
    assert stb["target"] == "stabletoolbench" and stb["deviations"] == []


@pytest.mark.parametrize("target", ["codetool", "stabletoolbench"])
def test_every_checked_setting_that_differs_is_named(target):
    base = CODETOOL_JUDGE if target == "codetool" else STB_JUDGE
    for check in CHECKS:
        if target not in check.expected:
            continue
        if check.key.startswith("judge."):
            field = check.key.split(".", 1)[1]
            wrong = {"prompts": "ours", "protocol": "stabletoolbench" if target == "codetool" else "codetool",
                     "rounds": 7, "temperature": 0.9, "max_trajectory_chars": 3000, "codetool_instruction": "v1",
                     "stabletoolbench_evaluator": "other", "blank_finish": "unsolved"}[field]
            cfg = JudgeConfig(**{**base, field: wrong})
            if target_of(cfg) != target:
                continue  # switching the procedure switches the target: covered by the other target
            block = _block(cfg)
        else:
            block = _block(JudgeConfig(**base), settings={**REFERENCE, check.key: "something-else"})
        assert any(d.startswith(check.key) for d in block["deviations"]), check.key
        assert "No setting deviates" not in "\n".join(render_block(block))


def test_judge_model_reply_format_answers_and_unrecorded_settings():
    block = _block(JudgeConfig(**STB_JUDGE), name="openai:gpt-4-turbo-2024-04-09@x", mode="json",
                   settings={**REFERENCE, "answer.final_answer": "off"})
    devs = " ".join(block["deviations"])
    assert "not gpt-4-turbo-preview" in devs and "since 2024-06" in devs and "JSON text" in devs
    assert "final answers generated after the search" in devs  # StableToolBench judges Finish answers
    paper = _block(JudgeConfig(**CODETOOL_JUDGE), sources=("generated", "finish"))
    assert any("not regenerated for every trajectory" in d for d in paper["deviations"])
    unknown = _block(JudgeConfig(**CODETOOL_JUDGE), settings={})
    [line] = [d for d in unknown["deviations"] if "not recorded" in d]
    assert "trees.label_rule" in line and "prm.interface" in line
    ours = _block(JudgeConfig())
    assert any(d.startswith("our judge prompts") for d in ours["deviations"])


def test_recipes_select_the_reference_procedures():
    paper = load_config(PipelineConfig, PAPER).judge
    assert (paper.protocol, paper.prompts, paper.codetool_instruction, paper.rounds, paper.temperature) == (
        "codetool", "codetool", "v2", 1, 0.0)
    assert paper.remote_model == "gpt-4-turbo-2024-04-09" and target_of(paper) == "codetool"
    stb = load_config(EvalConfig, STB_EVAL, {"trajectories": ["x.jsonl"], "recipe": str(PAPER)})
    j = stb.judge
    assert (j.protocol, j.prompts, j.rounds, j.temperature, j.remote_model, j.mode, j.blank_finish) == (
        "stabletoolbench", "stabletoolbench", 3, 0.2, "gpt-4-turbo-preview", "tools", "judge")
    assert stb.run_settings["trees.label_rule"] == "reference" and stb.run_settings["__source__"] == str(PAPER)
    # --recipe alone: the recipe's judge is the base; the command line still wins
    alone = load_config(EvalConfig, None, {"trajectories": ["x.jsonl"], "recipe": str(PAPER), "judge.rounds": 2})
    assert (alone.judge.protocol, alone.judge.prompts, alone.judge.rounds) == ("codetool", "codetool", 2)
    assert recipe_settings(PAPER)["search.observation_history"] == "last"


def test_settings_the_trajectories_recorded_are_checked_per_method():
    record = {"tie_break": "reference", "observation_cut": "head", "max_observation_chars": 500,
              "observation_history": "last", "step_format": "step_text", "reference_steps": True,
              "final_answer": "reference", "prm": {"interface": "reference", "label_rules": ["reference"]}}
    trees = {k: v for k, v in REFERENCE.items() if k.startswith("trees.") and k != "trees.label_rule"}
    # the run records everything but the trees' success rule and tau: those come from the recipe
    block = _block(JudgeConfig(**CODETOOL_JUDGE), settings={**trees, "__source__": "r"}, recorded=record)
    assert block["deviations"] == []
    # what the trajectories recorded wins over the recipe
    wrong = {**record, "observation_cut": "middle", "prm": {"interface": "ours", "label_rules": ["ours"]}}
    devs = _block(JudgeConfig(**CODETOOL_JUDGE), settings={}, recorded=wrong)["deviations"]
    assert any(d.startswith("search.observation_cut is 'middle'") for d in devs)
    assert any(d.startswith("prm.interface is 'ours'") for d in devs)
    assert any(d.startswith("trees.label_rule is ['ours']") for d in devs)
    # without a recipe: what nobody recorded is named
    assert any("not recorded" in d and "trees.success" in d for d in devs)
    # a method without a PRM skips the PRM's checks; differences name the methods they concern
    no_prm = Trajectory("1", "q", "stabletoolbench", "G1_instruction", "single-sample", final_answer="a",
                        finish_type="max_steps", extra={"answer_source": "generated",
                                                        "fidelity": {**record, "prm": None, "tie_break": "random"}})
    with_prm = Trajectory("1", "q", "stabletoolbench", "G1_instruction", "spot+latent", final_answer="a",
                          finish_type="max_steps", extra={"answer_source": "generated", "fidelity": wrong})
    runs = [SimpleNamespace(method=t.method, source="x", trajectories=[t]) for t in (no_prm, with_prm)]
    devs = _block(JudgeConfig(**CODETOOL_JUDGE), settings={**trees, "__source__": "r"}, runs=runs)["deviations"]
    assert "search.tie_break is 'random', not 'reference': CodeTool's main method keeps the first of exactly " \
           "equal candidates (single-sample)." in devs
    assert any(d.startswith("prm.interface is 'ours'") and d.endswith("(spot+latent).") for d in devs)


def _method_run(name, search):
    t = Trajectory("1", "q", "restbench-tmdb", "tmdb", name, final_answer="a", finish_type="finish",
                   extra={"answer_source": "generated", "fidelity": {"search": search}})
    return SimpleNamespace(method=name, source="x", trajectories=[t])


PAPER_METHODS = {"single-sample": {"k": 1, "w_latent": 0.0, "latent": "none", "temperature": 0.0},
                 "spot-only": {"w_latent": 0.0, "latent": "none"}, "latent-only": {"w_spot": 0.0},
                 "spot+latent": {}}


def _paper_runs(**over):
    base = {"k": 2, "max_steps": 5, "temperature": 0.9, "top_p": 0.95, "w_spot": 1.0, "w_latent": 1.0,
            "w_cost": 0.0, "latent": "prm", "seed": 0}
    return [_method_run(name, {**base, **m, **(over if name == "spot+latent" else {})})
            for name, m in PAPER_METHODS.items()]


def test_each_methods_k_steps_sampling_and_weights_are_checked():
    block = _block(JudgeConfig(**CODETOOL_JUDGE), runs=_paper_runs())
    assert block["deviations"] == []  # the table's four methods, as the paper runs them
    assert not any("table rows" in u for u in block["unchecked"])
    assert any("single-sample row's temperature" in u for u in block["unchecked"])  # the paper does not give it
    for over, words in (({"k": 3}, "search.k is 3, not 2"), ({"max_steps": 8}, "search.max_steps is 8, not 5"),
                        ({"temperature": 0.2}, "search.temperature is 0.2, not 0.9"),
                        ({"w_cost": 0.1}, "make no method of CodeTool's table")):
        block = _block(JudgeConfig(**CODETOOL_JUDGE), runs=_paper_runs(**over))
        assert any(d.startswith("spot+latent: ") and words in d for d in block["deviations"]), over
        assert "No setting deviates" not in "\n".join(render_block(block))
    # the paper recipe's methods, when no trajectory recorded them: read from the recipe
    settings = recipe_settings(PAPER)
    runs = [SimpleNamespace(method=m["name"], source="x", trajectories=[]) for m in settings["methods"]]
    devs = _block(JudgeConfig(**CODETOOL_JUDGE), settings=settings, runs=runs)["deviations"]
    assert not any("search." in d and d.split(":")[0] in PAPER_METHODS for d in devs)
    three = _block(JudgeConfig(**CODETOOL_JUDGE), settings={**settings, "methods": [
        {**m, "k": 3} if m["name"] == "spot+latent" else m for m in settings["methods"]]}, runs=runs)["deviations"]
    assert "spot+latent: search.k is 3, not 2: CodeTool samples 2 candidates per step." in three


def test_the_subset_is_checked_by_query_ids_not_by_size(shared_data):
    import json

    filtered = [str(q["query_id"]) for q in json.loads((shared_data / "CodeTool" / "StableToolBench" /
                "solvable_queries" / "filter_test_instruction" / "G3_instruction.json").read_text())]
    full = json.loads((shared_data / "StableToolBench" / "solvable_queries" / "test_query_ids" /
                       "G3_instruction.json").read_text())
    other = [q for q in full if q not in filtered][:17]  # 17 queries of G3, not CodeTool's 17

    def run(ids):
        trajs = [Trajectory(i, "q", "stabletoolbench", "G3_instruction", "m", final_answer="a", finish_type="finish",
                            extra={"answer_source": "generated"}) for i in ids]
        return SimpleNamespace(method="m", source="x", trajectories=trajs)

    report = {"benchmarks": {"stabletoolbench": {"methods": {"m": {"groups": {"G3_instruction": {"n": 17}}}}}},
              "win_rates": {}}
    good = _block(JudgeConfig(**CODETOOL_JUDGE), runs=[run(filtered)], report=report)
    assert good["subset"]["stabletoolbench"]["kind"]["G3_instruction"] == "CodeTool's filtered group (ids checked)"
    assert not any("not CodeTool's filtered group" in d for d in good["deviations"])
    bad = _block(JudgeConfig(**CODETOOL_JUDGE), runs=[run(other)], report=report)
    assert any(d.startswith("stabletoolbench G3_instruction: 17 queries, not CodeTool's filtered group")
               for d in bad["deviations"])


def test_a_missing_public_scep_says_why_and_how_to_get_it():
    from codetool.eval.runs import run_warnings
    from codetool.search.records import Candidate, Step

    t = Trajectory("1", "q", "restbench-tmdb", "tmdb", "m", finish_type="finish", final_answer="a")
    t.steps.append(Step(index=0, candidates=[Candidate(index=0, text="x", code="x = 1")], chosen=0, observation=""))
    [line] = [w for w in run_warnings([SimpleNamespace(method="m", trajectories=[t])]) if "SCEP" in w]
    assert "re-run" in line and "--search.reference_steps true" in line
