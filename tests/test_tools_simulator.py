"""The deterministic simulator: template_response sketches, truncated sketches, OpenAPI examples."""

from __future__ import annotations

import json

from codetool.tools import APISpec, SimulatorBackend, load_restbench, load_stabletoolbench
from codetool.tools.simulator import parse_template, repair_truncated_json, schema_to_template

SKETCH = {"date": "str", "count": "int", "score": "float", "ok": "bool", "none": "NoneType",
          "line_up": [{"link": "str", "name": "str", "_list_length": 2}],
          "posters": ["list of str with length 8"], "empty": "empty list",
          "nested": {"deep": [{"n": "int", "_list_length": 3}]}}


def _api(template, **kwargs) -> APISpec:
    return APISpec("Data", "TheClique", "Songkick concert", template_response=template, **kwargs)


def test_template_types_nesting_and_lengths():
    body = SimulatorBackend().simulate(_api(SKETCH), {"id_conc": "x"})
    assert isinstance(body["date"], str) and isinstance(body["count"], int) and isinstance(body["score"], float)
    assert isinstance(body["ok"], bool) and body["none"] is None and body["empty"] == []
    assert len(body["line_up"]) == 2 and set(body["line_up"][0]) == {"link", "name"}
    assert len(body["posters"]) == 8 and all(isinstance(p, str) for p in body["posters"])
    assert len(body["nested"]["deep"]) == 3 and isinstance(body["nested"]["deep"][0]["n"], int)
    assert "_list_length" not in json.dumps(body)


def test_same_call_same_answer_and_argument_order_does_not_matter():
    sim, api = SimulatorBackend(), _api(SKETCH)
    a = sim.call(api, {"a": 1, "b": "x"})
    b = sim.call(api, {"b": "x", "a": "1"})
    assert a.ok and a.simulated and a.source == "simulator"
    assert a.content == b.content
    assert sim.call(api, {"a": 2, "b": "x"}).content != a.content
    assert SimulatorBackend(seed=1).call(api, {"a": 1, "b": "x"}).content != a.content


def test_arguments_are_echoed_into_matching_fields_outside_lists():
    sketch = {"symbol": "str", "price": "float", "peers": [{"symbol": "str", "_list_length": 3}]}
    body = SimulatorBackend().simulate(_api(sketch), {"symbol": "AAPL"})
    assert body["symbol"] == "AAPL"
    assert all(peer["symbol"] != "AAPL" for peer in body["peers"])


def test_list_length_is_capped():
    body = SimulatorBackend(max_list_length=5).simulate(_api({"xs": ["list of float with length 252"]}), {})
    assert len(body["xs"]) == 5


def test_no_template_gives_generic_answer():
    body = SimulatorBackend().simulate(_api(None), {"q": "paris"})
    assert body["api"] == "Songkick concert" and body["input"] == {"q": "paris"} and isinstance(body["result"], str)


def test_truncated_template_is_repaired():
    text = '{"a": "str", "b": [{"c": "int", "d": {"e": "bo'
    assert repair_truncated_json(text) == {"a": "str", "b": [{"c": "int", "d": {}}]}
    assert repair_truncated_json('{"a": "str", "b"') == {"a": "str"}
    assert repair_truncated_json('{"a": ["list of str with length 2"], "b": [{"x": "int", "_list_len') == {
        "a": ["list of str with length 2"], "b": [{"x": "int"}]}
    assert repair_truncated_json("not json") is None
    assert parse_template("plain words") == "plain words"


def test_every_real_truncated_template_parses(shared_data):
    import glob

    count = 0
    for file in glob.glob(str(shared_data / "StableToolBench/solvable_queries/test_instruction/*.json")):
        for query in json.load(open(file)):
            for entry in query["api_list"]:
                if isinstance(entry.get("template_response"), str):
                    assert isinstance(parse_template(entry["template_response"]), (dict, list))
                    count += 1
    assert count == 230


def test_schema_to_template():
    schema = {"type": "object", "properties": {"id": {"type": "integer"},
                                               "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}},
                                               "tags": {"type": "array", "items": {"type": "string"}}}}
    assert schema_to_template(schema) == {"id": "int", "items": [{"n": "str", "_list_length": 2}],
                                          "tags": ["list of str with length 2"]}


def test_openapi_examples_are_answered(shared_data):
    apis = load_restbench(shared_data)[0].apis
    credits = next(a for a in apis if a.api == "GET /movie/{movie_id}/credits")
    response = SimulatorBackend().call(credits, {"movie_id": 550})
    assert response.ok and response.simulated
    assert json.loads(response.content) == credits.example_response


def test_every_g1_instruction_api_is_callable_deterministically(shared_data):
    sim = SimulatorBackend()
    apis = [api for query in load_stabletoolbench("G1_instruction", shared_data) for api in query.apis]
    assert len(apis) > 700
    for api in apis:
        arguments = {p.name: p.default if p.default not in (None, "") else "x" for p in api.required}
        first, second = sim.call(api, arguments), sim.call(api, dict(reversed(list(arguments.items()))))
        assert first.ok and first.simulated, (api.tool, api.api, first.error)
        assert first.content == second.content
        json.loads(first.content)


def test_malformed_sketch_is_an_error_response_not_an_exception():
    response = SimulatorBackend().call(_api({"xs": [{"_list_length": "many"}]}), {})
    assert response.status == "error" and "simulator failed" in response.error
