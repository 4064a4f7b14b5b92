"""The paper recipe pins the reference settings; the improved recipe differs only where it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codetool.commands.pipeline import PipelineConfig
from codetool.config import load_config
from codetool.prm.config import PRMConfig

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "configs" / "pipeline" / "paper-qwen2.5-7b.yaml"
IMPROVED = REPO / "configs" / "pipeline" / "codetool-improved-qwen2.5-7b.yaml"
TRAIN = REPO / "configs" / "train" / "qwen2.5-7b.yaml"


def test_paper_recipe_reproduces_the_reference_settings():
    cfg = load_config(PipelineConfig, PAPER)
    t = cfg.trees
    assert (t.branching, t.success, t.label_rule, t.tau_mode, t.emit, t.val_fraction) == (
        2, "executed", "reference", "sum", "pairs", 0.1)
    assert (t.alpha, t.beta, t.max_len) == (0.9, 0.95, 20.0)
    for search in (t.search, cfg.search):
        assert (search.step_format, search.code_prefix) == ("step_text", False)
        assert (search.observation_history, search.max_observation_chars) == ("last", 500)
        assert (search.temperature, search.top_p) == (0.9, 0.95)
    assert (cfg.search.alpha, cfg.search.beta, cfg.search.max_len, cfg.search.max_steps) == (0.9, 0.95, 20.0, 5)
    assert {m.k for m in cfg.methods if m.name != "single-sample"} == {2}
    # the four methods of CodeTool's table, three search seeds (issue 38)
    assert [(m.name, m.k, m.w_spot, m.w_latent, m.w_cost, m.latent) for m in cfg.methods] == [
        ("single-sample", 1, 1.0, 0.0, 0.0, "none"), ("spot-only", 2, 1.0, 0.0, 0.0, "none"),
        ("latent-only", 2, 0.0, 1.0, 0.0, "prm"), ("spot+latent", 2, 1.0, 1.0, 0.0, "prm")]
    assert cfg.seeds == [0, 1, 2] and cfg.trees.never_train_on == ["stabletoolbench", "restbench-tmdb"]
    assert (cfg.search.tie_break, cfg.search.observation_cut, cfg.search.reference_steps) == ("reference", "head", True)
    assert cfg.answer.final_answer == "reference" and cfg.judge.blank_finish == "judge"
    assert (cfg.train.format.interface, cfg.train.max_samples) == ("reference", 10000)
    tmdb = [e for e in cfg.evals if e.benchmark == "restbench-tmdb"]
    assert tmdb and all(e.max_observation_chars == 1500 for e in tmdb)
    assert all(e.max_observation_chars is None for e in cfg.evals if e.benchmark != "restbench-tmdb")


def test_paper_prm_training_recipe():
    cfg = load_config(PRMConfig, TRAIN)
    assert (cfg.finetune, cfg.learning_rate, cfg.num_train_epochs, cfg.lr_scheduler_type, cfg.warmup_steps) == (
        "full", 1e-6, 2.0, "cosine", 0.1)
    # the paper's 8 GPUs are the launch line's --num_processes (the config leaves the count to it)
    usage = re.search(r"--num_processes (\d+)", (REPO / "configs" / "accelerate" / "deepspeed_zero3.yaml").read_text())
    assert cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * int(usage[1]) == 16
    assert "deepspeed_zero3.yaml --num_processes 8" in (REPO / "docs" / "PAPER.md").read_text()
    assert (REPO / "scripts" / "paper" / "env.sh").read_text().count("TRAIN_GPUS=${TRAIN_GPUS:-8}") == 1
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (1, 2)
    assert cfg.format.max_length == 8192 and cfg.format.candidate_output == "hide"
    assert cfg.eval_fraction == 0.1
    assert (cfg.format.interface, cfg.format.label_tokens, cfg.max_samples) == ("reference", ["yes", "no"], 10000)


def test_improved_recipe_differs_only_where_it_says():
    paper, improved = load_config(PipelineConfig, PAPER), load_config(PipelineConfig, IMPROVED)
    assert improved.name == "codetool-improved-qwen2.5-7b"
    assert (improved.trees.success, improved.trees.tau_mode) == ("grounded", "mean")
    assert (improved.search.observation_history, improved.search.max_observation_chars) == ("all", 1500)
    # everything else is the paper recipe's
    assert (improved.trees.label_rule, improved.search.tie_break, improved.search.observation_cut) == (
        "ours", "random", "middle")
    changed = {"success", "tau_mode", "search", "label_rule"}
    for name in vars(paper.trees):
        if name not in changed:
            assert getattr(improved.trees, name) == getattr(paper.trees, name), name
    for name in vars(paper.search):
        if name not in ("observation_history", "max_observation_chars", "tie_break", "observation_cut"):
            assert getattr(improved.search, name) == getattr(paper.search, name), name
    assert improved.methods[:len(paper.methods)] == paper.methods and improved.evals == paper.evals
    assert improved.seeds == paper.seeds == [0, 1, 2]
    assert improved.prm_checkpoint != paper.prm_checkpoint


@pytest.mark.parametrize("recipe", [PAPER, IMPROVED], ids=lambda p: p.stem)
def test_every_changed_line_of_the_improved_recipe_is_marked(recipe):
    text = recipe.read_text()
    assert ("CHANGED" in text) == (recipe == IMPROVED)


def test_search_recipe_names_are_not_the_same_words_in_another_order():
    """configs/search held compare-cpu.yaml (benchmarks/compare_strategies.py) and cpu-compare.yaml
    (benchmarks/bench_search_strategies.py): two recipes of two scripts, told apart by word order only."""
    words: dict[tuple[str, ...], str] = {}
    for path in sorted((REPO / "configs" / "search").glob("*.yaml")):
        key = tuple(sorted(path.stem.split("-")))
        assert key not in words, f"{path.name} and {words[key]} have the same words: name what tells them apart"
        words[key] = path.name
