"""Tool backends: everything behind ``call(api, arguments) -> ToolResponse``.

- :class:`StableToolBenchClient`: POSTs StableToolBench's ``/virtual`` request (``category``,
  ``tool_name``, ``api_name``, ``tool_input``, ``strip``, ``toolbench_key``) to a user-given URL;
  the key comes from an environment variable; timeouts and retries with backoff.
- :class:`CacheBackend`: replays StableToolBench's response cache
  (``<root>/<Category>/<tool>_for_<Category>/<api>.json``, a map from ``str(tool_input)`` to
  ``{"error", "response"}``) with canonical keys, and records new real responses in the same layout
  (so StableToolBench's own server can read them).
- :class:`HTTPBackend`: plain HTTP for OpenAPI services (TMDB), bearer token from the environment.
- :class:`codetool.tools.simulator.SimulatorBackend`: deterministic offline answers.
- :class:`FallbackBackend`: tries backends in order (e.g. cache -> server -> simulator), records
  every fallback in ``ToolResponse.fallbacks`` and writes real answers through to the cache.

Guarantees: ``call`` never raises. A hang is a ``timeout``, an HTTP error (HTML page or not) an
``http_error`` with a one-line reason, a non-JSON body comes back as text, and a body larger than
``max_body_bytes`` is cut there (``truncated=True``). Keys are sent only in headers/bodies of the
request, never logged, and redacted from every error message and recorded response.

Not done: rate limiting, RapidAPI's own key headers, request signing, or non-JSON request bodies.
"""

from __future__ import annotations

import ast
import fcntl
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from codetool import CodetoolError
from codetool.secrets import redact, redact_obj
from codetool.tools.names import (
    api_key_name,
    canonical_arguments,
    standardize,
    standardize_category,
)
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import APISpec, ToolResponse

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_RETRY_HTTP = (429, 502, 503, 504)


class ToolBackend(Protocol):
    """The seam between tool functions and whatever answers them."""

    name: str

    def call(self, api: APISpec, arguments: dict) -> ToolResponse: ...


def _http_reason(status: int, text: str, content_type: str) -> str:
    """One line for the model: what went wrong, without a page of HTML."""
    head = text.lstrip()[:200]
    if "html" in content_type.lower() or head.startswith("<"):
        return f"HTTP {status} from the API (an HTML error page)"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for field in ("status_message", "message", "error", "detail"):
            if isinstance(data.get(field), str) and data[field].strip():
                return f"HTTP {status}: {' '.join(data[field].split())[:200]}"
    first = " ".join(head.split())
    return f"HTTP {status}: {first[:200]}" if first else f"HTTP {status}"


def http_call(client, method: str, url: str, *, source: str, timeout_s: float, max_body_bytes: int,
              params: dict | None = None, json_body: Any = None, headers: dict | None = None) -> ToolResponse:
    """One HTTP request as a ToolResponse (never raises); the body is read up to ``max_body_bytes``
    and the whole exchange must finish within ``timeout_s``."""
    import httpx

    start = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    cut = False
    try:
        with client.stream(method, url, params=params, json=json_body, headers=headers, timeout=timeout_s) as r:
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > max_body_bytes:
                    cut = True
                    break
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("overall deadline passed")
            body = b"".join(chunks)[:max_body_bytes]
            status, content_type = r.status_code, r.headers.get("content-type", "")
    except httpx.TimeoutException:
        return ToolResponse("timeout", error=f"the API did not answer within {timeout_s:g} s",
                            latency_s=time.perf_counter() - start, source=source)
    except (httpx.HTTPError, OSError, ValueError) as e:
        return ToolResponse("error", error=redact(f"request failed: {type(e).__name__}: {e}")[:300],
                            latency_s=time.perf_counter() - start, source=source)
    text = redact(body.decode("utf-8", errors="replace"))
    latency = time.perf_counter() - start
    if status >= 400:
        return ToolResponse("http_error", content=text, error=redact(_http_reason(status, text, content_type)),
                            latency_s=latency, source=source, http_status=status, truncated=cut)
    return ToolResponse("ok", content=text, latency_s=latency, source=source, http_status=status, truncated=cut)


def _client(client):
    if client is not None:
        return client
    import httpx

    return httpx.Client(follow_redirects=True, trust_env=False)


