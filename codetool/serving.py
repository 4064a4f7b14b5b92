"""Serve an ASGI app (FastAPI) with uvicorn, behind one guard against abusive clients.

Used by ``serve-prm``, ``serve-mock``, the search (the TMDB mock of RestBench runs), tests and
benchmarks. Every codetool server is wrapped in :class:`ServerGuard` and started with
:func:`serve_forever` or :func:`serve_in_background`, so they all behave alike (docs/DESIGN.md §5b):

- **Bind.** Loopback by default; any address that is not loopback (``localhost``, 127.0.0.0/8,
  ``::1``, ``::ffff:127.x.y.z``) needs a non-blank API key (:func:`check_bind`); the server
  functions refuse to start otherwise.
- **Auth.** With a key, every request (``/health`` too, on loopback too) must send
  ``Authorization: Bearer <key>`` (or the app's extra key header, e.g. StableToolBench's
  ``toolbench_key``); else 401. Compared in constant time. Several keys, comma-separated, are one
  per client: the server then tells clients apart by their key (:mod:`codetool.fairness`).
- **Body.** A ``Content-Length`` over ``max_body_bytes`` is a 413 before anything is read; a body
  without one (chunked) is a 411; a non-numeric one a 400. The body is read by the guard within
  ``read_timeout_s`` (408 otherwise: a client trickling its body cannot hold a connection) and
  handed to the app; JSON nested deeper than ``max_json_depth`` is a 400, checked in linear time
  (:func:`json_depth_exceeds`; the parser would otherwise recurse until it fails), and JSON of more
  than ``max_json_members`` values a 413 (:func:`~codetool.fairness.json_members`), both off the
  event loop for large bodies. The app parses large bodies with
  :func:`~codetool.fairness.loads_without_stalling`.
- **Clients** (issues 27 and 39; :mod:`codetool.fairness`): a client is its API key (with one key
  per client) or its connection, never its address (every local client is 127.0.0.1, and one
  machine speaks from any loopback address). Connections: at most ``max_connections_per_client``
  per address, ``max_connections_per_group`` per address prefix (/24, /64, all of loopback) and
  ``limit_concurrency`` in all; a new connection over a cap closes the connection of that
  address (prefix, server) that has waited longest for a request head, taken from its largest
  holder (an idle keep-alive connection, a head trickling in), and gets 503 only when every one
  of them is busy with a request; at most ``NEW_CONNECTIONS_PER_S`` new ones per second and
  address off loopback (more are reset). Requests: at most ``max_requests_per_client`` of one client in the
  guard at once (:class:`ClientTurns`), and ``max_in_work`` worked on at once by the app, admitted
  in fair order over clients weighted by body size (:class:`~codetool.fairness.FairTurns`): a
  short request waits for at most the requests in work, not for another client's queue. Body
  bytes: bodies over ``SMALL_BODY_BYTES`` are reserved from ``Content-Length`` before they are
  read, within ``max_client_inflight_bytes`` per client, ``max_group_inflight_bytes`` per
  address prefix and ``max_inflight_bytes`` in all (one that does not fit waits unread, 503 after
  ``read_timeout_s``); small bodies need no reservation, so a client's large uploads never hold
  up another's short requests.
- **Time.** An answer not started within ``request_timeout_s`` is a 504, and the app's work on
  the request is cancelled. A request head must be complete within ``header_timeout_s`` of the
  connection or of the previous answer (:func:`uvicorn_config`), however slowly it trickles in
  (uvicorn's own timer stopped at the first byte), headers are capped at 64 KB, and at most
  ``limit_concurrency`` connections/requests are served at once (the rest get 503).
- **Errors.** Every refusal is a JSON body ``{<error_field>: "<one line>"}`` (``error`` for the
  PRM server, ``detail`` for the FastAPI-style mocks); an exception in the app is a one-line 500,
  never a traceback (:func:`json_internal_errors` for FastAPI routes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import threading
import time
from typing import Literal

from codetool import CodetoolError
from codetool.connections import (
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_CONNECTIONS_PER_GROUP,
    guarded_h11_protocol,
)
from codetool.fairness import FairTurns, identify, json_members
from codetool.secrets import register_secret

logger = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 65_536
SMALL_BODY_BYTES = 65_536  # bodies up to this size are read without reserving room
READ_TIMEOUT_S = 30.0
MAX_JSON_DEPTH = 100
_THREAD_BODY_BYTES = 65_536  # bodies larger than this are checked off the event loop


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only.

    ``localhost``, every address of 127.0.0.0/8 (``127.0.0.2`` too), ``::1`` (also ``[::1]``) and
    IPv4-mapped loopback (``::ffff:127.0.0.1``) are loopback; ``0.0.0.0``, ``::``, any other
    address and any other name are not.
    """
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def check_bind(host: str, api_key: str | None, *, what: str = "the server", api_key_env: str | None = None) -> None:
    """Refuse to expose a server beyond this machine without an API key.

    Raises:
        CodetoolError: ``host`` is not loopback (:func:`is_loopback`) and ``api_key`` is missing
            or blank; the message names ``api_key_env`` when given.
    """
    if is_loopback(host) or (api_key is not None and api_key.strip()):
        return
    where = (f"set the environment variable {api_key_env} to an API key" if api_key_env
             else "wrap the app in a ServerGuard with an api_key")
    raise CodetoolError(f"{what} on {host} needs an API key: {where} (clients send 'Authorization: Bearer <key>'), "
                        "or bind 127.0.0.1.")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether ``body`` opens more than ``limit`` nested JSON arrays/objects (brackets inside
    strings do not count). Linear in the body and vectorised (numpy releases the GIL for the
    long passes): escaped backslashes and quotes are dropped first, a running parity of the
    quotes left marks what is inside a string, and the depth is the running sum of the brackets
    outside. Invalid JSON is judged by its brackets only (the parser refuses it later anyway)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    import numpy as np

    text = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    chars = np.frombuffer(text, dtype=np.uint8)
    step = ((chars == 91).view(np.int8) + (chars == 123).view(np.int8)
            - (chars == 93).view(np.int8) - (chars == 125).view(np.int8))
    step[np.logical_xor.accumulate(chars == 34)] = 0  # inside a string (a closing quote is not a bracket)
    return bool(step.size) and int(np.cumsum(step, dtype=np.int32).max()) > limit


