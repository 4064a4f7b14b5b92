"""`codetool build-trees` as a long job (issue 19): a failing tree is recorded, the rest are built."""

from __future__ import annotations

import json

import pytest

import codetool.assemble as assemble
from codetool import CodetoolError
from codetool.jsonl import read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.tree.build import TreeConfig, build_trees_command

API = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
       "required_parameters": [], "optional_parameters": [], "method": "GET"}


@pytest.fixture
def queries(tmp_path):
    path = tmp_path / "G1.json"
    path.write_text(json.dumps([{"query_id": i, "query": f"weather {i}?", "api_list": [API]} for i in (1, 2, 3)]))
    return path


def _cfg(queries, tmp_path, **over) -> TreeConfig:
    from codetool.config import load_config

    base = {"queries": str(queries), "output": str(tmp_path / "trees.jsonl"), "dataset_dir": str(tmp_path / "prm"),
            "branching": 2, "max_depth": 1, "batch_trees": 3, "executor.isolation": "fallback"}
    return load_config(TreeConfig, overrides={**base, **over})


def test_failing_tree_is_recorded_and_retried(monkeypatch, queries, tmp_path):
    def reply(prompt):
        if "weather 2?" in json.dumps(prompt, default=str):
            raise CodetoolError("policy answered HTTP 500 after 4 attempts")
        return "finish('ok')\n```"

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: ScriptedBackend(reply))
    assert build_trees_command(_cfg(queries, tmp_path)) == 1
    records = {r["query_id"]: r for r in read_jsonl(tmp_path / "trees.jsonl")}
    assert sorted(records) == ["G1/1", "G1/2", "G1/3"]
    assert records["G1/2"]["finish_type"] == "error" and "HTTP 500" in records["G1/2"]["error"]
    assert records["G1/1"]["nodes"] and "finish_type" not in records["G1/1"]
    # a changed setting refuses to mix; --retry_failed rebuilds only the failed tree
    with pytest.raises(CodetoolError, match="other settings"):
        build_trees_command(_cfg(queries, tmp_path, max_depth=2))
    policy = ScriptedBackend(lambda p: "finish('ok')\n```")
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: policy)
    assert build_trees_command(_cfg(queries, tmp_path, retry_failed=True)) == 0
    records = list(read_jsonl(tmp_path / "trees.jsonl"))
    assert sorted(r["query_id"] for r in records) == ["G1/1", "G1/2", "G1/3"]
    assert all("finish_type" not in r for r in records)
    prompts = [json.dumps(p, default=str) for batch, _ in policy.calls for p in batch]
    assert prompts and all("weather 2?" in p for p in prompts)  # only the failed tree was rebuilt
