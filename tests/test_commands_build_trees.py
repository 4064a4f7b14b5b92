"""`codetool build-trees` as a long job (issue 19): a failing tree is recorded, the rest are built."""

from __future__ import annotations

import json

import pytest

import codetool.assemble as assemble
from codetool import CodetoolError
from codetool.commands.build_trees import build_trees_command
from codetool.jsonl import read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.resume import FatalError
from codetool.tree.config import TreeConfig

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


def _pairs_policy():
    """Depth 1: the first sibling runs, the second raises; executability labels the pair."""
    count = [0]

    def reply(prompt):
        count[0] += 1
        return "print('looked it up')\n```" if count[0] % 2 else "raise KeyError('no such field')\n```"
    return ScriptedBackend(reply)


def test_a_malformed_query_is_an_error_record_and_the_exit_status_is_1(monkeypatch, tmp_path):
    """Before (issue 28): the loader said the entry 'will be recorded as an error', then build-trees
    dropped it as a query without APIs and exited 0."""
    path = tmp_path / "G1.json"
    path.write_text(json.dumps([{"query_id": 1, "query": "weather 1?", "api_list": [API]},
                                {"query_id": 2, "query": "weather 2?", "api_list": [{"required_parameters": 5}]},
                                {"query_id": 3, "query": "weather 3?", "api_list": [API]}]))
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: _pairs_policy())
    assert build_trees_command(_cfg(path, tmp_path)) == 1
    records = {r["query_id"]: r for r in read_jsonl(tmp_path / "trees.jsonl")}
    assert sorted(records) == ["G1/1", "G1/2", "G1/3"]
    assert records["G1/2"]["finish_type"] == "error" and "malformed query entry" in records["G1/2"]["error"]
    assert records["G1/1"]["nodes"] and records["G1/3"]["nodes"]
    assert (tmp_path / "prm" / "prm_examples.jsonl").is_file()  # the good trees still give the dataset
    # a shard that holds the malformed query exits 1 too; the other one 0
    assert build_trees_command(_cfg(path, tmp_path, output=str(tmp_path / "s" / "trees.jsonl"), shard="1/2")) == 1
    assert build_trees_command(_cfg(path, tmp_path, output=str(tmp_path / "s" / "trees.jsonl"), shard="0/2")) == 0


def test_a_failed_dataset_export_is_an_error_and_keeps_the_previous_dataset(monkeypatch, queries, tmp_path):
    """A full disk while the PRM dataset is written: before (issue 28) a warning, exit 0 and a
    half-written folder; now a one-line error, and the folder holds the previous export whole."""
    import codetool.tree.dataset as dataset

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: _pairs_policy())
    real = dataset.write_jsonl

    def full_disk(path, records):
        if path.name == "train.jsonl":
            raise CodetoolError(f"cannot write {path}: No space left on device (free space or fix permissions).")
        return real(path, records)

    monkeypatch.setattr(dataset, "write_jsonl", full_disk)
    with pytest.raises(CodetoolError, match="cannot write the PRM dataset into .*No space left on device"):
        build_trees_command(_cfg(queries, tmp_path))
    assert not (tmp_path / "prm").exists()  # no half-written dataset for train-prm to read
    assert len(list(read_jsonl(tmp_path / "trees.jsonl"))) == 3  # the trees are kept
    monkeypatch.setattr(dataset, "write_jsonl", real)
    assert build_trees_command(_cfg(queries, tmp_path)) == 0  # only the export runs again
    before = {p.name: p.stat().st_ino for p in (tmp_path / "prm").iterdir()}
    assert {"prm_examples.jsonl", "train.jsonl", "validation.jsonl", "summary.json"} <= set(before)
    monkeypatch.setattr(dataset, "write_jsonl", full_disk)
    with pytest.raises(CodetoolError, match="No space left on device"):
        build_trees_command(_cfg(queries, tmp_path))
    assert {p.name: p.stat().st_ino for p in (tmp_path / "prm").iterdir()} == before  # untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".prm.tmp-")] == []  # no staging left


def test_merge_names_the_shards_that_did_not_finish(monkeypatch, queries, tmp_path):
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: _pairs_policy())
    out = str(tmp_path / "sharded" / "trees.jsonl")
    assert build_trees_command(_cfg(queries, tmp_path, output=out, shard="0/2")) == 0
    with pytest.raises(CodetoolError, match=r"1 of 3 queries have no tree .*G1/2.* Run --shard 1/2 again"):
        build_trees_command(_cfg(queries, tmp_path, output=out, merge=True))
    assert build_trees_command(_cfg(queries, tmp_path, output=out, shard="1/2")) == 0
    assert build_trees_command(_cfg(queries, tmp_path, output=out, merge=True)) == 0


