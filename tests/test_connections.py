"""codetool.connections on real loopback sockets (issue 39): a connection over a cap closes the
one that has waited longest for a request (from the largest holder) instead of refusing the
newcomer, so idle keep-alive connections of one process, or heads trickling in from many
addresses, no longer shut another client out; busy connections are never closed."""

from __future__ import annotations

import asyncio
import select
import socket
import threading

import httpx

from codetool.serving import ServerGuard, serve_in_background
from codetool.tools.mock_servers import build_tmdb_app
from codetool.tools.spec import APISpec, Parameter

MOVIE = APISpec(category="openapi", tool="tmdb", api="GET /movie/{movie_id}", path="/movie/{movie_id}",
                parameters=[Parameter(name="movie_id", type="integer", required=True, location="path")],
                example_response={"id": 1, "title": "x"})
REQUEST = b"GET /movie/550 HTTP/1.1\r\nHost: x\r\n\r\n"


def _open(url: str, n: int, source: str, data: bytes = b"") -> list[socket.socket]:
    host, port = url[len("http://"):].split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), source_address=(source, 0), timeout=60)
        if data:
            s.sendall(data)
        socks.append(s)
    return socks


def _read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
            data.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (waits for it: the server closes at once or never here)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _still_open(s: socket.socket) -> bool:
    readable, _, _ = select.select([s], [], [], 0)
    return not readable


def test_idle_connections_of_an_address_make_room_for_its_newcomers():
    """20 connections from one address, cap 5: each newcomer closes the one idle longest; the last
    5 stay open, and another client is served."""
    app = ServerGuard(build_tmdb_app([MOVIE]).app, max_connections_per_client=5)
    with serve_in_background(app, header_timeout_s=120) as url:
        socks = _open(url, 20, "127.0.0.2")
        try:
            assert all(_closed_by_server(s) for s in socks[:15])
            assert all(_still_open(s) for s in socks[15:])
            assert httpx.get(f"{url}/movie/550", timeout=60).status_code == 200
        finally:
            for s in socks:
                s.close()


def test_one_process_s_keep_alive_connections_do_not_shut_out_another_local_client():
    """Issue 39: one local process holding 64 keep-alive connections (the policy client's default)
    made the server refuse another local client (15 of 23 requests) from the same address."""
    app = build_tmdb_app([MOVIE])
    with serve_in_background(app, header_timeout_s=120) as url:
        pool = _open(url, 64, "127.0.0.1", REQUEST)
        try:
            assert all(b" 200 " in _read_response(s).split(b"\r\n")[0] for s in pool)  # now idle, kept alive
            statuses = []
            for _ in range(10):  # a new connection each time, as a fresh client makes
                with httpx.Client(base_url=url, timeout=60) as other:
                    statuses.append(other.get("/movie/550").status_code)
            assert statuses == [200] * 10
        finally:
            for s in pool:
                s.close()


def test_heads_trickling_in_from_many_addresses_do_not_shut_out_another_client():
    """Issue 39: 20 addresses x 60 trickling connections filled the server's 1,000 and made 36 of 39
    requests of another client fail; here 5 addresses x 10 against a limit of 40."""
    app = build_tmdb_app([MOVIE])
    with serve_in_background(app, header_timeout_s=120, limit_concurrency=40) as url:
        socks = [s for a in range(2, 7) for s in _open(url, 10, f"127.0.0.{a}", b"GET /movie/550 HTTP/1.1\r\n")]
        try:
            statuses = []
            for _ in range(10):
                with httpx.Client(base_url=url, timeout=60) as other:
                    statuses.append(other.get("/movie/550").status_code)
            assert statuses == [200] * 10
            assert sum(_still_open(s) for s in socks) < len(socks)  # tricklers made the room
        finally:
            for s in socks:
                s.close()


def test_busy_connections_are_never_closed_for_a_newcomer():
    """With every connection of the address in work, the newcomer is refused (503), not them."""
    release, started = threading.Event(), []

    async def slow(scope, receive, send):
        if scope["type"] != "http":
            return
        started.append(1)
        await asyncio.to_thread(release.wait, 60)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    app = ServerGuard(slow, max_connections_per_client=3)
    with serve_in_background(app, lifespan="off", header_timeout_s=120) as url:
        busy = _open(url, 3, "127.0.0.2", REQUEST)
        try:
            while len(started) < 3:  # all three requests in work
                threading.Event().wait(0.01)
            [late] = _open(url, 1, "127.0.0.2")
            assert b" 503 " in late.recv(200).split(b"\r\n")[0]
            late.close()
            release.set()
            assert all(b" 200 " in _read_response(s).split(b"\r\n")[0] for s in busy)
        finally:
            release.set()
            for s in busy:
                s.close()
