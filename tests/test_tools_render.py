"""Function names (ToolBench convention, 64 characters, collisions) and Python stubs for prompts."""

from __future__ import annotations

import ast
import keyword

from codetool.tools import (
    STABLETOOLBENCH_GROUPS,
    APISpec,
    Parameter,
    load_restbench,
    load_stabletoolbench,
    render_tools,
)
from codetool.tools.names import (
    assign_function_names,
    canonical_arguments,
    change_name,
    python_parameters,
    standardize,
    standardize_category,
)
from codetool.tools.render import render_function, sketch_response


def test_toolbench_standardize_rules():
    assert standardize("Songkick concert") == "songkick_concert"
    assert standardize("10000+ Anime Quotes With Pagination Support") == "get_10000_anime_quotes_with_pagination_support"
    assert standardize("  👋 Demo Project_v2 ") == "demo_project_v2"
    assert standardize("a^b") == "a^b"  # ToolBench's regex quirk, kept so cache paths match
    assert change_name("id") == "is_id" and change_name("ids") == "ids"
    assert standardize_category("News, Media") == "News_Media"
    assert standardize_category("Video, Images") == "Video_Images"


def test_function_names_follow_toolbench():
    apis = [APISpec("Data", "TheClique", "Songkick concert"), APISpec("Data", "TheClique", "id")]
    assign_function_names(apis)
    assert [a.name for a in apis] == ["songkick_concert_for_theclique", "is_id_for_theclique"]


def test_name_collision_distinct_stable_names():
    """Field case name-collision: cleaned names that collide or exceed 64 characters."""
    long_tool = "168predict VIP Football Predictions"
    apis = [APISpec("Sports", long_tool, f"Today VIP {kind}") for kind in
            ("Over 2.5 Goals", "Over 1.5 Goals", "BTTS/Goal Goal")]
    apis += [APISpec("Tools", "Weather", "get-forecast"), APISpec("Tools", "Weather", "Get Forecast"),
             APISpec("Tools", "Weather", "get forecast!")]
    assign_function_names(apis)
    names = [a.name for a in apis]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 64 and n.isidentifier() and not keyword.iskeyword(n) for n in names)
    assert all(n.endswith("_for_weather") or n.endswith("_for_weather_2") or n.endswith("_for_weather_3")
               for n in names[3:])
    # Stable: the same APIs in another order get the same names.
    shuffled = [APISpec(a.category, a.tool, a.api) for a in reversed(apis)]
    assign_function_names(shuffled)
    assert {(a.tool, a.api): a.name for a in shuffled} == {(a.tool, a.api): a.name for a in apis}


def test_real_collisions_in_stabletoolbench_are_resolved(shared_data):
    collided = 0
    for group in STABLETOOLBENCH_GROUPS:
        for query in load_stabletoolbench(group, shared_data):
            assign_function_names(query.apis)
            names = [a.name for a in query.apis]
            assert len(set(names)) == len(names)
            assert all(len(n) <= 64 and n.isidentifier() for n in names)
            collided += any(n.endswith("_2") for n in names)
    assert collided >= 4  # the four queries whose last-64-character names collide


def test_reserved_names_are_avoided():
    apis = [APISpec("Tools", "", "finish"), APISpec("Tools", "x", "give up")]
    assign_function_names(apis)
    assert [a.name for a in apis] == ["finish_for", "give_up_for_x"]


def test_python_parameter_names():
    api = APISpec("T", "t", "a", parameters=[
        Parameter("from", required=True), Parameter("accept-language"), Parameter("domain[id]"),
        Parameter("id", required=True), Parameter("id"), Parameter("2fa")])
    names = list(python_parameters(api))
    assert names == ["from_", "id", "accept_language", "domain_id", "id_2", "fa"]
    assert all(n.isidentifier() and not keyword.iskeyword(n) for n in names)


def test_canonical_arguments():
    assert canonical_arguments({"a": 1, "b": "x"}) == canonical_arguments({"b": "x", "a": "1"})
    assert canonical_arguments({"a": True}) == canonical_arguments({"a": "true"})
    assert canonical_arguments({"a": 1.0}) == canonical_arguments({"a": "1"})
    assert canonical_arguments({"zip": "01234"}) != canonical_arguments({"zip": 1234})
    assert canonical_arguments({"a": "x"}) != canonical_arguments({"a": "X"})


def test_rendered_stub_content(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    text = render_tools(query.apis)
    ast.parse(text)
    first = text.split("\n\n\n")[0]
    assert first.startswith("def songkick_concert_for_theclique(id_conc: str) -> dict:")
    assert "Concert info" in first and "Tool: TheClique (category Data)" in first
    assert "id_conc (str, required): Example: '40698227-lumineers-at-aware-super-theatre'." in first
    assert '"line_up": [{"link": str, "name": str}, ...]' in first
    assert text.rstrip().endswith('say why."""')
    assert "def finish(answer: str) -> None:" in text and "def give_up(reason: str) -> None:" in text


def test_optional_parameters_show_defaults(shared_data):
    apis = load_restbench(shared_data)[0].apis
    search = next(a for a in apis if a.api == "GET /search/movie")
    assign_function_names(apis)
    stub = render_function(search)
    assert stub.startswith("def get_search_movie_for_tmdb(query: str, page: int | None = 1, "
                           "include_adult: bool | None = False, region: str | None = None")
    assert "Endpoint: GET /search/movie" in stub


def test_every_benchmark_rendering_is_valid_python(shared_data):
    for group in STABLETOOLBENCH_GROUPS:
        for query in load_stabletoolbench(group, shared_data):
            ast.parse(render_tools(query.apis))
    ast.parse(render_tools(load_restbench(shared_data)[0].apis))


def test_docstring_cannot_be_broken_by_descriptions():
    api = APISpec("T", "t", "a", description='Ends with triple quotes """ and a backslash \\',
                  parameters=[Parameter("q", required=True, description='"""oops"""')])
    ast.parse(render_tools([api]))


def test_sketch_response():
    sketch = {"name": "str", "items": [{"id": "int", "_list_length": 3}], "tags": ["list of str with length 2"],
              "none": "NoneType", "empty": "empty list"}
    assert sketch_response(sketch) == '{"name": str, "items": [{"id": int}, ...], "tags": [str, ...], "none": None, "empty": []}'
    assert len(sketch_response({f"k{i}": "str" for i in range(200)}, limit=50)) == 50


def test_compact_and_brief_styles_parse_and_shrink_in_order(shared_data):
    apis = load_restbench(shared_data)[0].apis  # the 54 TMDB operations
    full, compact, brief = (render_tools(apis, style) for style in ("full", "compact", "brief"))
    for text in (full, compact, brief):
        ast.parse(text)
    assert len(brief) < len(compact) / 1.5 < len(full) / 1.5
    lines = [line for line in brief.splitlines() if line.startswith("def ") and "_for_tmdb(" in line]
    assert len(lines) == 54  # one line per operation
    assert all(len(line.split("# ", 1)[1]) <= 60 for line in lines)
    assert "def finish(answer: str)" in brief and "def give_up(reason: str)" in brief
