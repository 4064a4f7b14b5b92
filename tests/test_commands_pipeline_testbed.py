"""The testbed end to end, small: trees on world train queries (leaf success by the answer key), a
tiny PRM, the four methods on held-out queries with two seeds, and the testbed summary; the
shipped recipe loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codetool.commands.pipeline import PipelineConfig, run_pipeline
from codetool.config import load_config
from codetool.executor import ExecutorConfig
from codetool.jobs.pipeline import STAGES, EvalSetConfig, MethodConfig
from codetool.jsonl import read_jsonl
from codetool.judge.config import JudgeConfig
from codetool.models.backends import ScriptedBackend
from codetool.policy.warmstart import call_code
from codetool.prm.config import PRMConfig
from codetool.search.config import SearchConfig
from codetool.tree.config import TreeConfig
from codetool.tree.search_settings import TreeSearch
from codetool.world import SPLITS, generate

REPO = Path(__file__).resolve().parents[1]


def world_policy():
    """Solves a world query by its scripted calls, except that every other sample at the first step
    calls the right tool with a misspelled argument (its step fails) and every third final answer
    lists two values (the checker fails it): siblings differ in running and in success."""
    by_text = {q.query: q for split in SPLITS for q in generate(split, 4)}
    counter = {"n": 0}

    def reply(prompt):
        counter["n"] += 1
        q = by_text[prompt[1]["content"].split("Request: ", 1)[1].split("\n", 1)[0]]
        step = sum(m["role"] == "assistant" for m in prompt[:-1])
        if step < len(q.calls):
            name, args = q.calls[step]
            if step == 0 and counter["n"] % 2:
                return call_code(name, {k + "_x": v for k, v in args.items()}) + "\n```"
            return call_code(name, args) + "\n```"
        return (f'finish("{q.answer} or 1.5")' if counter["n"] % 3 == 0 else f'finish("{q.answer}")') + "\n```"

    return ScriptedBackend(reply)


def _testbed_config(tmp_path, tiny_model_dir, **over) -> PipelineConfig:
    return PipelineConfig(
        name="tb", runs_dir=str(tmp_path), policy=str(tiny_model_dir),
        trees=TreeConfig(queries="world:train:3", tools_backend="world", success="answer", branching=2, max_depth=5,
                         val_fraction=0.34, search=TreeSearch(max_new_tokens=40)),
        train=PRMConfig(model=str(tiny_model_dir), num_train_epochs=1, per_device_train_batch_size=4, eval_steps=0,
                        save_steps=100, logging_steps=1),
        search=SearchConfig(max_steps=5, max_new_tokens=40, concurrency=4),
        methods=[MethodConfig(name="single-sample", k=1, w_latent=0.0, latent="none"),
                 MethodConfig(name="spot-only", k=2, w_latent=0.0, latent="none"),
                 MethodConfig(name="latent-only", k=2, w_spot=0.0, latent="prm"),
                 MethodConfig(name="spot+latent", k=2, latent="prm")],
        evals=[EvalSetConfig(benchmark="world", group="heldout", limit=2)],
        judge=JudgeConfig(model="none"), executor=ExecutorConfig(isolation="fallback", timeout_s=10), seeds=[0, 1],
        **over)


def test_testbed_pipeline_end_to_end(monkeypatch, tiny_model_dir, tmp_path, canary_env):
    import codetool.assemble as assemble

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: world_policy())
    cfg = _testbed_config(tmp_path, tiny_model_dir)
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "ran")
    root = tmp_path / "tb"
    trees = list(read_jsonl(root / "trees" / "trees.jsonl"))
    assert len(trees) == 3 and all(t["answer_key"] and t["summary"]["successful_leaves"] for t in trees)
    leaves = [n for t in trees for n in t["nodes"].values() if n["leaf"]]
    assert any(not n["success"] and n["ended"] == "finish" for n in leaves)  # the two-value answers failed
    counts = json.loads((root / "trees" / "prm_dataset" / "summary.json").read_text())["pair_counts"]["decided"]
    assert counts["executability"] and counts["success_share"]
    spot = list(read_jsonl(root / "search" / "spot-only" / "world-heldout.seed1.jsonl"))
    assert sorted(t["query_id"] for t in spot) == ["heldout-0000", "heldout-0001"]
    assert all(t["extra"]["answer"] and t["benchmark"] == "world" for t in spot)
    summary = json.loads((root / "testbed.json").read_text())
    methods = {r["method"]: r for r in summary["methods"]}
    assert set(methods) == {"single-sample", "spot-only", "latent-only", "spot+latent"}
    assert all(r["queries"] == 2 and r["seeds"] == [0, 1] and 0.0 <= r["success"] <= 1.0 for r in methods.values())
    assert all(r["low"] <= r["success"] <= r["high"] for r in methods.values())
    pairs = {(p["a"], p["b"]): p for p in summary["paired"]}
    assert len(pairs) == 6 and pairs[("spot+latent", "single-sample")]["n"] == 2
    single = methods["single-sample"]["success"]
    assert pairs[("spot-only", "single-sample")]["mean"] == pytest.approx(methods["spot-only"]["success"] - single)
    assert summary["prm_pairs"] is not None and set(summary["prm_pairs"]) == {"both_ran", "one_ran", "none_ran"}
    text = (root / "testbed.md").read_text()
    assert "| spot+latent |" in text and "95% interval" in text and "both steps ran" in text
    assert "Exact success on world heldout queries 0-1, of held-out templates" in text
    everything = "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.suffix in (".json", ".jsonl", ".md"))
    assert canary_env not in everything
    assert run_pipeline(cfg) == dict.fromkeys(STAGES, "skipped")


def test_the_shipped_testbed_recipes_load():
    cfg = load_config(PipelineConfig, REPO / "configs" / "pipeline" / "testbed.yaml")
    assert cfg.policy == "testbed" and cfg.trees.success == "answer" and cfg.trees.queries.startswith("world:train")
    assert [e.benchmark for e in cfg.evals] == ["world"] and cfg.evals[0].group == "heldout"
    assert [m.name for m in cfg.methods] == ["single-sample", "spot-only", "latent-only", "spot+latent"]
    assert len({m.k for m in cfg.methods[1:]}) == 1 and len(cfg.seeds) >= 3
    from codetool.policy.config import TrainPolicyConfig

    rl = load_config(TrainPolicyConfig, REPO / cfg.policy_rl)
    assert all(q.benchmark == "world" and q.group == "train" for q in rl.prompts)
    assert all(q.benchmark == "world" and q.group == "heldout" for q in rl.evals)
    assert all(s.answer > 0 and not s.grounded for s in rl.run_settings)


def test_the_small_testbed_recipe_searches_unseen_queries_of_the_tree_templates_only():
    """testbed-small.yaml: the four methods at one K, no policy RL, and its evaluation queries (train
    templates, past the 96 warm-start demonstrations) share no query with its trees."""
    from codetool.world import parse_spec

    cfg = load_config(PipelineConfig, REPO / "configs" / "pipeline" / "testbed-small.yaml")
    assert cfg.policy == "testbed" and cfg.trees.success == "answer" and not cfg.policy_rl
    assert [m.name for m in cfg.methods] == ["single-sample", "spot-only", "latent-only", "spot+latent"]
    assert len({m.k for m in cfg.methods[1:]}) == 1 and cfg.methods[0].k == 1
    (ev,) = cfg.evals
    assert (ev.benchmark, ev.group) == ("world", "train") and ev.offset >= 96
    split, offset, n = parse_spec(cfg.trees.queries)
    assert split == "train"
    queries = generate("train", ev.offset + ev.limit)
    assert not {q.query for q in queries[offset:offset + n]} & {q.query for q in queries[ev.offset:]}


def test_the_small_rl_recipe_evaluates_on_the_small_ablations_queries_and_never_trains_on_them():
    """configs/policy/testbed-small.yaml: GRPO of the warm start on train-template queries, before/after
    on queries 96-107 (none of them a prompt), every setting outcome by the answer key, one budget."""
    from codetool.policy.config import TrainPolicyConfig

    cfg = load_config(TrainPolicyConfig, REPO / "configs" / "policy" / "testbed-small.yaml")
    assert cfg.policy == "testbed" and cfg.advantage == "anchored" and cfg.token_budget > 0
    (ev,) = cfg.evals
    assert (ev.benchmark, ev.group, ev.offset, ev.limit) == ("world", "train", 96, 12)
    (prompts,) = cfg.prompts
    assert (prompts.benchmark, prompts.group) == ("world", "train")
    assert prompts.offset + prompts.limit <= ev.offset
    queries = generate("train", ev.offset + ev.limit)
    train = {q.query for q in queries[prompts.offset:prompts.offset + prompts.limit]}
    assert not train & {q.query for q in queries[ev.offset:]}
    assert len(cfg.run_settings) >= 2 and all(s.answer > 0 and not s.grounded and not s.judged for s in cfg.run_settings)
    assert any(s.on_the_spot > 0 for s in cfg.run_settings)
    assert all(not s.prm for s in cfg.run_settings)  # no PRM: the small recipe's learned nothing (docs/TESTBED.md)


def test_the_summary_names_the_sets_it_measured():
    """The small ablation runs on unseen queries of the train templates: its report must not call
    them held-out (it did: "held-out success" for queries 96-107 of the train split)."""
    from codetool.commands.pipeline import evaluated_sets
    from codetool.commands.run import RunConfig

    text = evaluated_sets([RunConfig(benchmark="world", group="train", offset=96, limit=12)] * 3)  # 3 seeds
    assert text.startswith("world train queries 96-107, of the train templates") and "held-out" not in text
    assert evaluated_sets([RunConfig(benchmark="world", group="heldout", limit=24)]).startswith(
        "world heldout queries 0-23, of held-out templates")
