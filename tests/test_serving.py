"""The one server guard (codetool.serving) run as the same table against every codetool server:
the PRM server (with a stub scorer), the TMDB mock and the StableToolBench mock."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time

import httpx
import pytest

from codetool import CodetoolError
from codetool.commands.serve_mock import ServeMockConfig, serve_mock
from codetool.commands.serve_prm import ServePRMConfig, serve_prm
from codetool.prm.server import create_app
from codetool.serving import (
    ServerGuard,
    check_bind,
    is_loopback,
    json_depth_exceeds,
    serve_in_background,
)
from codetool.tools.mock_servers import build_stabletoolbench_app, build_tmdb_app, guard
from codetool.tools.spec import APISpec, Parameter

KEY = "guard-key-123456"
LIMIT = 2_000  # max_body_bytes of every server in the table


class StubScorer:
    def score(self, items):
        return [0.5] * len(items)


MOVIE = APISpec(category="openapi", tool="tmdb", api="GET /movie/{movie_id}", path="/movie/{movie_id}",
                parameters=[Parameter(name="movie_id", type="integer", required=True, location="path")],
                example_response={"id": 1, "title": "x"})
CONCERT = APISpec(category="Data", tool="theclique", api="songkick_concert")

# name -> (build(api_key, read_timeout_s), error field, a request that answers 200, the POST path)
SERVERS = {
    "prm": (lambda key, read_s: create_app(StubScorer(), api_key=key, max_body_bytes=LIMIT, read_timeout_s=read_s),
            "error", ("GET", "/openapi.json"), "/score"),  # /health is 503 until the workers start
    "tmdb": (lambda key, read_s: build_tmdb_app([MOVIE], api_key=key, max_body_bytes=LIMIT, timeout_s=read_s),
             "detail", ("GET", "/movie/550"), "/movie/550"),
    "stabletoolbench": (lambda key, read_s: build_stabletoolbench_app([CONCERT], api_key=key, max_body_bytes=LIMIT,
                                                                      timeout_s=read_s),
                        "detail", ("GET", "/health"), "/virtual"),
}


def call(app, method: str, path: str, headers: dict[str, str] | None = None, chunks: tuple[bytes, ...] = (b"",),
         stall: bool = False) -> tuple[int, dict]:
    """One request straight through ASGI: ``chunks`` are the body messages; with ``stall`` the
    client then sends nothing more. Returns the status and the JSON body."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    messages = [{"type": "http.request", "body": c, "more_body": stall or i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(30)  # a silent client (or one waiting for the answer)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body or b"null")


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


DEEP = b"[" * 500 + b"]" * 500
# (case, api_key, request: (method or None for the ok request, headers, chunks, stall), status, error text)
TABLE = [
    ("no key sent", KEY, (None, {}, (b"",), False), 401, "missing or wrong bearer token"),
    ("wrong key", KEY, (None, auth("wrong-key-000"), (b"",), False), 401, "missing or wrong bearer token"),
    ("key of another scheme", KEY, (None, {"Authorization": f"Basic {KEY}"}, (b"",), False), 401, "bearer"),
    ("right key", KEY, (None, auth(), (b"",), False), 200, None),
    ("right key, lowercase scheme", KEY, (None, {"Authorization": f"bearer {KEY}"}, (b"",), False), 200, None),
    ("no key configured", None, (None, {}, (b"",), False), 200, None),
    ("declared body over the limit", KEY, ("POST", {**auth(), "Content-Length": str(LIMIT + 1)}, (b"",), False),
     413, f"body of {LIMIT + 1} bytes; the limit is {LIMIT}"),
    ("body over the limit while read", KEY, ("POST", auth(), (b"x" * 1500, b"x" * 1500), False), 413,
     f"the limit is {LIMIT}"),
    ("chunked body", KEY, ("POST", {**auth(), "Transfer-Encoding": "chunked"}, (b"{}",), False), 411,
     "Content-Length header is required"),
    ("bad Content-Length", KEY, ("POST", {**auth(), "Content-Length": "12abc"}, (b"",), False), 400,
     "invalid Content-Length"),
    ("slow body", KEY, ("POST", {**auth(), "Content-Length": "100"}, (b'{"items"',), True), 408,
     "request body not received within 0.3 s"),
    ("deep JSON", KEY, ("POST", {**auth(), "Content-Length": str(len(DEEP))}, (DEEP,), False), 400,
     "JSON nested too deeply; the limit is 100 levels"),
]


