"""The HTTP clients (``codetool.tools.clients``) against a real loopback server that misbehaves:
HTML 500s, non-JSON, 10 MB, hangs, dead APIs, flaky servers; path parameters that try to reach
another path; a dead server falling back, and real answers written through to the cache."""

import asyncio
import json
import socket
import time

import pytest

from codetool.serving import serve_in_background
from codetool.tools import (
    APISpec,
    CacheBackend,
    FallbackBackend,
    HTTPBackend,
    Parameter,
    SimulatorBackend,
    StableToolBenchClient,
    ToolEnvironment,
)
from codetool.tools.spec import CALL_DEADLINE, remaining_s

HUGE_BYTES = 10 * 1024 * 1024


def _fault_app():
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

    app = FastAPI()
    state = {"flaky": 0, "dead": 0, "down": 0, "received": []}
    huge = json.dumps({"data": "x" * (HUGE_BYTES - 12)}).encode()

    @app.get("/html500")
    async def html500():
        return HTMLResponse("<html><body><h1>500 Internal Server Error</h1><p>" + "x" * 5000 + "</p></body></html>",
                            status_code=500)

    @app.get("/nonjson")
    async def nonjson():
        return PlainTextResponse("OK but not json <br>")

    @app.get("/huge")
    async def huge_body():
        return Response(huge, media_type="application/json")

    @app.get("/slow")
    async def slow():
        await asyncio.sleep(3)
        return {"late": True}

    @app.get("/items/{item_id}")
    async def item(item_id: str, request: Request):
        return {"item_id": item_id, "query": dict(request.query_params),
                "auth": request.headers.get("authorization", "")}

    @app.post("/virtual-ok")
    async def virtual_ok(request: Request):
        body = await request.json()
        state["received"].append({"body": body, "header": request.headers.get("toolbench_key")})
        return {"error": "", "response": json.dumps({"echo": body["tool_input"]})}

    @app.post("/virtual-apierror")
    async def virtual_apierror():
        return {"error": "Rate limit exceeded for this API", "response": ""}

    @app.post("/virtual-dead")
    async def virtual_dead():
        state["dead"] += 1
        return JSONResponse({"message": "API doesn't exists"}, status_code=500)

    @app.post("/virtual-slow")
    async def virtual_slow():
        await asyncio.sleep(3)
        return {"error": "", "response": "late"}

    @app.post("/virtual-busy")
    async def virtual_busy():
        return JSONResponse({"message": "too many requests"}, status_code=429)

    @app.post("/virtual-down")
    async def virtual_down():
        state["down"] += 1
        return JSONResponse({"message": "bad gateway"}, status_code=502)

    @app.post("/virtual-flaky")
    async def virtual_flaky():
        state["flaky"] += 1
        if state["flaky"] == 1:
            return JSONResponse({"message": "busy"}, status_code=503)
        return {"error": "", "response": "fine"}

    return app, state


@pytest.fixture(scope="module")
def fault_server():
    app, state = _fault_app()
    with serve_in_background(app) as url:
        yield url, state


API = APISpec("Data", "TheClique", "Songkick concert", parameters=[Parameter("id_conc", required=True)])


def _http_api(path: str) -> APISpec:
    return APISpec("openapi", "faults", f"GET {path}", path=path, parameters=[
        Parameter("item_id", location="path", required=True), Parameter("q")])


def _env(url: str, path: str, **http_options) -> tuple[ToolEnvironment, object]:
    env = ToolEnvironment([_http_api(path)], HTTPBackend(url, token_env=None, **http_options))
    return env, next(iter(env.functions().values()))


def test_http_500_html_is_a_structured_error(fault_server):
    """Field case http-500-html: a structured tool error, not a crash."""
    url, _ = fault_server
    env, function = _env(url, "/html500")
    response = function(item_id="1")
    assert response.status == "http_error" and response.http_status == 500
    assert not response.outage  # the API answered these arguments: the model sees it
    assert response.error == "HTTP 500 from the API (an HTML error page)"
    assert env.summary()["errors"] == {"http_error": 1}


def test_non_json_body_comes_back_as_text(fault_server):
    """Field case non-json: the code receives the raw text."""
    url, _ = fault_server
    _, function = _env(url, "/nonjson")
    response = function("1")
    assert response.ok and response.content == "OK but not json <br>"


def test_huge_body_is_truncated_with_a_marker(fault_server):
    """Field case huge-body: the model sees a capped observation with a marker; the full body is
    kept only when configured."""
    url, _ = fault_server
    env = ToolEnvironment([_http_api("/huge")], HTTPBackend(url, token_env=None), max_response_chars=1000,
                          keep_full_responses=True)
    response = env.functions()[env.apis[0].name](item_id="1")
    assert response.ok and response.truncated
    assert response.content.endswith(f"...[truncated: showing 1000 of {HUGE_BYTES} characters]")
    assert len(response.content) < 1100
    assert len(env.calls[0].full_content) == HUGE_BYTES and env.summary()["truncated"] == 1
    lean = ToolEnvironment([_http_api("/huge")], HTTPBackend(url, token_env=None), max_response_chars=1000)
    lean.functions()[lean.apis[0].name](item_id="1")
    assert lean.calls[0].full_content is None and lean.calls[0].content_chars == HUGE_BYTES


