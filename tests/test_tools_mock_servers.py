"""The TMDB mock and the StableToolBench-compatible server: through httpx's ASGI transport, plus
one real loopback socket; the request guard (key, body limit, timeout, one-line errors)."""

import asyncio
import json
import re

import httpx
import pytest

from codetool.serving import serve_in_background
from codetool.tools import (
    APISpec,
    StableToolBenchClient,
    ToolEnvironment,
    load_openapi,
    load_stabletoolbench,
    make_tool_backend,
)
from codetool.tools.mock_servers import build_stabletoolbench_app, build_tmdb_app, guard

# Sensible values for every path template of the TMDB spec (and the gold paths' one wrong template).
PATH_VALUES = {"movie_id": "550", "person_id": "287", "tv_id": "1399", "season_number": "1", "episode_number": "1",
               "collection_id": "10", "company_id": "1", "network_id": "213", "credit_id": "52fe4250c3a36847f8014a11",
               "review_id": "58aa82f09251416f92006a3a", "media_type": "movie", "time_window": "day",
               "keyword_id": "180547", "list_id": "1"}


def _fill(path: str) -> str:
    return re.sub(r"{([^{}]+)}", lambda m: PATH_VALUES[m.group(1)], path)


def _get_all(app, requests: list[tuple[str, dict]], headers: dict | None = None) -> list[httpx.Response]:
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://mock", headers=headers) as client:
            return [await client.get(path, params=params) for path, params in requests]

    return asyncio.run(run())


def _post(app, path: str, **kwargs) -> httpx.Response:
    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mock") as client:
            return await client.post(path, **kwargs)

    return asyncio.run(run())


@pytest.fixture(scope="module")
def tmdb_app(shared_data):
    return build_tmdb_app(load_openapi(shared_data / "RestGPT/specs/tmdb_oas.json", tool="tmdb"))


@pytest.fixture(scope="module")
def tmdb_apis(shared_data):
    return load_openapi(shared_data / "RestGPT/specs/tmdb_oas.json", tool="tmdb")


def _required_query(api: APISpec) -> dict:
    return {p.name: "test" for p in api.parameters if p.location == "query" and p.required}


def test_tmdb_mock_answers_all_54_operations(tmdb_app, tmdb_apis):
    assert len(tmdb_apis) == 54
    responses = _get_all(tmdb_app, [(_fill(a.path), _required_query(a)) for a in tmdb_apis])
    assert [r.status_code for r in responses] == [200] * 54
    for api, response in zip(tmdb_apis, responses):
        body = response.json()
        if api.path.count("{") != 1 or not isinstance(body, dict) or "id" not in body:
            assert body == api.example_response


def test_tmdb_mock_answers_every_gold_path(tmdb_app, shared_data, tmdb_apis):
    rows = json.loads((shared_data / "RestGPT/datasets/tmdb.json").read_text())
    gold = sorted({" ".join(step.split()) for row in rows for step in row["solution"]})
    required = {a.path: _required_query(a) for a in tmdb_apis}
    requests = []
    for step in gold:
        method, path = step.split(" ", 1)
        assert method == "GET"
        template = path.replace("/person/{movie_id}/", "/person/{person_id}/")  # the one wrong template
        requests.append((_fill(path), required.get(template, {})))
    responses = _get_all(tmdb_app, requests)
    assert {step: r.status_code for step, r in zip(gold, responses)} == {step: 200 for step in gold}
    assert len(gold) == 47


def test_tmdb_mock_respects_path_parameters(tmdb_app):
    ok, prefixed, other_id, bad_type, bad_enum, unknown, search = _get_all(tmdb_app, [
        ("/movie/550/credits", {}), ("/3/movie/550/credits", {}), ("/movie/13/credits", {}),
        ("/movie/fight-club/credits", {}), ("/trending/planets/day", {}), ("/no/such/path", {}),
        ("/search/movie", {})])
    assert ok.status_code == prefixed.status_code == 200 and ok.json() == prefixed.json()
    assert other_id.json()["id"] == 13 and ok.json()["id"] == 550
    for response in (bad_type, bad_enum, unknown):
        assert response.status_code == 404 and response.json()["status_code"] == 34
    assert search.status_code == 422 and search.json()["detail"] == "query must be provided"
    assert _post(tmdb_app, "/movie/550").status_code == 405


