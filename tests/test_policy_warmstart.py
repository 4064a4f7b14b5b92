"""The testbed's warm start: demonstrations in the search's exact step format, the reply-only loss,
and the cached policy (tiny model, offline)."""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from codetool.policy.warmstart import (
    WarmStartConfig,
    build_testbed_policy,
    call_code,
    demonstrations,
    tokenize_demo,
)
from codetool.search.prompt import CODE_PREFIX, format_observation, parse_candidate
from codetool.world import generate


def test_steps_are_literal_constrained_lines():
    assert call_code("add_days", {"date": "2025-01-02", "days": -3}) == \
        'result = add_days(date="2025-01-02", days=-3)\nprint(result)'
    assert call_code("convert_units", {"value": 811.0, "from_unit": "km", "to_unit": "mi"}).startswith(
        'result = convert_units(value=811, from_unit="km"')
    assert call_code("convert_units", {"value": -3.4}, assign=False) == "convert_units(value=-3.4)"


def test_the_step_constraint_accepts_every_demonstrated_reply():
    from codetool.assemble import make_task
    from codetool.search.config import SearchConfig
    from codetool.search.expand import step_constraint
    from codetool.world import WorldBackend, load_queries

    cfg = SearchConfig(constrain="line", max_steps=5)
    demos = demonstrations(generate("train", 12), max_observation_chars=400, recover_share=0.0, seed=0)
    for query, demo in zip(load_queries("train", 12), demos):
        task = make_task(query, WorldBackend(), tool_doc="brief")
        for i, step in enumerate(demo["steps"]):
            constraint = step_constraint(task, i, cfg, CODE_PREFIX)
            assert constraint.allows(f"{step['code']}\n```"), step["code"]


def test_mistakes_are_shown_but_never_targets_and_observations_are_the_searchs(tiny_model_dir):
    from transformers import AutoTokenizer

    queries = generate("train", 24)
    demos = demonstrations(queries, max_observation_chars=400, recover_share=1.0, seed=0)
    wrong = [s for d in demos for s in d["steps"] if not s["target"]]
    assert len(wrong) >= 18 and all(s["observation"].startswith("Error (ToolError)") for s in wrong)
    assert all(d["steps"][-1]["code"] == f'finish("{q.answer}")' for d, q in zip(demos, queries))
    first = next(s for s in demos[2]["steps"] if s["target"])
    assert first["observation"].startswith("Output:\n{'city_id': ") and parse_candidate(
        CODE_PREFIX + first["code"] + "\n```").code == first["code"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    row = tokenize_demo(tok, demos[0])
    targets = tok.decode([i for i, m in zip(row["input_ids"], row["assistant_masks"]) if m])
    shown = tok.decode(row["input_ids"])
    assert all(f"{s['code']}\n```" in targets for s in demos[0]["steps"] if s["target"])
    assert all(s["code"] not in targets and s["code"] in shown for s in demos[0]["steps"] if not s["target"])
    assert format_observation is not None and "Request: " + queries[0].query in shown


def test_the_testbed_policy_is_built_once_and_only_its_top_layers_move(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from codetool.models.loading import resolve_model

    cfg = WarmStartConfig(base=str(tiny_model_dir), per_template=1, epochs=1.0, train_layers=1, batch_size=4,
                          learning_rate=1e-2)
    target = build_testbed_policy(cfg, tmp_path)
    manifest = json.loads((target / "codetool-manifest.json").read_text())
    assert manifest["demonstrations"] == 12 and manifest["settings"]["train_layers"] == 1
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(target).state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(("model.layers.1.", "model.norm")) for k in moved)
    stamp = (target / "codetool-manifest.json").stat().st_mtime
    assert build_testbed_policy(cfg, tmp_path) == target and (target / "codetool-manifest.json").stat().st_mtime == stamp
    # a thread count changes how it is computed, not the policy: the cache serves it (it was rebuilt,
    # 30 CPU-minutes, when `make testbed` met a policy built with --torch_threads 2)
    threads = WarmStartConfig(**{**asdict(cfg), "torch_threads": 2})
    assert build_testbed_policy(threads, tmp_path) == target
    assert (target / "codetool-manifest.json").stat().st_mtime == stamp
    monkeypatch.setenv("CODETOOL_CHECKPOINTS", str(tmp_path))
    assert resolve_model("testbed") == str(target)