def test_backend_reads_at_most_max_body_bytes(fault_server):
    url, _ = fault_server
    cut = HTTPBackend(url, token_env=None, max_body_bytes=1_000_000).call(_http_api("/huge"), {})
    assert cut.ok and cut.truncated and len(cut.content) == 1_000_000


def test_slow_tool_times_out(fault_server):
    """Field case slow-tool: a timeout status (the sandbox proxy raises it as an exception)."""
    url, _ = fault_server
    _, function = _env(url, "/slow", timeout_s=0.5)
    response = function(item_id="1")
    assert response.status == "timeout" and "0.5 s" in response.error  # the tool limit fired (it sleeps 3 s)
    assert response.outage  # no answer: the service's failure (the executor charges the machine)


def test_connection_refused_is_an_error_response():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    response = HTTPBackend(f"http://127.0.0.1:{port}", token_env=None, timeout_s=2).call(_http_api("/x"), {})
    assert response.status == "error" and "request failed" in response.error and response.outage


def test_a_request_the_arguments_broke_is_no_outage(fault_server):
    """A header value with a line break (a header parameter the model filled) never leaves the
    client: an ``error`` the model can fix, not an outage it could provoke to have its step left
    out of the rewards."""
    url, _ = fault_server
    api = APISpec("openapi", "faults", "GET /items/{item_id}", path="/items/{item_id}", parameters=[
        Parameter("item_id", location="path", required=True), Parameter("x_tag", location="header")])
    response = HTTPBackend(url, token_env=None).call(api, {"item_id": "1", "x_tag": "a\r\nHost: evil"})
    assert response.status == "error" and not response.outage


def test_a_request_the_arguments_broke_is_not_retried(fault_server, monkeypatch):
    """A lone surrogate cannot be encoded: the request never leaves, nothing is retried (red team:
    each retry's backoff was tool time given back to the step), and it is no outage."""
    waits = []
    monkeypatch.setattr("codetool.tools.clients.time.sleep", waits.append)
    url, _ = fault_server
    response = StableToolBenchClient(url + "/virtual-ok").call(API, {"id_conc": "\ud800"})
    assert response.status == "error" and not response.outage and waits == []


def test_an_http_429_is_retried_and_no_outage(fault_server, monkeypatch):
    """The callers' own rate brought it (a policy could call until it came, to have a failing step
    dropped as the machine's): retried with backoff, then the model's to see."""
    waits = []
    monkeypatch.setattr("codetool.tools.clients.time.sleep", waits.append)
    url, _ = fault_server
    response = StableToolBenchClient(url + "/virtual-busy", retries=2, backoff_s=0.01).call(API, {"id_conc": "x"})
    assert response.http_status == 429 and not response.outage and len(waits) == 2


def test_the_callers_deadline_bounds_every_wait_and_leaves_the_fallback_time(fault_server):
    """Under ``CALL_DEADLINE`` (set by the executor's proxy) a server slower than the deadline is
    given up in time and the chain's simulator answers (red team: the client waited 60 s x 3 while
    the proxy gave the call 15 s, so the step met an outage the fallback would have answered)."""
    url, _ = fault_server
    chain = FallbackBackend([StableToolBenchClient(url + "/virtual-slow"), SimulatorBackend()])
    token = CALL_DEADLINE.set(time.monotonic() + 0.5)
    try:
        response = chain.call(API, {"id_conc": "x"})
    finally:
        CALL_DEADLINE.reset(token)
    assert response.ok and response.source == "simulator" and response.fallbacks[0].startswith("server: timeout")
    assert remaining_s(60) == 60  # no deadline outside a call


def test_a_gateway_failure_after_the_retries_is_an_outage(fault_server):
    url, state = fault_server
    response = StableToolBenchClient(url + "/virtual-down", retries=1, backoff_s=0.01).call(API, {"id_conc": "x"})
    assert response.status == "http_error" and response.http_status == 502 and response.outage
    assert state["down"] == 2  # retried once first


def test_http_backend_builds_path_query_and_bearer(fault_server, monkeypatch):
    url, _ = fault_server
    monkeypatch.setenv("TEST_TMDB_TOKEN", "tok-123456")
    response = HTTPBackend(url, token_env="TEST_TMDB_TOKEN").call(_http_api("/items/{item_id}"),
                                                                  {"item_id": "a b", "q": 3})
    assert response.ok, response.error
    body = json.loads(response.content)
    assert body["item_id"] == "a b" and body["query"] == {"q": "3"} and body["auth"] == "Bearer [REDACTED]"
    assert "tok-123456" not in response.content  # the echoed token is redacted


