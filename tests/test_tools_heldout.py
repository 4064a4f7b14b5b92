"""No test query in any training data (issue 38): one filter, by id and by text, for build-trees,
train-prm and train-policy, and the count it dropped in each summary."""

from __future__ import annotations

import json
import re

import pytest

import codetool.assemble as assemble
from codetool import CodetoolError
from codetool.commands.build_trees import build_trees_command
from codetool.config import load_config
from codetool.jsonl import read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.tools.heldout import HeldOut, held_out_of, id_family, load_held_out, normalised
from codetool.tools.loaders import load_stabletoolbench
from codetool.tree.config import TreeConfig

API = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
       "required_parameters": [], "optional_parameters": [], "method": "GET"}


@pytest.fixture(scope="module")
def test_query(shared_data):
    """A StableToolBench G1_instruction test query, as ToolBench's G1_query.json holds it."""
    return load_stabletoolbench("G1_instruction", shared_data, subset="full")[0]


def training_file(tmp_path, test_query):
    """A ToolBench-format training file: the test query copied under another id, another query under
    the test query's id, and a clean query."""
    path = tmp_path / "G1_query.json"
    path.write_text(json.dumps([
        {"query_id": 900001, "query": test_query.query.upper() + "  ", "api_list": [API]},   # its text
        {"query_id": int(test_query.query_id), "query": "Another wording entirely.", "api_list": [API]},  # its id
        {"query_id": 900002, "query": "What is the weather in Oslo tomorrow?", "api_list": [API]}]))
    return path


def test_the_named_sets_hold_the_test_queries(shared_data, test_query):
    held = load_held_out(["stabletoolbench"], shared_data)
    assert ("toolbench:G1", test_query.query_id) in held.ids and normalised(test_query.query) in held.texts
    assert len({q for f, q in held.ids if f == "toolbench:G1"}) >= 163 and len(held.names) == 6
    tmdb = load_held_out(["restbench-tmdb:0-9"], shared_data)
    assert len(tmdb.ids) == 10 and ("restbench", "q9") in tmdb.ids and ("restbench", "q10") not in tmdb.ids
    with pytest.raises(CodetoolError, match="unknown held-out set"):
        load_held_out(["toolbench"], shared_data)
    with pytest.raises(CodetoolError, match="codetool data fetch"):
        load_held_out(["stabletoolbench"], shared_data / "nowhere")


def test_ids_match_within_their_family_and_texts_anywhere():
    assert id_family("toolbench", "G1_query") == id_family("stabletoolbench", "G1_tool") == "toolbench:G1"
    assert id_family("toolbench", "G2_query") != "toolbench:G1" and id_family("toolbench", "demo") is None
    held = HeldOut(frozenset({("toolbench:G1", "588")}), frozenset({normalised("Hello, World!")}))
    assert held.reason("G1_query/588", "x", "toolbench:G1") == "id"
    assert held.reason("588", "x", "toolbench:G2") is None  # G2's 588 is another query
    assert held.reason("7", "hello world", None) == "text"
    kept, dropped = held.split_rows([{"query_id": "G1_query/588", "query": "a"}, {"query_id": "G2_query/588",
                                     "query": "a"}, {"query_id": "x/1", "query": "HELLO   world"}])
    assert [r["query_id"] for r in kept] == ["G2_query/588"] and len(dropped) == 2


def test_build_trees_refuses_test_queries_and_counts_them(monkeypatch, shared_data, test_query, tmp_path, capsys):
    path = training_file(tmp_path, test_query)
    count = [0]

    def reply(prompt):  # siblings alternate: one runs, one raises (executability labels every pair)
        count[0] += 1
        return "print('looked it up')\n```" if count[0] % 2 else "raise KeyError('no such field')\n```"

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: ScriptedBackend(reply))
    base = {"queries": str(path), "output": str(tmp_path / "trees.jsonl"), "dataset_dir": str(tmp_path / "prm"),
            "branching": 2, "max_depth": 1, "executor.isolation": "fallback"}
    # trees built without the filter (an older run) hold the two test queries ...
    assert build_trees_command(load_config(TreeConfig, overrides={**base, "never_train_on": []})) == 0
    assert len(list(read_jsonl(tmp_path / "trees.jsonl"))) == 3
    before = {r["query_id"] for r in read_jsonl(tmp_path / "prm" / "prm_examples.jsonl")}
    assert len(before) == 3
    # ... the default builds nothing new for them, and the export leaves their trees out
    assert build_trees_command(load_config(TreeConfig, overrides=base)) == 0
    assert re.search(r"test queries dropped\s*│\s*2\s", capsys.readouterr().out)
    summary = json.loads((tmp_path / "prm" / "summary.json").read_text())
    assert summary["test_queries_dropped"] == 2
    rows = list(read_jsonl(tmp_path / "prm" / "prm_examples.jsonl"))
    assert {r["query_id"] for r in rows} == {"G1_query/900002"}


