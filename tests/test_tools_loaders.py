"""Loaders: StableToolBench/ToolBench query files, tool files, OpenAPI specs, RestBench, data_root."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.tools import (
    STABLETOOLBENCH_GROUPS,
    load_openapi,
    load_restbench,
    load_stabletoolbench,
    load_toolbench_queries,
    load_toolbench_tool_file,
    missing_report,
)
from codetool.tools.data import MARKER, data_root
from codetool.tools.loaders import RESTBENCH_SHUFFLE_SEED  # noqa: F401  (documented constant)

GROUP_SIZES = {"G1_instruction": 163, "G1_category": 153, "G1_tool": 158, "G2_instruction": 106,
               "G2_category": 124, "G3_instruction": 61}
CODETOOL_SIZES = {"G1_instruction": 131, "G1_category": 122, "G1_tool": 118, "G2_instruction": 92,
                  "G2_category": 100, "G3_instruction": 17}


def test_every_stabletoolbench_query_loads(shared_data):
    counts = {g: len(load_stabletoolbench(g, shared_data)) for g in STABLETOOLBENCH_GROUPS}
    assert counts == GROUP_SIZES
    assert sum(counts.values()) == 765
    codetool = {g: len(load_stabletoolbench(g, shared_data, subset="codetool")) for g in STABLETOOLBENCH_GROUPS}
    assert codetool == CODETOOL_SIZES and sum(codetool.values()) == 580


def test_stabletoolbench_query_fields(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    assert query.query_id == "588" and query.benchmark == "stabletoolbench" and query.group == "G1_instruction"
    assert query.relevant_apis == [("TheClique", "Transfermarkt search"), ("TheClique", "Transfermarkt details")]
    api = query.apis[0]
    assert (api.category, api.tool, api.api, api.method) == ("Data", "TheClique", "Songkick concert", "GET")
    assert api.parameters[0].name == "id_conc" and api.parameters[0].required
    assert api.parameters[0].default == "40698227-lumineers-at-aware-super-theatre"
    assert api.template_response["line_up"] == [{"link": "str", "name": "str", "_list_length": 2}]
    assert not query.extra  # nothing missing


def test_parameter_types_are_normalised(shared_data):
    types = {p.type for g in STABLETOOLBENCH_GROUPS for q in load_stabletoolbench(g, shared_data)
             for a in q.apis for p in a.parameters}
    assert types <= {"string", "integer", "number", "boolean", "array", "object"}
    assert {"string", "number", "boolean"} <= types


def test_truncated_template_text_is_parsed(shared_data):
    apis = [a for g in STABLETOOLBENCH_GROUPS for q in load_stabletoolbench(g, shared_data) for a in q.apis]
    assert not any(isinstance(a.template_response, str) for a in apis)  # the 230 cut-off JSON texts are repaired
    assert sum(a.template_response is not None for a in apis) == 2748


def test_unknown_group_and_subset_are_user_errors(shared_data):
    with pytest.raises(CodetoolError, match="G1_instruction"):
        load_stabletoolbench("G4", shared_data)
    with pytest.raises(CodetoolError, match="full"):
        load_stabletoolbench("G1_tool", shared_data, subset="half")
    with pytest.raises(CodetoolError, match="codetool data fetch"):
        load_stabletoolbench("G1_tool", shared_data / "nowhere")


def test_toolbench_example_folder_loads(shared_data):
    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction")
    # G1/G2/G3 queries have full api_lists; the two inference demos list names only (and no tools folder).
    by_group = {}
    for q in queries:
        by_group.setdefault(q.group, []).append(q)
    assert {g: len(v) for g, v in by_group.items()} == {
        "G1_query": 5, "G2_query": 3, "G3_query": 2, "inference_query_demo": 1, "inference_query_demo_open_domain": 1}
    demo = by_group["inference_query_demo"][0]
    assert demo.apis == [] and demo.extra["missing_apis"] == [
        ("Olato Quotes", "Love Quote"), ("Olato Quotes", "Success Quote"), ("Olato Quotes", "Motivation Quote")]
    report = missing_report(queries)
    assert report["queries_with_missing_apis"] == 1 and report["queries_without_any_api"] == 2  # + the open-domain demo
    assert report["missing_apis"] == 3 and report["missing_tools"] == ["Olato Quotes"]


def _tool_file(tmp_path):
    folder = tmp_path / "tools" / "Social"
    folder.mkdir(parents=True)
    (folder / "olato_quotes.json").write_text(json.dumps({
        "tool_name": "Olato Quotes", "tool_description": "Quotes of all kinds.",
        "api_list": [{"name": "Love Quote", "url": "https://olato-quotes.p.rapidapi.com/love",
                      "description": "Random love quote", "method": "GET", "required_parameters": [],
                      "optional_parameters": [{"name": "quotes", "type": "STRING", "description": "", "default": "random"}]}],
    }))
    return tmp_path / "tools"


def test_name_only_queries_resolve_against_tool_files(shared_data, tmp_path):
    tools = _tool_file(tmp_path)
    [query] = load_toolbench_queries(shared_data / "ToolBench/data_example/instruction/inference_query_demo.json",
                                     tools_dir=tools)
    [api] = query.apis
    assert (api.category, api.tool, api.api, api.url) == ("Social", "Olato Quotes", "Love Quote",
                                                          "https://olato-quotes.p.rapidapi.com/love")
    assert api.tool_description == "Quotes of all kinds." and api.parameters[0].default == "random"
    # The tool file documents only one of the three APIs: the others are listed, not dropped.
    assert query.extra["missing_apis"] == [("Olato Quotes", "Success Quote"), ("Olato Quotes", "Motivation Quote")]


def test_tool_file_loader(tmp_path):
    [api] = load_toolbench_tool_file(_tool_file(tmp_path) / "Social" / "olato_quotes.json")
    assert api.category == "Social" and api.optional[0].name == "quotes" and api.required == []


def test_openapi_tmdb_spec(shared_data):
    apis = load_openapi(shared_data / "RestGPT" / "specs" / "tmdb_oas.json", tool="tmdb")
    assert len(apis) == 54 and all(a.method == "GET" and a.example_response is not None for a in apis)
    by_name = {a.api: a for a in apis}
    credits = by_name["GET /movie/{movie_id}/credits"]
    assert credits.url == "https://api.themoviedb.org/3/movie/{movie_id}/credits"
    [movie_id] = [p for p in credits.parameters if p.location == "path"]
    assert (movie_id.name, movie_id.type, movie_id.required) == ("movie_id", "integer", True)
    search = by_name["GET /search/movie"]
    assert [p.name for p in search.required] == ["query"]
    assert {p.name: p.default for p in search.optional}["page"] == 1
    trending = by_name["GET /trending/{media_type}/{time_window}"]
    assert {p.name: p.enum for p in trending.parameters} == {"media_type": ["all", "movie", "tv", "person"],
                                                            "time_window": ["day", "week"]}


def test_openapi_codetool_flat_spec(shared_data):
    apis = load_openapi(shared_data / "CodeTool" / "infer" / "tmdb" / "tmdb.spec.raw.v2.json", tool="tmdb")
    assert len(apis) == 54
    episode = next(a for a in apis if a.path == "/tv/{tv_id}/season/{season_number}/episode/{episode_number}")
    assert [p.name for p in episode.parameters if p.location == "path"] == ["tv_id", "season_number", "episode_number"]


def test_openapi_rejects_other_documents(tmp_path):
    path = tmp_path / "swagger.json"
    path.write_text(json.dumps({"swagger": "2.0", "paths": {}}))
    with pytest.raises(CodetoolError, match="Swagger 2.0"):
        load_openapi(path)


def test_restbench_restgpt(shared_data):
    """Field case restbench-gold-spaces: the loader keeps gold paths raw (evaluation normalises)."""
    queries = load_restbench(shared_data, source="restgpt")
    assert len(queries) == 100 and {len(q.apis) for q in queries} == {54}
    assert queries[0].gold_path == ["GET /search/person", "GET /person/{person_id}/movie_credits"]
    assert queries[0].query_id == "q0" and queries[0].benchmark == "restbench"
    # Gold paths stay raw (stray spaces included); evaluation normalises them.
    raw = [step for q in queries for step in q.gold_path]
    assert " GET /movie/popular" in raw and "GET /search/movie " in raw
    assert queries[0].apis[0] is not queries[1].apis[0]  # per-query copies


def test_restbench_codetool_candidates(shared_data):
    """Field case restbench-gold-first: candidates listed gold-first are shuffled with a fixed seed."""
    queries = load_restbench(shared_data, source="codetool")
    assert len(queries) == 100 and {len(q.apis) for q in queries} == {20}
    gold_first = sum([a.api for a in q.apis[: len(q.gold_path)]] == q.gold_path for q in queries)
    assert gold_first <= 10  # in the file it is 100 of 100
    assert queries[0].gold_path == ["GET /search/person", "GET /person/{person_id}/movie_credits"]
    assert queries[0].extra["solution"] == ["GET_search_person", "GET_person_person_id_movie_credits"]
    assert all(set(q.gold_path) <= {a.api for a in q.apis} for q in queries)
    again = load_restbench(shared_data, source="codetool")
    assert [[a.api for a in q.apis] for q in queries] == [[a.api for a in q.apis] for q in again]


def test_data_root_prefers_fetched_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CODETOOL_DATA", str(tmp_path / "env"))
    (tmp_path / "env").mkdir()
    assert data_root() == tmp_path / "env"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / MARKER).write_text("{}")
    assert data_root().resolve() == (tmp_path / "data").resolve()


def test_data_root_error_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CODETOOL_DATA", str(tmp_path / "absent"))
    with pytest.raises(CodetoolError, match="CODETOOL_DATA"):
        data_root()
