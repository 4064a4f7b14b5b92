"""The one loader of query and tool files (issue 40): ToolBench files, RestGPT's layout (a query
file + an OpenAPI spec), tool files; a file of the wrong kind is named for what it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codetool import CodetoolError
from codetool.tools.files import file_kind, load_queries, load_tools
from codetool.tools.openapi import load_openapi, spec_bool

LIBRARY = Path(__file__).resolve().parents[1] / "examples" / "library"
SPEC, QUERIES = LIBRARY / "openapi.json", LIBRARY / "queries.json"


def test_file_kinds():
    assert file_kind({"openapi": "3.0.0", "paths": {}}) == "openapi"
    assert file_kind({"swagger": "2.0", "paths": {}}) == "swagger"
    assert file_kind([{"query": "q", "query_id": 1, "api_list": []}]) == "toolbench-queries"
    assert file_kind([{"query": "q", "solution": ["GET /a"]}]) == "restgpt-queries"
    assert file_kind([{"query": "q"}]) == "restgpt-queries"  # no ids, no APIs: RestGPT's layout
    assert file_kind([{"query": "q", "query_id": 3}]) == "open-domain-queries"  # ToolBench's retrieval demo
    assert file_kind([{"tool_name": "t", "api_name": "a"}]) == "api-list"
    assert file_kind({"tool_name": "t", "api_list": []}) == "toolbench-tool"
    assert file_kind([]) == "empty" and file_kind(3) == "unknown"


def test_restgpt_layout_gives_every_query_every_operation():
    queries = load_queries(QUERIES, SPEC)
    assert [q.query_id for q in queries] == ["q0", "q1", "q2", "q3"]
    assert {q.benchmark for q in queries} == {"custom"} and {q.group for q in queries} == {"queries"}
    assert [a.api for a in queries[0].apis] == ["GET /books", "GET /books/{book_id}", "GET /members/{member_id}/loans",
                                               "GET /loans", "POST /loans", "DELETE /loans/{loan_id}"]
    assert queries[3].gold_path == ["GET /books", "POST /loans"]
    assert queries[0].apis is not queries[1].apis and queries[0].apis[0] is not queries[1].apis[0]


def test_ids_from_the_file_are_kept(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"id": "a1", "query": "one?"}, {"query": "two?"}]))
    assert [q.query_id for q in load_queries(path, SPEC)] == ["a1", "q1"]


def test_a_restgpt_query_file_without_its_spec_is_named(shared_data):
    """Before: read as ToolBench queries, '1 query ids occur more than once: <api>/ (57x)'."""
    with pytest.raises(CodetoolError, match=r"this is a RestGPT queries file \(100 .*--tools spec.json"):
        load_queries(shared_data / "RestGPT" / "datasets" / "tmdb.json")


def test_files_of_the_wrong_kind_are_named():
    with pytest.raises(CodetoolError, match="is an OpenAPI 3 spec, not a query file; pass it as --tools"):
        load_queries(SPEC)
    with pytest.raises(CodetoolError, match="is a RestGPT-layout query file .* with 4 entries, not a tool description"):
        load_tools(QUERIES)


def test_toolbench_queries_with_a_spec_are_refused(shared_data):
    with pytest.raises(CodetoolError, match="each query brings its own APIs"):
        load_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json", SPEC)


def test_a_toolbench_query_file_as_tools_is_refused_unless_it_holds_one_query(shared_data, tmp_path):
    path = shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json"
    with pytest.raises(CodetoolError, match="ToolBench/StableToolBench query file .* with 5 entries"):
        load_tools(path)
    one = tmp_path / "one.json"
    one.write_text(json.dumps(json.loads(path.read_text())[:1]))
    assert load_tools(one)


def test_the_toolbench_example_folder_still_loads(shared_data):
    queries = load_queries(shared_data / "ToolBench" / "data_example" / "instruction")
    assert len(queries) == 12 and sum(1 for q in queries if not q.apis) == 2


def test_string_flags_mean_what_they_say():
    """Before: ``bool("false")`` made every optional parameter of RestGPT's specs required."""
    assert [spec_bool(v) for v in ("false", "False", " no", "0", "", None, False)] == [False] * 7
    assert [spec_bool(v) for v in ("true", "True", "yes", "1", True)] == [True] * 5
    books = {a.api: a for a in load_openapi(SPEC)}["GET /books"]
    assert [(p.name, p.required) for p in books.parameters] == [("q", True), ("available", False), ("limit", False)]


def test_yaml_specs_load(tmp_path):
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(json.loads(SPEC.read_text()), sort_keys=False))
    assert [a.api for a in load_tools(path)] == [a.api for a in load_tools(SPEC)]


def test_swagger_2_is_named(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"swagger": "2.0", "paths": {}}))
    with pytest.raises(CodetoolError, match="Swagger 2.0 spec; convert it to OpenAPI 3"):
        load_tools(path)
