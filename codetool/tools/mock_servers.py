"""Local mock servers: a TMDB API built from its OpenAPI spec, and a StableToolBench-compatible
``/virtual`` server backed by the response cache and the simulator.

Start them with ``codetool serve-mock tmdb --port 8000`` (``--spec openapi.json``: any other API) and
``codetool serve-mock stabletoolbench --port 8080`` (``codetool.commands.serve_mock``); point
:class:`~codetool.tools.clients.HTTPBackend` (``make_tool_backend("mock-tmdb", port=8000)``),
:class:`~codetool.tools.clients.StableToolBenchClient`
or StableToolBench's own scripts (``--service_url http://127.0.0.1:8080/virtual``) at them.

- Any OpenAPI 3 spec (:func:`build_openapi_app`; TMDB's ``RestGPT/specs/tmdb_oas.json``, 54 GETs,
  by default): every operation with every method the spec declares, at ``/<path>`` (and
  ``/3/<path>``, TMDB's version prefix). Path parameters are matched by type (integers, enums),
  required query, header and JSON body parameters are checked, the answer is the spec's example
  response (its top-level ``id`` set to the requested one when the path has a single parameter),
  or one the simulator builds from the response schema; a method the path does not declare is a
  405 naming the ones it does; anything else is a TMDB-style 404.
- StableToolBench: ``POST /virtual`` takes StableToolBench's request (``category``, ``tool_name``,
  ``api_name``, ``tool_input`` as JSON text or object, ``strip``, ``toolbench_key``) and answers
  ``{"error", "response"}`` from the cache, else from the simulator (plus ``simulated`` and
  ``source`` fields, which StableToolBench's clients ignore). APIs are documented by the query
  files' ``api_list`` entries (default: the six StableToolBench test groups).

Safety (docs/DESIGN.md §5b): both apps come wrapped in ``codetool.serving.ServerGuard``, the guard
of every codetool server (:func:`guard`): binds 127.0.0.1 by default; any other address needs an
API key in an environment variable, checked on every request as ``Authorization: Bearer <key>``
(or a ``toolbench_key`` header, for StableToolBench's scripts), and the guard's fairness: a client
is its key or its connection (never its address), requests are worked on in fair order over
clients, and connections are capped per address and prefix, idle ones closed to make room
(issue 39). Request bodies over ``max_body_bytes``
(64 KB by default: a call's arguments are small) get 413, chunked bodies 411, bodies not received in time 408, JSON nested too
deeply 400, requests over ``timeout_s`` 504, malformed requests a 4xx with a one-line reason; an
internal error is a one-line 500, never a traceback.
"""

# No "from __future__ import annotations": FastAPI must see the real Request class in handler signatures.
import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

from codetool.serving import (
    READ_TIMEOUT_S,
    ServerGuard,
    json_internal_errors,
)
from codetool.tools.backends import FallbackBackend
from codetool.tools.cache import CacheBackend
from codetool.tools.names import change_name, standardize
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import APISpec

logger = logging.getLogger(__name__)

# A StableToolBench call is a few hundred bytes (its arguments), a TMDB one has no body: 64 KB is
# generous, and keeps every request cheap to read and parse (a client cannot buy another's time).
MOCK_MAX_BODY_BYTES = 65_536
TMDB_NOT_FOUND = {"success": False, "status_code": 34, "status_message": "The resource you requested could not be found."}


def guard(app, *, api_key: str | None = None, max_body_bytes: int | None = None, timeout_s: float = 30.0):
    """``app`` behind the guard of every codetool server (``codetool.serving.ServerGuard``): the key
    may also come as a ``toolbench_key`` header (StableToolBench's scripts send it), errors are
    ``{"detail": ...}`` as FastAPI's own, and the body must arrive within ``min(timeout_s, 30)`` s."""
    return ServerGuard(app, api_key=api_key, max_body_bytes=max_body_bytes or MOCK_MAX_BODY_BYTES,
                       read_timeout_s=min(timeout_s, READ_TIMEOUT_S), request_timeout_s=timeout_s,
                       error_field="detail", key_header="toolbench_key", max_requests_per_client=2,
                       max_in_work=2)  # the interpreter answers one call at a time anyway: a short one goes next