def test_train_prm_and_train_policy_drop_them_too(shared_data, test_query, tmp_path):
    from codetool.policy.config import TrainPolicyConfig
    from codetool.policy.data import training_queries
    from codetool.prm.config import PRMConfig

    assert PRMConfig().never_train_on == ["stabletoolbench", "restbench-tmdb"]  # build_trainer filters by it
    path = training_file(tmp_path, test_query)
    cfg = load_config(TrainPolicyConfig, None, {"data_dir": str(shared_data), "evals": [], "never_train_on": [],
                                                "prompts": [{"benchmark": "toolbench", "queries": str(path)}]})
    kept = training_queries(cfg)
    assert [q.query for q in kept] == ["What is the weather in Oslo tomorrow?"] and kept.dropped == 2
    # an evaluation set given as loaded queries holds them by id and text as well
    evals = held_out_of(load_stabletoolbench("G1_instruction", shared_data, subset="full"), "evals")
    assert evals.split([test_query]) == ([], [test_query])


def test_train_prm_drops_the_rows_of_a_training_file_that_hold_a_test_query(tiny_model_dir, shared_data, test_query,
                                                                             tmp_path, monkeypatch):
    from codetool.jsonl import write_jsonl
    from codetool.prm.synthetic import synthetic_rows
    from codetool.prm.trainer import PRMConfig, build_trainer

    monkeypatch.setenv("CODETOOL_DATA", str(shared_data))  # where train-prm finds the test sets' ids and texts
    rows = synthetic_rows(4, steps=1, candidates=2, extra_tools=0)  # 4 queries x 2 sibling rows
    for row in rows:
        if row["query_id"] == "synthetic-0":  # the test query's id, as build-trees writes a G1_query.json id
            row["query_id"] = f"G1_query/{test_query.query_id}"
        elif row["query_id"] == "synthetic-1":  # its text, spaced and cased otherwise
            row["query"] = f"  {test_query.query.upper()} "
    path = tmp_path / "prm.jsonl"
    write_jsonl(path, rows)
    cfg = load_config(PRMConfig, None, {"model": str(tiny_model_dir), "dataset": [str(path)], "eval_fraction": 0.0,
                                        "output_dir": str(tmp_path / "out"), "format.max_length": 384,
                                        "format.max_suffix_length": 128, "max_steps": 1, "resume": "none"})
    trainer = build_trainer(cfg)
    assert (trainer.prm_meta["test_rows_dropped"], trainer.prm_meta["test_queries_dropped"]) == (4, 2)
    assert len(trainer.train_dataset) == 4  # the rows of synthetic-2 and synthetic-3
    # a file of test queries only trains nothing, and says so in one line
    write_jsonl(path, [r for r in rows if r["query_id"] != "synthetic-2" and r["query_id"] != "synthetic-3"])
    with pytest.raises(CodetoolError, match="belongs to a test query"):
        build_trainer(cfg)


def test_without_any_benchmark_data_nothing_is_held_out_and_the_sets_are_named_unchecked(monkeypatch, caplog):
    """A fresh clone training on its own API's queries has no benchmark data: the filter cannot run,
    keeps everything, warns, and names the sets it could not check (summaries carry them)."""
    import logging

    import codetool.tools.data as data

    def no_data():
        raise CodetoolError("no benchmark data found")

    monkeypatch.setattr(data, "data_root", no_data)
    with caplog.at_level(logging.WARNING, logger="codetool.tools.heldout"):
        held = load_held_out(["stabletoolbench", "restbench-tmdb:0-9"])
    assert held.unchecked == ("stabletoolbench", "restbench-tmdb:0-9") and not held.ids and not held.texts
    assert "not checked" in caplog.text and "codetool data fetch" in caplog.text
    with pytest.raises(CodetoolError, match="unknown held-out set"):
        load_held_out(["toolbench"])  # a wrong name is still an error, data or not


def test_a_data_folder_without_the_set_s_files_still_refuses(tmp_path):

    with pytest.raises(CodetoolError, match="is missing"):
        load_held_out(["restbench-tmdb"], data_dir=tmp_path)


def test_a_query_file_of_test_queries_only_is_refused_saying_so(shared_data, test_query, tmp_path):
    path = tmp_path / "G1_query.json"
    path.write_text(json.dumps([{"query_id": int(test_query.query_id), "query": test_query.query, "api_list": [API]}]))
    cfg = load_config(TreeConfig, overrides={"queries": str(path), "output": str(tmp_path / "trees.jsonl"),
                                             "dataset_dir": str(tmp_path / "prm"), "executor.isolation": "fallback"})
    with pytest.raises(CodetoolError, match=r"all 1 queries .* are test queries of stabletoolbench.*never_train_on"):
        build_trees_command(cfg)