def test_tmdb_mock_through_http_backend_on_a_real_socket(tmdb_app, tmdb_apis):
    """One real-socket test: the mock on 127.0.0.1 behind the 'mock-tmdb' backend."""
    with serve_in_background(tmdb_app) as url:
        port = int(url.rsplit(":", 1)[1])
        env = ToolEnvironment([a for a in tmdb_apis if a.api in ("GET /search/person",
                                                                  "GET /person/{person_id}/movie_credits")],
                              make_tool_backend("mock-tmdb", port=port))
        functions = env.functions()
        people = functions["get_search_person_for_tmdb"](query="Sofia Coppola")
        assert people.ok and people.source == "http" and json.loads(people.content)["results"]
        credits = functions["get_person_person_id_movie_credits_for_tmdb"](person_id=1769)
        assert credits.ok and json.loads(credits.content)["id"] == 1769


@pytest.fixture(scope="module")
def stb_apis(shared_data):
    return [a for q in load_stabletoolbench("G1_instruction", shared_data)[:5] for a in q.apis]


def test_stabletoolbench_server_request_format(stb_apis):
    app = build_stabletoolbench_app(stb_apis)
    body = {"category": "Data", "tool_name": "theclique", "api_name": "songkick_concert",
            "tool_input": '{"id_conc": "x"}', "strip": "truncate", "toolbench_key": ""}
    as_text = _post(app, "/virtual", json=body).json()
    as_object = _post(app, "/virtual", json=dict(body, tool_input={"id_conc": "x"})).json()
    assert as_text == as_object
    assert as_text["error"] == "" and as_text["simulated"] is True and as_text["source"] == "simulator"
    assert set(json.loads(as_text["response"])) == {"date", "image", "line_up", "location", "name", "venue_name",
                                                    "venue_url", "website"}
    # Raw names and function-style names reach the same API.
    raw = _post(app, "/virtual", json=dict(body, tool_name="TheClique", api_name="Songkick concert")).json()
    function_style = _post(app, "/virtual", json=dict(body, tool_name="theclique_for_data",
                                                      api_name="songkick_concert_for_theclique")).json()
    assert raw["response"] == function_style["response"] == as_text["response"]
    unknown = _post(app, "/virtual", json=dict(body, tool_name="nothing", api_name="nowhere")).json()
    assert unknown["error"] == "" and json.loads(unknown["response"])["api"] == "nowhere"


def test_stabletoolbench_server_replays_the_cache_first(stb_apis, tmp_path):
    folder = tmp_path / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    (folder / "songkick_concert.json").write_text(json.dumps({str({"id_conc": "x"}): {"error": "", "response": "real"}}))
    app = build_stabletoolbench_app(stb_apis, cache_dir=tmp_path)
    body = {"category": "Data", "tool_name": "theclique", "api_name": "songkick_concert", "tool_input": {"id_conc": "x"}}
    answer = _post(app, "/virtual", json=body).json()
    assert answer == {"error": "", "response": "real", "simulated": False, "source": "cache"}


def test_stabletoolbench_server_rejects_malformed_requests(stb_apis):
    app = build_stabletoolbench_app(stb_apis, api_key=None, max_body_bytes=10_000, timeout_s=5)
    cases = {
        "bad json": (_post(app, "/virtual", content=b"{nope"), 400, "request body is not valid JSON"),
        "not object": (_post(app, "/virtual", json=[1]), 400, "request body must be a JSON object"),
        "no tool": (_post(app, "/virtual", json={"api_name": "x"}), 422, "field 'tool_name' is required (text)"),
        "too big": (_post(app, "/virtual", content=b"x" * 20_000), 413, "body of 20000 bytes; the limit is 10000"),
        "wrong method": (_get_all(app, [("/virtual", {})])[0], 405, None),
    }
    for name, (response, status, detail) in cases.items():
        assert response.status_code == status, name
        if detail:
            assert response.json()["detail"] == detail, name
        assert "Traceback" not in response.text and "\n" not in response.text.strip(), name
    in_band = _post(app, "/virtual", json={"tool_name": "a", "api_name": "b", "tool_input": "{not json"}).json()
    assert in_band["error"].startswith("Tool input parse error")  # StableToolBench answers these in-band