def _fastapi_app(title: str):
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    json_internal_errors(app, "detail")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc):  # one line instead of FastAPI's list of dicts
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"detail": f"{where or 'request'}: {first.get('msg', 'invalid')}"}, status_code=422)

    return app


def _route_pattern(api: APISpec) -> re.Pattern:
    params = {p.name: p for p in api.parameters if p.location == "path"}

    def group(match: re.Match) -> str:
        param = params.get(match.group(1))
        if param is not None and param.enum:
            choices = "|".join(re.escape(str(v)) for v in param.enum)
            return f"(?P<{match.group(1)}>{choices})"
        if param is not None and param.type == "integer":
            return rf"(?P<{match.group(1)}>\d+)"
        return rf"(?P<{match.group(1)}>[^/]+)"

    parts = re.split(r"({[^{}]+})", api.path)
    regex = "".join(re.sub(r"{([^{}]+)}", group, part) if part.startswith("{") else re.escape(part) for part in parts)
    return re.compile(regex)


def _tmdb_body(api: APISpec, values: dict[str, str], simulator: SimulatorBackend) -> Any:
    body = simulator.simulate(api, values)
    if len(values) == 1 and isinstance(body, dict) and "id" in body:
        (value,) = values.values()
        body["id"] = int(value) if value.isdigit() else value
    return body


def _missing_required(api: APISpec, request, body: Any) -> str | None:
    """The first required query, header or body parameter the request lacks, or `None`."""
    for param in api.parameters:
        if not param.required:
            continue
        if param.location == "query" and not request.query_params.get(param.name):
            return param.name
        if param.location == "header" and not request.headers.get(param.name):
            return param.name
        if param.location == "body" and not (isinstance(body, dict) and param.name in body):
            return param.name
    return None


def build_openapi_app(apis: list[APISpec], *, title: str = "OpenAPI mock (codetool)", **limits):
    """The guarded app answering every operation of ``apis`` (one OpenAPI spec): each path with each
    method the spec declares for it (GET, POST, PUT, PATCH, DELETE, ...; HEAD is also answered
    where GET is), the example response of the operation; ``limits`` (``api_key``,
    ``max_body_bytes``, ``timeout_s``) go to :func:`guard`.

    Answers: a path the spec has, with a method it does not declare there, is 405 with an
    ``Allow`` header (``OPTIONS`` lists them: 204); a missing required query, header or JSON body
    parameter 422 naming it; a body that is not JSON 400; an unknown path a TMDB-style 404.
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    app = _fastapi_app(title)
    simulator = SimulatorBackend()
    # Static paths first, so /movie/top_rated never reaches /movie/{movie_id}.
    routes = sorted(((api.path.count("{"), _route_pattern(api), api) for api in apis if api.path), key=lambda r: r[0])

    @app.api_route("/{full_path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def dispatch(full_path: str, request: Request):
        path = "/" + full_path.strip("/")
        candidates = [path, path[2:]] if path.startswith("/3/") else [path]
        found: list[tuple[APISpec, dict[str, str]]] = []  # (api, path values) of every operation on this path
        for _, pattern, api in routes:
            match = next((m for m in (pattern.fullmatch(c) for c in candidates) if m), None)
            if match is not None and not any(a.path != api.path and a.method == api.method for a, _ in found):
                found.append((api, match.groupdict()))
        if not found:
            return JSONResponse(TMDB_NOT_FOUND, status_code=404)
        method = "GET" if request.method == "HEAD" else request.method
        chosen = next(((a, v) for a, v in found if a.method == method), None)
        allowed = sorted({a.method for a, _ in found} | ({"HEAD"} if any(a.method == "GET" for a, _ in found) else set()))
        if chosen is None and request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": ", ".join(allowed)})
        if chosen is None:
            return JSONResponse({"detail": f"{request.method} not allowed on {found[0][0].path}; use "
                                           f"{' or '.join(allowed)}"}, status_code=405,
                                headers={"Allow": ", ".join(allowed)})
        api, values = chosen
        body: Any = None
        raw = await request.body()
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return JSONResponse({"detail": "request body is not valid JSON"}, status_code=400)
        missing = _missing_required(api, request, body)
        if missing is not None:
            return JSONResponse({"success": False, "status_code": 22, "detail": f"{missing} must be provided",
                                 "status_message": f"{missing} must be provided"}, status_code=422)
        if request.method == "HEAD":
            return Response(status_code=200, media_type="application/json")
        return JSONResponse(_tmdb_body(api, values, simulator))

    return guard(app, **limits)


def build_tmdb_app(apis: list[APISpec], **limits):
    """The TMDB mock: :func:`build_openapi_app` on TMDB's operations."""
    return build_openapi_app(apis, title="TMDB mock (codetool)", **limits)