class ClientTurns:
    """At most ``per_client`` requests of one client (:class:`codetool.fairness.Client` id: its
    key or its connection) are worked on at once; the others of that client wait their turn on
    the event loop, costing nothing.

    Example:
        ```python
        turns = ClientTurns()
        async with turns.turn(client.id):
            answer = await asyncio.to_thread(work, body)
        ```
    """

    PER_CLIENT = 2

    def __init__(self, per_client: int = PER_CLIENT):
        self.per_client = per_client
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def turn(self, client: str):
        slot = self._slots.setdefault(client, asyncio.Semaphore(self.per_client))
        self._users[client] = self._users.get(client, 0) + 1
        try:
            async with slot:
                yield
        finally:
            self._users[client] -= 1
            if not self._users[client]:
                del self._users[client], self._slots[client]


class ServerGuard:
    """ASGI middleware in front of every codetool server (see the module docstring).

    Args:
        app: the ASGI app (a FastAPI app, or any ASGI callable).
        api_key (`str`, *optional*): the bearer key every request must send; several keys,
            comma-separated, one per client (clients are then told apart by key); `None` for no auth.
        max_body_bytes (`int`, *optional*, defaults to 1,000,000): largest request body (413 above).
        read_timeout_s (`float`, *optional*, defaults to 30): the whole body must arrive by then (408).
        request_timeout_s (`float`, *optional*, defaults to 120): the answer must start by then (504).
        max_json_depth (`int`, *optional*, defaults to 100): deepest JSON nesting accepted (400).
        max_json_members (`int`, *optional*): most JSON values in a body (413 above; unlimited by default).
        error_field (`str`, *optional*, defaults to `"error"`): the key of the one-line error text.
        key_header (`str`, *optional*): a header that may carry the key instead of ``Authorization``.
        max_connections_per_client (`int`, *optional*, defaults to 64): open connections of one
            address (read by :func:`uvicorn_config`, as is ``max_connections_per_group``, 256, per
            address prefix); over a cap, the connection waiting longest for a request is closed
            to make room, and a 503 comes only when all are busy.
        max_inflight_bytes (`int`, *optional*): bytes of large bodies (over ``SMALL_BODY_BYTES``)
            being received or served at once, over all clients (defaults to 16 bodies of
            ``max_body_bytes``, at most 256 MB); one whose ``Content-Length`` does not fit waits,
            unread, for room (a 503 after ``read_timeout_s``).
        max_client_inflight_bytes (`int`, *optional*): the same for one client (defaults to a
            quarter of ``max_inflight_bytes``, at least two bodies); ``max_group_inflight_bytes``
            for one address prefix (defaults to half of ``max_inflight_bytes``, at least two bodies).
        max_requests_per_client (`int`, *optional*, defaults to 8): requests of one client in the
            guard at once (:class:`ClientTurns`); the others wait their turn at no cost.
        max_in_work (`int`, *optional*, defaults to 8): requests worked on at once (checks and, with
            ``app_in_turn``, the app), admitted in fair order over clients
            (:class:`~codetool.fairness.FairTurns`, weighted by body size).
        app_in_turn (`bool`, *optional*, defaults to `True`): whether the app runs inside the turn
            (``False`` for an app that schedules its own work fairly, e.g. the PRM server, whose
            requests wait for their scores).
    Raises:
        CodetoolError: ``api_key`` is blank, or a limit is not positive.
    """

    def __init__(self, app, *, api_key: str | None = None, max_body_bytes: int = 1_000_000,
                 read_timeout_s: float = READ_TIMEOUT_S, request_timeout_s: float = 120.0,
                 max_json_depth: int = MAX_JSON_DEPTH, max_json_members: int | None = None, error_field: str = "error",
                 key_header: str | None = None, max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
                 max_connections_per_group: int = MAX_CONNECTIONS_PER_GROUP, max_inflight_bytes: int | None = None,
                 max_client_inflight_bytes: int | None = None, max_group_inflight_bytes: int | None = None,
                 max_requests_per_client: int = 8, max_in_work: int = 8, app_in_turn: bool = True):
        keys = None if api_key is None else [k.strip() for k in api_key.split(",")]
        if keys is not None and not all(keys):
            raise CodetoolError("the server's API key is blank (or holds a blank one among its comma-separated keys); "
                                "set real keys, or none on loopback.")
        if not (max_body_bytes > 0 and read_timeout_s > 0 and request_timeout_s > 0 and max_json_depth > 0):
            raise CodetoolError(f"server limits must be positive, got max_body_bytes={max_body_bytes}, "
                                f"read_timeout_s={read_timeout_s}, request_timeout_s={request_timeout_s}, "
                                f"max_json_depth={max_json_depth}.")
        self.app, self.api_keys = app, keys
        for one in keys or []:  # each key is a secret on its own (redacted wherever it shows up)
            register_secret(one)
        self.api_key = None if keys is None else ",".join(keys)
        self.max_body_bytes, self.read_timeout_s = max_body_bytes, read_timeout_s
        self.request_timeout_s, self.max_json_depth, self.max_json_members = request_timeout_s, max_json_depth, max_json_members
        self.error_field, self.key_header = error_field, key_header.lower() if key_header else None
        self.max_connections_per_client = max(1, int(max_connections_per_client))
        self.max_connections_per_group = max(self.max_connections_per_client, int(max_connections_per_group))
        self.max_inflight_bytes = max_inflight_bytes or min(16 * max_body_bytes, 256 << 20)
        self.max_client_inflight_bytes = max_client_inflight_bytes or max(2 * max_body_bytes,
                                                                          self.max_inflight_bytes // 4)
        self.max_group_inflight_bytes = max_group_inflight_bytes or max(2 * max_body_bytes,
                                                                        self.max_inflight_bytes // 2)
        self.app_in_turn = app_in_turn
        self._inflight = 0  # touched on the event loop only
        self._held: dict[str, int] = {}  # bytes reserved per client id and per "group:" prefix
        self._turns = ClientTurns(max(1, int(max_requests_per_client)))
        self._work = FairTurns(max(1, int(max_in_work)))
        self._room: asyncio.Condition | None = None  # made on the event loop, at the first request

    def _key_index(self, headers: dict[str, str]) -> int | None:
        """The position of the request's key among the server's keys; ``None`` when it has none of them."""
        given = headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not token and self.key_header:
            token = headers.get(self.key_header, "").strip()
        found = None
        for i, key in enumerate(self.api_keys or []):  # every key compared, in constant time each
            if token and hmac.compare_digest(token.encode(), key.encode()):
                found = i
        return found

    async def _reply(self, send, status: int, text: str) -> None:
        body = json.dumps({self.error_field: text}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _read_body(self, receive) -> bytes | int | None:
        """The body; its size so far when it passes the limit; `None` when the client left."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return size
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # lifespan events go straight to the app
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        key = None
        if self.api_keys is not None:
            key = self._key_index(headers)
            if key is None:
                return await self._reply(send, 401, "missing or wrong bearer token: send 'Authorization: Bearer <key>'")
        length = headers.get("content-length")
        if length is None and "transfer-encoding" in headers:
            return await self._reply(send, 411, "a Content-Length header is required (no chunked bodies)")
        if length is not None and not length.strip().isdigit():
            return await self._reply(send, 400, "invalid Content-Length header")
        if length is not None and int(length) > self.max_body_bytes:
            return await self._reply(send, 413, f"body of {int(length)} bytes; the limit is {self.max_body_bytes}")
        client = identify(scope, key if self.api_keys is not None and len(self.api_keys) > 1 else None)
        scope["codetool.client"] = client.id  # the app's fairness uses the same identity
        size = int(length or 0)
        reserved = size if size > SMALL_BODY_BYTES else 0
        async with self._turns.turn(client.id):  # the client's other requests wait here, holding nothing
            if reserved and not await self._reserve(reserved, client):
                return await self._reply(send, 503, "the server holds too many request bytes right now; retry shortly")
            try:
                return await self._guarded(scope, receive, send, client)
            finally:
                if reserved:
                    self._release(reserved, client)

    def _holders(self, client) -> tuple[str, str]:
        return client.id, "group:" + client.group

    async def _reserve(self, size: int, client) -> bool:
        """Count ``size`` body bytes against the budgets (the client's, its address prefix's, the
        server's), waiting (up to ``read_timeout_s``) for room; ``False`` when none came."""
        if self._room is None:
            self._room = asyncio.Condition()
        own, group = self._holders(client)

        def fits() -> bool:
            return (self._inflight + size <= self.max_inflight_bytes
                    and self._held.get(own, 0) + size <= self.max_client_inflight_bytes
                    and self._held.get(group, 0) + size <= self.max_group_inflight_bytes)

        async with self._room:
            try:
                await asyncio.wait_for(self._room.wait_for(fits), self.read_timeout_s)
            except asyncio.TimeoutError:
                return False
            self._inflight += size
            for holder in (own, group):
                self._held[holder] = self._held.get(holder, 0) + size
        return True

    def _release(self, size: int, client) -> None:
        self._inflight -= size
        for holder in self._holders(client):
            left = self._held.get(holder, size) - size
            if left > 0:
                self._held[holder] = left
            else:
                self._held.pop(holder, None)

        room = self._room
        if room is None:  # made at the first admission, which every release follows
            return

        async def wake():
            async with room:
                room.notify_all()

        asyncio.get_running_loop().create_task(wake())

    def _check_json(self, body: bytes) -> tuple[int, str] | None:
        """The refusal of a body nested too deeply or holding too many values, or ``None``."""
        if json_depth_exceeds(body, self.max_json_depth):
            return 400, f"JSON nested too deeply; the limit is {self.max_json_depth} levels"
        if self.max_json_members is not None and body.count(b",") >= self.max_json_members:
            members = json_members(body)
            if members > self.max_json_members:
                return 413, f"JSON of {members} values; the limit is {self.max_json_members}: send fewer or smaller items"
        return None

    async def _guarded(self, scope, receive, send, client):
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.read_timeout_s)
        except asyncio.TimeoutError:
            return await self._reply(send, 408, f"request body not received within {self.read_timeout_s:g} s")
        if body is None:
            return None
        if isinstance(body, int):
            return await self._reply(send, 413, f"body of over {self.max_body_bytes} bytes; "
                                                f"the limit is {self.max_body_bytes}")
        async with contextlib.AsyncExitStack() as stack:
            # Work is admitted in fair order over clients: a short request overtakes another client's queue.
            await stack.enter_async_context(self._work.turn(client.id, cost=len(body) + 1024))
            refused = (await asyncio.to_thread(self._check_json, body) if len(body) > _THREAD_BODY_BYTES
                       else self._check_json(body))
            if refused:
                return await self._reply(send, *refused)
            if not self.app_in_turn:
                await stack.aclose()  # the app schedules its own work (and waits for it) fairly
            return await self._call_app(scope, body, receive, send)

    async def _call_app(self, scope, body: bytes, receive, send) -> None:
        replayed, started = False, False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, replay, tracked_send), self.request_timeout_s)
        except asyncio.TimeoutError:
            if not started:
                await self._reply(send, 504, f"request took longer than {self.request_timeout_s:g} s")
        except Exception as e:  # a bug must not leak a traceback to the client
            logger.error("server error: %s on %s %s", type(e).__name__, scope.get("method"), scope.get("path"))
            if not started:
                await self._reply(send, 500, f"internal error ({type(e).__name__}); see the server log")


def json_internal_errors(app, error_field: str = "error") -> None:
    """Make a FastAPI ``app`` answer an exception in a route with a one-line JSON 500 (Starlette
    would send plain text); the exception still reaches :class:`ServerGuard`, which logs it."""
    from fastapi.responses import JSONResponse

    async def internal(request, exc):
        return JSONResponse({error_field: f"internal error ({type(exc).__name__}); see the server log"},
                            status_code=500)

    app.add_exception_handler(Exception, internal)


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 0, *, lifespan: Literal["auto", "on", "off"] = "auto",
                   header_timeout_s: float = HEADER_TIMEOUT_S, limit_concurrency: int = 1000):
    """The ``uvicorn.Config`` every codetool server uses (see the module docstring for the guards)."""
    import uvicorn

    per_client = getattr(app, "max_connections_per_client", MAX_CONNECTIONS_PER_CLIENT)
    per_group = getattr(app, "max_connections_per_group", MAX_CONNECTIONS_PER_GROUP)
    # Our own total stays under uvicorn's, so a newcomer closes an idle connection before uvicorn refuses it.
    protocol = guarded_h11_protocol(header_timeout_s, per_client, per_group, max(1, limit_concurrency - 8))
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                          timeout_keep_alive=5, http=protocol,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, limit_concurrency=limit_concurrency)