@pytest.mark.parametrize("server", sorted(SERVERS))
@pytest.mark.parametrize("case, key, request_, status, error", TABLE, ids=[row[0] for row in TABLE])
def test_guard_table(server, case, key, request_, status, error):
    build, field, ok, post_path = SERVERS[server]
    method, headers, chunks, stall = request_
    app = build(key, 0.3)
    assert isinstance(app, ServerGuard)
    if method is None:
        method, path = ok
    else:
        path = post_path
    got_status, body = call(app, method, path, headers, chunks, stall)
    assert got_status == status, (case, body)
    if error is not None:
        assert set(body) == {field} and error in body[field] and "\n" not in body[field], body


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_brackets_inside_json_strings_do_not_count(server):
    build, field, _, post_path = SERVERS[server]
    body = json.dumps({"items": [{"query": "[" * 500}], "tool_name": "{" * 500, "api_name": "x"}).encode()
    with serve_in_background(build(None, 5.0)) as url:  # a real server: the PRM's batcher runs
        response = httpx.post(url + post_path, content=body, timeout=10)
    assert "nested too deeply" not in response.text and response.status_code < 500


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_public_bind_without_key_is_refused_and_loopback_variants_serve(server):
    build = SERVERS[server][0]
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        with pytest.raises(CodetoolError, match="needs an API key"):
            with serve_in_background(build(None, 5.0), host=host):
                pass
    with serve_in_background(build(None, 5.0), host="127.0.0.2") as url:  # all of 127.0.0.0/8 is loopback
        method, path = SERVERS[server][2]
        assert httpx.request(method, url + path, timeout=10).status_code == 200


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_slow_body_on_a_real_socket_gets_408(server):
    build, field, _, post_path = SERVERS[server]
    with serve_in_background(build(KEY, 0.3), header_timeout_s=2.0) as url:
        host, port = url[len("http://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as slow:
            slow.sendall(f"POST {post_path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
            reply = _read_response(slow)
    assert b" 408 " in reply.split(b"\r\n")[0]
    assert f'"{field}"'.encode() in reply


def _read_response(sock: socket.socket) -> bytes:
    """Head and body of one HTTP response (they may come in separate packets)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("127.255.255.254", True), ("localhost", True), ("LocalHost", True),
    ("::1", True), ("[::1]", True), ("::ffff:127.0.0.1", True), (" 127.0.0.1 ", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("192.168.1.2", False), ("128.0.0.1", False),
    ("::ffff:10.0.0.1", False), ("example.com", False), ("localhost.example.com", False), ("", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_check_bind_needs_a_non_blank_key_off_loopback():
    check_bind("127.0.0.3", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", KEY)
    for key in (None, "", "   "):
        with pytest.raises(CodetoolError, match="MY_KEY"):
            check_bind("0.0.0.0", key, what="serve-x", api_key_env="MY_KEY")
    with pytest.raises(CodetoolError, match="blank"):
        ServerGuard(lambda *a: None, api_key="  ")


def test_both_commands_check_the_bind_the_same_way(monkeypatch):
    monkeypatch.delenv("CODETOOL_PRM_API_KEY", raising=False)
    monkeypatch.delenv("CODETOOL_MOCK_API_KEY", raising=False)
    with pytest.raises(CodetoolError, match="serve-prm on :: needs an API key.*CODETOOL_PRM_API_KEY"):
        serve_prm(ServePRMConfig(host="::"))
    with pytest.raises(CodetoolError, match="serve-mock tmdb on 0.0.0.0 needs an API key.*CODETOOL_MOCK_API_KEY"):
        serve_mock(ServeMockConfig(kind="tmdb", host="0.0.0.0"))
    # 127.0.0.2 is loopback: serve-prm gets past the bind check to its next one
    with pytest.raises(CodetoolError, match="checkpoint folder"):
        serve_prm(ServePRMConfig(host="127.0.0.2", prm="http://elsewhere:1"))
    monkeypatch.setenv("CODETOOL_PRM_API_KEY", "  ")
    with pytest.raises(CodetoolError, match="empty or whitespace"):
        serve_prm(ServePRMConfig(host="0.0.0.0"))


def test_stuck_or_broken_apps_get_one_line_504_and_500():
    async def stuck(scope, receive, send):
        await asyncio.sleep(5)

    async def broken(scope, receive, send):
        raise RuntimeError("secret internals\nsecond line")

    assert call(guard(stuck, timeout_s=0.2), "GET", "/") == (504, {"detail": "request took longer than 0.2 s"})
    assert call(ServerGuard(broken), "GET", "/") == (500, {"error": "internal error (RuntimeError); see the server log"})


def test_prm_guard_deadline_is_a_backstop_behind_the_scoring_budget():
    app = create_app(StubScorer(), request_timeout_s=0.5)
    assert app.request_timeout_s == pytest.approx(5.5) and app.read_timeout_s == 30.0


def test_json_depth_counts_brackets_outside_strings_only():
    assert not json_depth_exceeds(b"[" * 100 + b"]" * 100, 100)
    assert json_depth_exceeds(b"[" * 101 + b"]" * 101, 100)
    assert json_depth_exceeds(b'{"a": ' * 101 + b"1" + b"}" * 101, 100)
    assert not json_depth_exceeds(b'["' + b"[" * 300 + b'"]', 100)
    assert not json_depth_exceeds(b'["\\"' + b"[" * 300 + b'"]', 100)  # an escaped quote stays in the string


# ------------------------------------------------------------------------------- issue 27
def test_the_json_depth_check_is_linear():
    """A 64 KB body of escaped quotes took the old regex scan ~20 s (quadratic, holding the GIL);
    these 4 MB bodies would take it hours. Run in a child process so that a regression cannot
    freeze the test session; its time limit only stops such a freeze (the linear scan takes well
    under a second; ``benchmarks/bench_timings.py`` times it)."""
    import subprocess
    import sys

    code = ("from codetool.serving import json_depth_exceeds as f\n"
            "bodies = [b'\"' + b'\\\\\"' * 2_000_000, b'\"' * 4_000_000, b'[\"\\\\\\\\' * 1_000_000,"
            " b'[]' * 2_000_000, b'[' * 2_000_000]\n"
            "print([f(b, 100) for b in bodies])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "[False, False, True, False, True]", out.stdout + out.stderr


def _server(app, **kwargs):
    return serve_in_background(app, **kwargs)


def _held(url: str, n: int, source: str, data: bytes = b"") -> list[socket.socket]:
    host, port = url[len("http://"):].split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), source_address=(source, 0), timeout=5)
        if data:
            s.sendall(data)
        socks.append(s)
    return socks


def test_stalled_uploads_cannot_hold_unbounded_memory():
    """Issue 27: 150 stalled uploads held 614 MB. Now a body is read only once its declared size
    fits the client's and the server's budgets; the others wait unread (and get 503 after the
    read timeout), and another client is served meanwhile."""
    app = ServerGuard(build_tmdb_app([MOVIE]).app, max_body_bytes=1_000_000, max_inflight_bytes=4_000_000,
                      read_timeout_s=5.0)
    head = b"POST /movie/550 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000
    with _server(app) as url:
        held = _held(url, 12, "127.0.0.2", head)
        try:
            while app._inflight == 0:  # the first uploads reserved their room
                time.sleep(0.01)
            assert 0 < app._inflight <= 2_000_000  # two bodies of 1 MB for this address prefix, at most
            ok = httpx.post(f"{url}/movie/550", content=b"{}", timeout=60)  # a small body: no room needed
            waiting = [s for s in held if not select.select([s], [], [], 0)[0]]
            assert ok.status_code == 405 and len(waiting) >= 10  # served while the uploads still wait, unread
            busy = 0
            for s in held:
                s.settimeout(60)
                try:
                    reply = s.recv(200).split(b"\r\n")[0]
                    busy += b" 503 " in reply or b" 408 " in reply
                except TimeoutError:
                    pass
            assert busy >= 10
        finally:
            for s in held:
                s.close()


def test_a_trickled_request_head_is_closed_at_the_header_deadline():
    app = build_tmdb_app([MOVIE])
    with _server(app, header_timeout_s=1.0) as url:
        [s] = _held(url, 1, "127.0.0.1", b"GET /movie/550 HTTP/1.1\r\n")
        closed = False
        try:
            for i in range(12):  # one header line every 0.25 s: each byte used to restart the timer
                time.sleep(0.25)
                try:
                    s.sendall(f"X-Trickle-{i}: {i}\r\n".encode())
                except OSError:
                    closed = True
                    break
            if not closed:
                s.settimeout(30)  # a cap on the wait (the server closes it at 1 s, or never without the fix)
                closed = s.recv(100) == b""
        except OSError:
            closed = True
        finally:
            s.close()
        assert closed  # within the trickle (12 lines, 3 s) of a 1 s deadline: each byte used to restart it


def test_several_keys_are_one_client_each():
    """Issue 39: with one key per client (comma-separated), a client is its key, whatever
    connection it uses; a key of the list opens the door, any other does not."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope.get("codetool.client"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    guard = ServerGuard(app, api_key="key-one-111, key-two-222")
    assert call(guard, "GET", "/", auth("key-two-222"))[0] == 200
    assert call(guard, "GET", "/", auth("key-one-111"))[0] == 200
    assert call(guard, "GET", "/", auth("key-one-111,key-two-222"))[0] == 401
    assert seen == ["key:1", "key:0"]
    single = ServerGuard(app, api_key=KEY)  # one shared key: clients are their connections
    assert call(single, "GET", "/", auth())[0] == 200 and seen[-1] == "conn:127.0.0.1:5000"
    with pytest.raises(CodetoolError, match="blank"):
        ServerGuard(app, api_key="key-one-111,,key-two")