def _tool_input(value: Any) -> dict | str:
    """StableToolBench's tool_input (JSON text or object) as a dict, or the parse error."""
    if isinstance(value, dict):
        return value
    if value in (None, ""):
        return {}
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else "Tool input parse error: expected a JSON object"


def _encode(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def build_stabletoolbench_app(apis: list[APISpec], *, cache_dir: str | Path | None = None, seed: int = 0, **limits):
    """The guarded app answering StableToolBench's ``POST /virtual`` from the cache, then the
    simulator; ``limits`` (``api_key``, ``max_body_bytes``, ``timeout_s``) go to :func:`guard`.
    Each call is answered (parsed, simulated, encoded) in a worker thread; the guard admits calls
    to the threads in fair order over clients (a key or a connection), so one client's large
    calls, from however many connections, do not queue everybody else's."""
    from fastapi import Request
    from fastapi.responses import Response

    app = _fastapi_app("StableToolBench-compatible simulator (codetool)")
    index = {(standardize(api.tool), change_name(standardize(api.api))): api for api in apis}
    chain = ([CacheBackend(cache_dir, write=False)] if cache_dir else []) + [SimulatorBackend(seed=seed)]
    backend = FallbackBackend(chain)

    @app.get("/health")
    async def health():
        return {"ok": True, "apis": len(index)}

    def answer(body: bytes) -> tuple[int, bytes]:
        """The whole answer, encoded, off the event loop (a large call costs its own thread)."""
        try:
            data = json.loads(body or b"null")
        except ValueError:
            return 400, _encode({"detail": "request body is not valid JSON"})
        if not isinstance(data, dict):
            return 400, _encode({"detail": "request body must be a JSON object"})
        for name in ("tool_name", "api_name"):
            if not isinstance(data.get(name), str) or not data[name].strip():
                return 422, _encode({"detail": f"field '{name}' is required (text)"})
        arguments = _tool_input(data.get("tool_input"))
        if isinstance(arguments, str):
            return 200, _encode({"error": arguments, "response": ""})
        category = str(data.get("category") or "")
        tool = standardize(data["tool_name"])
        suffix = f"_for_{standardize(category)}"
        tool = tool[: -len(suffix)] if category and tool.endswith(suffix) else tool
        api_name = change_name(standardize(data["api_name"])).split(f"_for_{tool}")[0]
        api = index.get((tool, api_name)) or APISpec(category=category, tool=data["tool_name"], api=data["api_name"])
        response = backend.call(api, arguments)
        return 200, _encode({"error": "" if response.ok else (response.error or response.status),
                             "response": response.content, "simulated": response.simulated,
                             "source": response.source})

    @app.post("/virtual")
    async def virtual(request: Request):
        body = await request.body()  # read and size-checked by the guard, which also takes turns per client
        status, payload = await asyncio.to_thread(answer, body)
        return Response(payload, status_code=status, media_type="application/json")

    return guard(app, **limits)