class StableToolBenchClient:
    """Client of a StableToolBench-compatible server (its ``/virtual`` endpoint, or our mock).

    Args:
        url (`str`): the endpoint, e.g. ``http://127.0.0.1:8080/virtual``.
        key_env (`str`, *optional*, defaults to `"TOOLBENCH_KEY"`): environment variable holding
            the ToolBench key (sent as the ``toolbench_key`` field and header; may be unset).
        timeout_s (`float`, *optional*, defaults to `60`): per attempt.
        retries (`int`, *optional*, defaults to `2`): extra attempts after a timeout, a connection
            error or HTTP 429/502/503/504 (not after 500: a dead API stays dead), with exponential
            backoff from ``backoff_s``.
        strip (`str`, *optional*, defaults to `"truncate"`): StableToolBench's observation
            compression mode, passed through.
    """

    name = "server"
    real = True

    def __init__(self, url: str, *, key_env: str = "TOOLBENCH_KEY", timeout_s: float = 60.0, retries: int = 2,
                 backoff_s: float = 1.0, strip: str = "truncate", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 client=None):
        if not url.startswith(("http://", "https://")):
            raise CodetoolError(f"StableToolBench server url must start with http:// or https://, got {url!r}.")
        self.url, self.key_env, self.timeout_s, self.retries = url, key_env, timeout_s, retries
        self.backoff_s, self.strip, self.max_body_bytes = backoff_s, strip, max_body_bytes
        self.client = _client(client)

    def payload(self, api: APISpec, arguments: dict) -> dict:
        """The request body without the key (StableToolBench sends names in ToolBench's standard form)."""
        return {"category": api.category, "tool_name": standardize(api.tool), "api_name": api_key_name(api),
                "tool_input": json.dumps(arguments, ensure_ascii=False), "strip": self.strip}

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        key = os.environ.get(self.key_env, "")
        body = dict(self.payload(api, arguments), toolbench_key=key)
        headers = {"toolbench_key": key} if key else {}
        total = 0.0
        for attempt in range(self.retries + 1):
            response = http_call(self.client, "POST", self.url, source=self.name, timeout_s=self.timeout_s,
                                 max_body_bytes=self.max_body_bytes, json_body=body, headers=headers)
            total += response.latency_s
            transient = response.status in ("timeout", "error") or response.http_status in _RETRY_HTTP
            if not transient or attempt == self.retries:
                break
            time.sleep(self.backoff_s * 2 ** attempt)
        response.latency_s = total
        if not response.ok:
            return response
        try:
            data = json.loads(response.content)
        except ValueError:
            return response  # not the server protocol: pass the text through
        if not isinstance(data, dict) or "response" not in data and "error" not in data:
            return response
        content = data.get("response")
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        error = str(data.get("error") or "").strip()
        status = "api_error" if error else "ok"
        return ToolResponse(status, content=redact(content), error=redact(error)[:300] or None, latency_s=total,
                            source=self.name, simulated=bool(data.get("simulated", False)),
                            http_status=response.http_status, truncated=response.truncated)


def _parse_cache_key(key: str) -> Any:
    """StableToolBench keys are ``str(dict)`` (Python repr); some writers used JSON."""
    for parse in (ast.literal_eval, json.loads):
        try:
            value = parse(key)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return key