def test_duplicate_query_ids_in_one_file_are_refused(tmp_path):
    path = tmp_path / "G1.json"
    path.write_text(json.dumps([{"query_id": i, "query": f"weather {i}?", "api_list": [API]} for i in (1, 2, 1, 3, 2, 1)]))
    with pytest.raises(CodetoolError, match=r"G1.json: 2 query ids occur more than once: G1/1 \(3x\), G1/2 \(2x\)"):
        build_trees_command(_cfg(path, tmp_path))
    assert not (tmp_path / "trees.jsonl").exists()


def test_a_dead_policy_server_stops_the_job_after_the_first_failed_tree(monkeypatch, queries, tmp_path):
    tried = []

    class Client:
        unreachable = None

    def refuse(prompt):
        tried.append(json.dumps(prompt, default=str))
        Client.unreachable = "http://127.0.0.1:9/v1/chat/completions: cannot connect (ConnectError) after 7 attempts"
        raise CodetoolError(Client.unreachable)

    policy = ScriptedBackend(refuse)
    policy.remote = Client
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: policy)
    with pytest.raises(FatalError, match="the policy server cannot be reached .* it resumes with the trees"):
        build_trees_command(_cfg(queries, tmp_path, batch_trees=1))
    assert len({next(w for w in ("weather 1?", "weather 2?", "weather 3?") if w in p) for p in tried}) == 1
    out = tmp_path / "trees.jsonl"
    assert not out.exists() or list(read_jsonl(out)) == []


LIBRARY = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "library"


def test_trees_on_an_openapi_spec_and_a_restgpt_query_file(monkeypatch, tmp_path, caplog):
    """Issue 40: build-trees takes RestGPT's layout (a query file + --tools spec.json); without a
    terminal its progress is logged in nodes (the last line at the end)."""
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: _pairs_policy())
    cfg = _cfg(LIBRARY / "queries.json", tmp_path, tools=str(LIBRARY / "openapi.json"))
    with caplog.at_level("INFO", logger="codetool.progress"):
        assert build_trees_command(cfg) == 0
    assert "trees: 4/4 trees, 8/~8 nodes (100%)" in caplog.text  # depth 1: each root makes 2 nodes
    records = list(read_jsonl(tmp_path / "trees.jsonl"))
    assert [r["query_id"] for r in records] == ["queries/q0", "queries/q1", "queries/q2", "queries/q3"]
    assert all(r["nodes"] and "finish_type" not in r for r in records)
    assert (tmp_path / "prm" / "prm_examples.jsonl").is_file()


def test_a_query_file_without_apis_is_an_error_that_says_what_to_pass(tmp_path):
    """Before: '3 of 3 queries offer no documented API', advice to build deeper trees, exit 0 with 0 trees."""
    path = tmp_path / "open.json"
    path.write_text(json.dumps([{"query_id": i, "query": f"weather {i}?"} for i in (1, 2, 3)]))
    with pytest.raises(CodetoolError, match="3 of 3 queries .* offer no documented API.*pass the APIs with --tools"):
        build_trees_command(_cfg(path, tmp_path))
    with pytest.raises(CodetoolError, match="this is a RestGPT queries file"):
        build_trees_command(_cfg(LIBRARY / "queries.json", tmp_path))
    assert not (tmp_path / "trees.jsonl").exists()


def test_the_tools_setting_leaves_the_tree_hash_of_earlier_runs(tmp_path):
    from codetool.config import config_hash
    from codetool.tree.config import tree_hash

    plain = _cfg(LIBRARY / "queries.json", tmp_path)
    with_spec = _cfg(LIBRARY / "queries.json", tmp_path, tools=str(LIBRARY / "openapi.json"))
    ignored = ("output", "dataset_dir", "shard", "merge", "limit", "batch_trees", "policy_max_batch_size",
               "retry_failed", "force_resume", "relabel", "ray", "cluster", "policy_client", "max_memory_mb", "never_train_on", "tools",
               "distinct_draws")
    assert tree_hash(plain) == config_hash(plain, ignore=ignored)  # unset: hashed as before the settings existed
    assert tree_hash(plain) != tree_hash(with_spec)
    assert tree_hash(plain) != tree_hash(_cfg(LIBRARY / "queries.json", tmp_path, distinct_draws=2))
