"""Tool backends: everything behind ``call(api, arguments) -> ToolResponse``
(:class:`codetool.tools.spec.ToolBackend`), and the one table of their kinds.

- :class:`codetool.tools.clients.StableToolBenchClient`: a StableToolBench ``/virtual`` server.
- :class:`codetool.tools.cache.CacheBackend`: StableToolBench's response cache, replayed and
  written through in its own layout.
- :class:`codetool.tools.clients.HTTPBackend`: plain HTTP for OpenAPI services (TMDB).
- :class:`codetool.tools.simulator.SimulatorBackend`: deterministic offline answers.
- :class:`FallbackBackend`: tries backends in order (e.g. cache -> server -> simulator), records
  every fallback in ``ToolResponse.fallbacks`` and writes real answers through to the cache.

Guarantees: ``call`` never raises (:func:`safe_call` turns a backend's bug into an ``error``
response). Keys are sent only in headers/bodies of the request, never logged, and redacted from
every error message and recorded response.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from codetool import CodetoolError
from codetool.secrets import redact
from codetool.tools.cache import CacheBackend
from codetool.tools.clients import HTTPBackend, StableToolBenchClient
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import APISpec, ToolBackend, ToolResponse

logger = logging.getLogger(__name__)

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
BACKENDS: dict[str, Callable[..., ToolBackend]] = {  # classes and factories, held to the ToolBackend seam
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