def serve_forever(app, host: str, port: int, **kwargs) -> None:
    """Serve ``app`` in this thread until interrupted (the CLI servers).

    Raises:
        CodetoolError: ``host`` is not loopback and ``app`` is not a :class:`ServerGuard` with a key.
    """
    import uvicorn

    check_bind(host, getattr(app, "api_key", None))

    uvicorn.Server(uvicorn_config(app, host, port, **kwargs)).run()


@contextlib.contextmanager
def serve_in_background(app, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = 30.0,
                        lifespan: Literal["auto", "on", "off"] = "auto", name: str = "codetool-server",
                        header_timeout_s: float = HEADER_TIMEOUT_S, limit_concurrency: int = 1000):
    """Serve ``app`` in a daemon thread; yields its base URL, e.g. ``http://127.0.0.1:43817``.

    Args:
        port (`int`, *optional*, defaults to `0`): 0 picks a free port.
        start_timeout_s (`float`, *optional*): how long to wait for the server to listen.
        lifespan (`str`, *optional*, defaults to `"auto"`): uvicorn's lifespan mode (``off`` for apps
            without start-up hooks).
        header_timeout_s (`float`, *optional*, defaults to 10): close connections whose request head
            has not arrived by then.
        limit_concurrency (`int`, *optional*, defaults to 1000): connections served at once.
    Raises:
        CodetoolError: the server did not start in time (the port is taken, or the app failed), or
            ``host`` is not loopback and ``app`` is not a :class:`ServerGuard` with a key.
    """
    import uvicorn

    check_bind(host, getattr(app, "api_key", None), what=name)

    server = uvicorn.Server(uvicorn_config(app, host, port, lifespan=lifespan, header_timeout_s=header_timeout_s,
                                           limit_concurrency=limit_concurrency))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise CodetoolError(f"{name} did not start on {host}:{port} within {start_timeout_s:g} s "
                                "(is the port taken?).")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