def test_stabletoolbench_client_against_the_served_mock(stb_apis):
    """A real loopback round trip: our client, our server, the simulator behind it."""
    with serve_in_background(build_stabletoolbench_app(stb_apis, api_key=None,
                                          max_body_bytes=100_000, timeout_s=10)) as url:
        response = StableToolBenchClient(url + "/virtual").call(stb_apis[0], {"id_conc": "x"})
    assert response.ok and response.simulated and json.loads(response.content)["line_up"]


def test_guard_requires_the_key_when_set(stb_apis):
    app = build_stabletoolbench_app(stb_apis, api_key="mock-key-123456", max_body_bytes=10_000,
                       timeout_s=5)
    assert _get_all(app, [("/health", {})])[0].status_code == 401
    assert _get_all(app, [("/health", {})], headers={"Authorization": "Bearer wrong"})[0].status_code == 401
    assert _get_all(app, [("/health", {})], headers={"Authorization": "Bearer mock-key-123456"})[0].status_code == 200
    assert _get_all(app, [("/health", {})], headers={"toolbench_key": "mock-key-123456"})[0].status_code == 200


def test_guard_time_limit_and_internal_errors():
    async def slow_app(scope, receive, send):
        await asyncio.sleep(2)

    async def broken_app(scope, receive, send):
        raise RuntimeError("secret internals")

    slow = _get_all(guard(slow_app, api_key=None, max_body_bytes=100, timeout_s=0.2), [("/", {})])[0]
    assert slow.status_code == 504 and slow.json() == {"detail": "request took longer than 0.2 s"}
    broken = _get_all(guard(broken_app, api_key=None, max_body_bytes=100, timeout_s=1), [("/", {})])[0]
    assert broken.status_code == 500 and broken.json() == {"detail": "internal error (RuntimeError); see the server log"}


def _request(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mock") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(run())


def test_an_openapi_mock_answers_every_method_its_spec_declares():
    """Before (issue 40): a POST or DELETE operation got 405 (the first route on the path won)."""
    from pathlib import Path

    from codetool.commands.serve_mock import ServeMockConfig, build_mock_app

    spec = Path(__file__).resolve().parents[1] / "examples" / "library" / "openapi.json"
    app = build_mock_app(ServeMockConfig(kind="openapi", spec=str(spec)))
    loan = _request(app, "POST", "/loans", json={"book_id": 17, "member_id": "m-204"})
    assert loan.status_code == 200 and loan.json()["loan_id"] == 5002
    assert _request(app, "DELETE", "/loans/5001").json() == {"loan_id": 5001, "returned": True}
    assert _request(app, "GET", "/books", params={"q": "Le Guin"}).json()["results"][0]["book_id"] == 17
    assert _request(app, "HEAD", "/books", params={"q": "x"}).status_code == 200
    # required parameters: query ('available' is required: "false", so optional), JSON body
    assert _request(app, "GET", "/books").json()["detail"] == "q must be provided"
    missing = _request(app, "POST", "/loans", json={"book_id": 17})
    assert missing.status_code == 422 and missing.json()["detail"] == "member_id must be provided"
    assert _request(app, "POST", "/loans", content=b"{not json").status_code == 400
    assert _request(app, "GET", "/loans").json()["loans"][0]["loan_id"] == 5001  # GET and POST on one path
    wrong = _request(app, "PUT", "/loans")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD, POST"
    assert _request(app, "OPTIONS", "/books/3").headers["allow"] == "GET, HEAD"
    assert _request(app, "GET", "/nowhere").status_code == 404
