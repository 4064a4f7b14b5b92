"""ToolEnvironment: host callables (argument checks, never raising, caps), summaries, and the
canary test (no key in prompts, docstrings, responses, records or logs)."""

from __future__ import annotations

import json
import logging

from codetool.commands.serve_mock import ServeMockConfig, build_mock_app
from codetool.serving import serve_in_background
from codetool.tools import (
    APISpec,
    CacheBackend,
    FallbackBackend,
    Parameter,
    SimulatorBackend,
    StableToolBenchClient,
    ToolEnvironment,
    ToolResponse,
    load_restbench,
    load_stabletoolbench,
    load_toolbench_queries,
)

API = APISpec("Finance", "Stocks", "Quote", description="Latest quote of a symbol.",
              parameters=[Parameter("symbol", required=True), Parameter("from", "integer"),
                          Parameter("accept-language")],
              template_response={"symbol": "str", "price": "float"})


def _env(**kwargs) -> ToolEnvironment:
    return ToolEnvironment([API], SimulatorBackend(), **kwargs)


def test_functions_accept_keywords_positionals_and_raw_names():
    env = _env()
    quote = env.functions()["quote_for_stocks"]
    assert quote.__name__ == "quote_for_stocks"
    a = quote(symbol="AAPL", from_=3)
    b = quote("AAPL", 3)
    c = quote(**{"symbol": "AAPL", "from": 3})
    assert a.ok and a.content == b.content == c.content
    assert json.loads(a.content)["symbol"] == "AAPL"
    assert env.calls[0].arguments == {"symbol": "AAPL", "from": 3}  # raw API names go to the backend


def test_invalid_arguments_name_the_parameter():
    quote = _env().functions()["quote_for_stocks"]
    missing = quote(from_=1)
    assert missing.status == "invalid_arguments" and missing.error == "missing required argument 'symbol' for quote_for_stocks()"
    unknown = quote(symbol="A", sybmol="B")
    assert unknown.status == "invalid_arguments" and "unknown argument 'sybmol'" in unknown.error
    assert "expected: symbol, from_, accept_language" in unknown.error
    assert quote("A", 1, "en", "extra").status == "invalid_arguments"
    assert quote("A", symbol="B").status == "invalid_arguments"


def test_none_means_not_sent():
    env = _env()
    env.functions()["quote_for_stocks"](symbol="A", from_=None)
    assert env.calls[0].arguments == {"symbol": "A"}


def test_callables_never_raise():
    class Exploding:
        name = "exploding"

        def call(self, api, arguments):
            raise ValueError("kaboom")

    env = ToolEnvironment([API], Exploding())
    response = env.functions()["quote_for_stocks"](symbol="A")
    assert isinstance(response, ToolResponse) and response.status == "error" and "ValueError" in response.error
    assert env.call("nope").status == "not_found"


def test_render_and_summary():
    env = _env()
    assert env.render().startswith("def quote_for_stocks(symbol: str, from_: int | None = None")
    f = env.functions()["quote_for_stocks"]
    f(symbol="A")
    f()
    summary = env.summary()
    assert summary["calls"] == 2 and summary["ok"] == 1 and summary["errors"] == {"invalid_arguments": 1}
    assert summary["simulated"] == 1 and summary["sources"] == {"simulator": 1, "environment": 1}
    assert summary["missing_apis"] == [] and summary["functions"] == 1


def test_describe_gives_function_schemas():
    env = _env()
    [entry] = env.describe()
    assert entry["name"] == "quote_for_stocks" and (entry["tool"], entry["api"]) == ("Stocks", "Quote")
    assert entry["description"] == ('This is the subfunction for tool "Stocks", you can use this tool. '
                                    'The description of this function is: "Latest quote of a symbol."')
    assert entry["parameters"]["required"] == ["symbol"]
    assert entry["parameters"]["optional"] == ["from_", "accept_language"]
    assert entry["parameters"]["properties"]["from_"]["type"] == "integer"
    assert env.api_for("quote_for_stocks") is env.apis[0] and env.api_for("finish") is None
    json.dumps(entry)


def test_missing_tool_file_is_reported_in_the_summary(shared_data):
    """Field case missing-tool-file: counted and reported in the run summary, never dropped."""
    [query] = load_toolbench_queries(shared_data / "ToolBench/data_example/instruction/inference_query_demo.json")
    env = ToolEnvironment.from_query(query, SimulatorBackend())
    summary = env.summary()
    assert summary["functions"] == 0 and summary["missing_api_count"] == 3
    assert ["Olato Quotes", "Love Quote"] in summary["missing_apis"]


def test_names_come_from_the_query_apis(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    env = ToolEnvironment.from_query(query, SimulatorBackend())
    assert sorted(env.functions()) == sorted(a.name for a in query.apis)
    assert "def transfermarkt_search_for_theclique(name: str)" in env.render()


def test_canary_key_never_leaks(canary_env, shared_data, tmp_path, caplog):
    """A planted key must not reach a prompt, a docstring, a response, a call record or a log line."""
    caplog.set_level(logging.DEBUG, logger="codetool")
    outputs: list[str] = []

    # StableToolBench path: a server that echoes everything it receives (key included).
    stb = build_mock_app(ServeMockConfig(kind="stabletoolbench",
                                         queries=[str(shared_data / "StableToolBench/solvable_queries_example/test_instruction")]))

    class Echo:
        name = "echo"

        def call(self, api, arguments):
            return ToolResponse("ok", content=json.dumps({"you_sent": arguments, "key": canary_env}),
                                error=f"also {canary_env}")

    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    cache = CacheBackend(tmp_path / "cache")
    with serve_in_background(stb) as url:
        server = StableToolBenchClient(url + "/virtual")
        for backend in (FallbackBackend([cache, server, SimulatorBackend()], cache=cache), Echo()):
            env = ToolEnvironment.from_query(query, backend, keep_full_responses=True)
            outputs.append(env.render())
            outputs += [f.__doc__ or "" for f in env.functions().values()] + [json.dumps(env.describe())]
            for name, function in env.functions().items():
                params = env.api_for(name).required
                response = function(**{p.name: canary_env if i == 0 else "x" for i, p in enumerate(params)})
                outputs += [response.content, response.error or "", " ".join(response.fallbacks)]
            outputs += [json.dumps([c.to_dict() for c in env.calls]), json.dumps(env.summary())]
    restbench = ToolEnvironment(load_restbench(shared_data)[0].apis, SimulatorBackend())
    outputs.append(restbench.render())
    outputs += [p.read_text() for p in (tmp_path / "cache").rglob("*.json")]
    outputs += [r.getMessage() for r in caplog.records]
    leaks = [text[:200] for text in outputs if canary_env in text]
    assert not leaks
    assert any("[REDACTED]" in text for text in outputs)  # the echo did try to leak it