class CacheBackend:
    """Replay (and record) responses in StableToolBench's cache layout.

    Args:
        root (`str` or `Path`): the cache folder (StableToolBench's ``tool_response_cache``).
        write (`bool`, *optional*, defaults to `True`): allow :meth:`record` to add responses.

    A lookup ignores argument order and compares scalars as text (``1`` == ``"1"``).

    Writing through appends: a recorded answer is one line of ``<api>.json.journal`` next to the
    API's JSON file (under an exclusive ``flock``, so processes sharing the cache do not mix
    lines); the journal is folded into the JSON file once it is larger than that file (and at
    least ``COMPACT_BYTES``; the first answer makes the file), so each answer costs its own size, amortised, instead of a rewrite
    of everything cached for the API. Reading takes the JSON file, then the journal (a torn last
    line, from a writer that died mid-line, is skipped). :meth:`compact` folds every journal now
    (StableToolBench's own scripts read the JSON files only).
    """

    COMPACT_BYTES = 1 << 20

    name = "cache"
    real = False

    def __init__(self, root: str | Path, *, write: bool = True):
        self.root = Path(root)
        self.write = write
        self._index: dict[Path, dict[str, dict]] = {}
        self._lock = threading.Lock()

    def path_for(self, api: APISpec) -> Path:
        category = standardize_category(api.category)
        return self.root / category / f"{standardize(api.tool)}_for_{category}" / f"{api_key_name(api)}.json"

    @staticmethod
    def _key(arguments: Any) -> str:
        return canonical_arguments(arguments) if isinstance(arguments, dict) else str(arguments)

    def _entries(self, path: Path) -> dict[str, dict]:
        if path not in self._index:
            index: dict[str, dict] = {}
            for key, entry in _read_cache_file(path).items():
                index[self._key(_parse_cache_key(key))] = entry
            self._index[path] = index
        return self._index[path]

    def lookup(self, api: APISpec, arguments: dict) -> dict | None:
        """The cached ``{"error", "response"}`` entry for this call, or ``None``."""
        with self._lock:
            return self._entries(self.path_for(api)).get(self._key(arguments))

    def record(self, api: APISpec, arguments: dict, content: str, error: str = "") -> None:
        """Add one response (keyed like StableToolBench: ``str(arguments)``), appended to the
        API's journal (see the class docstring)."""
        if not self.write:
            return
        path = self.path_for(api)
        entry = redact_obj({"error": error, "response": content})
        line = json.dumps({"key": redact(str(dict(arguments))), "entry": entry}, ensure_ascii=False) + "\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            journal = _journal(path)
            with open(journal, "a", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    f.write(line)
                    f.flush()
                    size = os.fstat(f.fileno()).st_size
                    main = path.stat().st_size if path.is_file() else 0
                    if main == 0 or size >= max(self.COMPACT_BYTES, main):  # (the first answer makes the file)
                        _fold(path, f)
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
            self._entries(path)[self._key(arguments)] = entry

    def compact(self) -> None:
        """Fold every journal under ``root`` into its JSON file."""
        with self._lock:
            for journal in self.root.rglob("*.json.journal"):
                with open(journal, "a", encoding="utf-8") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    try:
                        _fold(journal.with_name(journal.name[:-len(".journal")]), f)
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        start = time.perf_counter()
        entry = self.lookup(api, arguments)
        if entry is None:
            return ToolResponse("not_found", error=f"no cached response for {api.tool}/{api.api} with these arguments",
                                latency_s=time.perf_counter() - start, source=self.name)
        entry = entry if isinstance(entry, dict) else {"error": "", "response": entry}
        content = entry.get("response", "")
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        error = str(entry.get("error") or "").strip()
        return ToolResponse("api_error" if error else "ok", content=content, error=error[:300] or None,
                            latency_s=time.perf_counter() - start, source=self.name)


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def _read_cache_file(path: Path) -> dict:
    """An API's cache: its JSON file, then the lines of its journal (a torn line is skipped)."""
    raw: dict = {}
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            raw = loaded if isinstance(loaded, dict) else {}
        except (ValueError, OSError) as e:
            logger.warning("unreadable cache file %s (%s); treating it as empty", path, type(e).__name__)
    journal = _journal(path)
    if journal.is_file():
        try:
            lines = journal.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                raw[record["key"]] = record.get("entry")
    return raw


def _fold(path: Path, journal_file) -> None:
    """Rewrite ``path`` with its journal folded in, then empty the journal (whose ``flock`` the
    caller holds)."""
    merged = _read_cache_file(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    journal_file.truncate(0)


class HTTPBackend:
    """Plain HTTP calls to an OpenAPI service (RestBench's TMDB, or our mock of it).

    Args:
        base_url (`str`, *optional*): replaces the spec's server, e.g. ``http://127.0.0.1:8000``;
            the request URL is ``base_url + api.path``. Without it, ``api.url`` is used.
        token_env (`str` or `None`, *optional*, defaults to `"TMDB_ACCESS_TOKEN"`): environment
            variable holding the token; sent as ``Authorization: Bearer <token>`` (or in
            ``key_header``) when set. ``None`` sends no credential.
        key_header (`str`, *optional*): send the raw token in this header instead of a bearer token.
        timeout_s (`float`, *optional*, defaults to `30`): for the whole exchange.
    """

    name = "http"
    real = True

    def __init__(self, base_url: str | None = None, *, token_env: str | None = "TMDB_ACCESS_TOKEN",
                 key_header: str | None = None, timeout_s: float = 30.0,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, client=None):
        self.base_url = base_url.rstrip("/") if base_url else None
        self.token_env, self.key_header, self.timeout_s = token_env, key_header, timeout_s
        self.max_body_bytes = max_body_bytes
        self.client = _client(client)

    def request_parts(self, api: APISpec, arguments: dict) -> tuple[str, dict, dict, dict | None]:
        """(url, query params, headers, JSON body) for one call, without credentials.

        Raises:
            ValueError: a path parameter that does not fit its declared type (see :func:`path_segment`).
        """
        declared = {p.name: p for p in api.parameters}
        url = (self.base_url + api.path) if self.base_url and api.path else (api.url or "")
        params, headers, body = {}, {}, {}
        for name, value in arguments.items():
            where = declared[name].location if name in declared else "query"
            if where == "path":
                url = url.replace("{" + name + "}", path_segment(declared[name], value))
            elif where == "header":
                headers[name] = str(value)
            elif where == "body":
                body[name] = value
            else:
                params[name] = json.dumps(value) if isinstance(value, (dict, list)) else value
        return url, params, headers, body or None

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        try:
            url, params, headers, body = self.request_parts(api, arguments)
        except ValueError as e:
            return ToolResponse("invalid_arguments", error=str(e), source=self.name)
        if not url.startswith(("http://", "https://")) or "{" in url:
            return ToolResponse("invalid_arguments" if "{" in url else "error",
                                error=f"cannot build the URL of {api.api}: got {url or 'no URL'!r}", source=self.name)
        token = os.environ.get(self.token_env, "") if self.token_env else ""
        if token:
            headers[self.key_header or "Authorization"] = token if self.key_header else f"Bearer {token}"
        return http_call(self.client, api.method, url, source=self.name, timeout_s=self.timeout_s,
                         max_body_bytes=self.max_body_bytes, params=params, json_body=body, headers=headers)


_INTEGER = re.compile(r"-?\d{1,19}")
_NUMBER = re.compile(r"-?\d{1,30}(\.\d{1,30})?([eE][-+]?\d{1,3})?")


def path_segment(param, value: Any) -> str:
    """``value`` as one URL path segment for the path parameter ``param``, checked against its
    declared type: an ``integer`` is digits, a ``number`` a decimal, a ``boolean`` true/false, an
    enum one of its values; any value is refused if it is empty, ``.`` or ``..``, or holds a
    slash, a backslash or a control character (so no value can reach another path of the API
    host, with the host's credentials), then percent-encoded.

    Raises:
        ValueError: with a one-line reason the model can act on.
    """
    kind = (param.type or "string").lower()
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"path parameter {param.name!r} must be a single value, got a {type(value).__name__}")
    if kind == "integer" and not _INTEGER.fullmatch(text):
        raise ValueError(f"path parameter {param.name!r} must be an integer, got {text[:40]!r}")
    if kind == "number" and not _NUMBER.fullmatch(text):
        raise ValueError(f"path parameter {param.name!r} must be a number, got {text[:40]!r}")
    if kind == "boolean" and text.lower() not in ("true", "false"):
        raise ValueError(f"path parameter {param.name!r} must be true or false, got {text[:40]!r}")
    if param.enum and text not in {str(v) for v in param.enum}:
        raise ValueError(f"path parameter {param.name!r} must be one of {[str(v) for v in param.enum][:10]}, "
                         f"got {text[:40]!r}")
    if text in ("", ".", "..") or any(c in text for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"path parameter {param.name!r} cannot be {text[:40]!r} (no empty value, dot segment, "
                         f"slash or control character)")
    return quote(text, safe="")


DEFAULT_FALLBACK_ON = ("http_error", "timeout", "not_found", "error", "api_error")


class FallbackBackend:
    """Try backends in order until one answers; every failure on the way is recorded.

    Args:
        backends (`list[ToolBackend]`): e.g. ``[cache, server, simulator]``.
        cache (`CacheBackend`, *optional*): real answers (``ok``, not ``simulated``, from a backend
            with ``real = True``) are written through to it.
        fall_back_on (`tuple[str, ...]`, *optional*): statuses that move on to the next backend;
            ``invalid_arguments`` never does (the caller must fix the call).

    The returned response carries ``fallbacks``: ``"<backend>: <status>: <reason>"`` for each
    backend that failed before it, and ``latency_s`` summed over all attempts.
    """

    name = "fallback"

    def __init__(self, backends: list, *, cache: CacheBackend | None = None,
                 fall_back_on: tuple[str, ...] = DEFAULT_FALLBACK_ON):
        if not backends:
            raise CodetoolError("FallbackBackend needs at least one backend.")
        self.backends, self.cache, self.fall_back_on = list(backends), cache, tuple(fall_back_on)

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        failures: list[str] = []
        total = 0.0
        for i, backend in enumerate(self.backends):
            response = safe_call(backend, api, arguments)
            total += response.latency_s
            last = i == len(self.backends) - 1
            if last or response.status not in self.fall_back_on:
                if response.ok and not response.simulated and self.cache is not None and getattr(backend, "real", False):
                    self.cache.record(api, arguments, response.content)
                response.fallbacks = failures + list(response.fallbacks)
                response.latency_s = total
                return response
            failures.append(f"{backend.name}: {response.status}: {response.error or ''}"[:200])
            logger.debug("%s/%s: %s failed (%s), trying %s", api.tool, api.api, backend.name, response.status,
                         self.backends[i + 1].name)
        raise AssertionError("unreachable")


def safe_call(backend, api: APISpec, arguments: dict) -> ToolResponse:
    """``backend.call`` that turns an unexpected exception into an ``error`` response."""
    start = time.perf_counter()
    try:
        return backend.call(api, arguments)
    except Exception as e:  # a backend bug must not crash the agent's step
        logger.warning("%s backend raised %s on %s/%s", getattr(backend, "name", "?"), type(e).__name__,
                       api.tool, api.api)
        return ToolResponse("error", error=redact(f"backend failure: {type(e).__name__}: {e}")[:300],
                            latency_s=time.perf_counter() - start, source=getattr(backend, "name", ""))


def _stabletoolbench_chain(url: str | None = None, cache_dir: str | None = None, *, seed: int = 0,
                           **server_options) -> FallbackBackend:
    """cache (if ``cache_dir``) -> server (if ``url``) -> simulator; real answers recorded."""
    cache = CacheBackend(cache_dir) if cache_dir else None
    chain: list = [cache] if cache else []
    if url:
        chain.append(StableToolBenchClient(url, **server_options))
    chain.append(SimulatorBackend(seed=seed))
    return FallbackBackend(chain, cache=cache)


def _tmdb(base_url: str = "https://api.themoviedb.org/3", *, fallback_to_simulator: bool = True, **options):
    """Real TMDB (token from ``TMDB_ACCESS_TOKEN``), falling back to the simulator."""
    http = HTTPBackend(base_url, **options)
    if http.token_env and not os.environ.get(http.token_env):
        logger.warning("%s is not set: TMDB will refuse the calls (HTTP 401)%s", http.token_env,
                       " and the simulator will answer them" if fallback_to_simulator else "")
    return FallbackBackend([http, SimulatorBackend()]) if fallback_to_simulator else http


def _mock_tmdb(port: int = 8000, host: str = "127.0.0.1", **options) -> HTTPBackend:
    """Our TMDB mock (``codetool serve-mock tmdb``), no credential sent."""
    return HTTPBackend(f"http://{host}:{port}", token_env=options.pop("token_env", None), **options)


# kind -> constructor; the only place that knows the backend kinds.
BACKENDS: dict[str, Any] = {
    "simulator": SimulatorBackend,
    "cache": CacheBackend,
    "server": StableToolBenchClient,
    "http": HTTPBackend,
    "stabletoolbench": _stabletoolbench_chain,
    "tmdb": _tmdb,
    "mock-tmdb": _mock_tmdb,
}


def make_tool_backend(kind: str, **kwargs) -> ToolBackend:
    """Build a backend by kind (see ``BACKENDS``) with its keyword options.

    Examples: ``make_tool_backend("simulator")``; ``make_tool_backend("stabletoolbench",
    url="http://127.0.0.1:8080/virtual", cache_dir="data/tool_response_cache")``;
    ``make_tool_backend("mock-tmdb", port=8000)``.

    Raises:
        CodetoolError: unknown kind, or an option that kind does not take.
    """
    if kind not in BACKENDS:
        raise CodetoolError(f"unknown tool backend {kind!r}; choose one of {sorted(BACKENDS)}.")
    try:
        return BACKENDS[kind](**kwargs)
    except TypeError as e:
        raise CodetoolError(f"tool backend {kind!r}: {e}. Check the backend options in your config.") from None