def test_http_backend_reports_unfillable_url():
    response = HTTPBackend("http://127.0.0.1:9", token_env=None).call(_http_api("/items/{item_id}"), {})
    assert response.status == "invalid_arguments" and "{item_id}" in response.error


def test_stabletoolbench_payload_fields():
    client = StableToolBenchClient("http://127.0.0.1:9/virtual")
    payload = client.payload(APISpec("Video_Images", "👋 Demo Project_v2", "Get Product"), {"id": 1})
    assert payload == {"category": "Video_Images", "tool_name": "demo_project_v2", "api_name": "get_product",
                       "tool_input": '{"id": 1}', "strip": "truncate"}


def test_stabletoolbench_client_sends_key_from_env(fault_server, monkeypatch):
    url, state = fault_server
    monkeypatch.setenv("TOOLBENCH_KEY", "tb-key-998877")
    response = StableToolBenchClient(url + "/virtual-ok").call(API, {"id_conc": "abc"})
    assert response.ok and response.source == "server"
    assert json.loads(response.content) == {"echo": '{"id_conc": "abc"}'}
    sent = state["received"][-1]
    assert sent["body"]["toolbench_key"] == "tb-key-998877" and sent["header"] == "tb-key-998877"
    assert set(sent["body"]) == {"category", "tool_name", "api_name", "tool_input", "strip", "toolbench_key"}


def test_stabletoolbench_client_retries_transient_errors(fault_server):
    url, _ = fault_server
    response = StableToolBenchClient(url + "/virtual-flaky", backoff_s=0.01).call(API, {"id_conc": "x"})
    assert response.ok and response.content == "fine"


def test_stabletoolbench_api_error(fault_server):
    url, _ = fault_server
    response = StableToolBenchClient(url + "/virtual-apierror").call(API, {"id_conc": "x"})
    assert response.status == "api_error" and response.error == "Rate limit exceeded for this API"


def test_dead_api_500_falls_back_and_is_recorded(fault_server):
    """Field case dead-api-500: falls back to the simulator; the fallback is recorded."""
    url, state = fault_server
    server = StableToolBenchClient(url + "/virtual-dead", retries=2, backoff_s=5)  # 500 is not retried
    env = ToolEnvironment([API], FallbackBackend([server, SimulatorBackend()]))
    before = state["dead"]
    response = env.functions()["songkick_concert_for_theclique"](id_conc="x")
    assert state["dead"] - before == 1  # asked once: no retry, no backoff wait
    assert response.ok and response.simulated and response.source == "simulator"
    assert response.fallbacks == ["server: http_error: HTTP 500: API doesn't exists"]
    assert env.calls[0].fallbacks == response.fallbacks
    summary = env.summary()
    assert summary["fallbacks_used"] == 1 and summary["fallbacks_by_backend"] == {"server": 1}


def test_write_through_records_real_answers_in_stabletoolbench_layout(fault_server, tmp_path):
    url, _ = fault_server
    cache = CacheBackend(tmp_path)
    chain = FallbackBackend([cache, StableToolBenchClient(url + "/virtual-ok"), SimulatorBackend()], cache=cache)
    first = chain.call(API, {"id_conc": "42"})
    assert first.source == "server" and first.fallbacks[0].startswith("cache: not_found")
    on_disk = json.loads(cache.path_for(API).read_text())
    assert on_disk == {"{'id_conc': '42'}": {"error": "", "response": first.content}}
    replay = FallbackBackend([CacheBackend(tmp_path), SimulatorBackend()]).call(API, {"id_conc": 42})
    assert replay.source == "cache" and replay.content == first.content and not replay.fallbacks


@pytest.mark.parametrize("value", ["..", ".", "../account", "a/b", "..\\account", "x\n", ""])
def test_a_path_parameter_cannot_reach_another_path_of_the_api_host(value, monkeypatch):
    """Issue 27: ``..`` as a path parameter sent the host's token-carrying request to another path
    of the API host; now a value is checked against the parameter's declared type, and dot
    segments, slashes and control characters are refused before any request is made."""
    import httpx

    seen = []
    client = httpx.Client(transport=httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200)))
    monkeypatch.setenv("TEST_TMDB_TOKEN", "tok-123456")
    backend = HTTPBackend("https://api.example", token_env="TEST_TMDB_TOKEN", client=client)
    response = backend.call(_http_api("/movie/{item_id}/credits"), {"item_id": value})
    assert response.status == "invalid_arguments" and "item_id" in response.error and seen == []
    typed = APISpec("openapi", "tmdb", "GET /movie/{movie_id}", path="/movie/{movie_id}",
                    parameters=[Parameter("movie_id", type="integer", location="path", required=True)])
    assert backend.call(typed, {"movie_id": "12 OR 1"}).status == "invalid_arguments"
    assert backend.call(typed, {"movie_id": 603}).ok and str(seen[-1].url) == "https://api.example/movie/603"
