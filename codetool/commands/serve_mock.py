"""``codetool serve-mock tmdb|openapi|stabletoolbench [--port N] [--host H]``: serve a mock API until interrupted.

    codetool serve-mock openapi --spec examples/library/openapi.json --port 8000
    codetool serve-mock stabletoolbench --queries my_queries.json --port 8080

The apps are :mod:`codetool.tools.mock_servers`' (any REST API built from its OpenAPI spec, TMDB's
by default; a StableToolBench-compatible ``/virtual`` server), behind the guard of every codetool server;
:func:`build_mock_app` builds the one the settings name (tests and benchmarks call it directly).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.serving import check_bind
from codetool.tools.mock_servers import (
    MOCK_MAX_BODY_BYTES,
    build_openapi_app,
    build_stabletoolbench_app,
    build_tmdb_app,
)

logger = logging.getLogger(__name__)


@dataclass
class ServeMockConfig:
    """Options of ``codetool serve-mock``."""

    kind: str = option("tmdb", "which mock to serve: tmdb (RestBench's TMDB, or --spec), openapi (any --spec: every "
                       "method it declares, example responses), stabletoolbench (its /virtual server)",
                       choices=("tmdb", "openapi", "stabletoolbench"), positional=True)
    host: str = option("127.0.0.1", "address to bind; anything but loopback requires the API key variable")
    port: int = option(8000, "port to listen on")
    api_key_env: str = option("CODETOOL_MOCK_API_KEY", "environment variable holding the API key "
                              "(required off loopback; checked whenever set)")
    spec: str | None = option(None, "OpenAPI 3 spec (JSON or YAML) to serve [tmdb default: "
                              "<data>/RestGPT/specs/tmdb_oas.json]")
    queries: list[str] = option(default_factory=list, help="stabletoolbench: query files or folders documenting "
                                "the APIs (ToolBench format) [default: the six test groups]")
    cache_dir: str | None = option(None, "StableToolBench response cache to replay before simulating")
    seed: int = option(0, "simulator seed")
    max_body_bytes: int = option(MOCK_MAX_BODY_BYTES, "largest accepted request body, in bytes")
    timeout_s: float = option(30.0, "longest time a request may take, in seconds")

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ConfigError(f"port: got {self.port}; use 1-65535 (e.g. 8000).")
        if self.max_body_bytes <= 0 or self.timeout_s <= 0:
            raise ConfigError("max_body_bytes and timeout_s must be positive.")
        if self.kind == "openapi" and not self.spec:
            raise ConfigError("serve-mock openapi needs --spec FILE (an OpenAPI 3 spec, JSON or YAML).")


def build_mock_app(cfg: ServeMockConfig, api_key: str | None = None):
    """The guarded ASGI app for ``cfg`` (what ``serve-mock`` runs; tests call it directly)."""
    from codetool.tools.data import data_root

    limits = {"api_key": api_key, "max_body_bytes": cfg.max_body_bytes, "timeout_s": cfg.timeout_s}
    if cfg.kind in ("tmdb", "openapi"):
        from codetool.tools.files import load_tools
        from codetool.tools.openapi import load_openapi

        spec = Path(cfg.spec) if cfg.spec else data_root() / "RestGPT" / "specs" / "tmdb_oas.json"
        if cfg.kind == "tmdb":
            return build_tmdb_app(load_openapi(spec, tool="tmdb"), **limits)
        apis = load_tools(spec, flag="--spec")
        return build_openapi_app(apis, title=f"{apis[0].tool if apis else spec.stem} mock (codetool)", **limits)
    else:
        from codetool.tools.files import load_queries
        from codetool.tools.loaders import STABLETOOLBENCH_GROUPS, load_stabletoolbench

        if cfg.cache_dir is not None and not Path(cfg.cache_dir).is_dir():
            raise CodetoolError(f"--cache_dir {cfg.cache_dir}: {'not a folder' if Path(cfg.cache_dir).exists() else 'not found'}; "
                                "pass StableToolBench's response-cache folder (<category>/<tool>/<api>.json), or "
                                "leave it out to simulate every answer.")
        if cfg.queries:
            queries = [q for path in cfg.queries for q in load_queries(Path(path))]
        else:
            queries = [q for g in STABLETOOLBENCH_GROUPS for q in load_stabletoolbench(g)]
        apis = [api for q in queries for api in q.apis]
        if not apis:
            raise CodetoolError(f"--queries {' '.join(cfg.queries or ['(the StableToolBench groups)'])}: no API "
                                f"documented ({len(queries)} queries, none with an api_list); the mock would answer "
                                "nothing. Pass StableToolBench/ToolBench query files.")
    return build_stabletoolbench_app(apis, cache_dir=cfg.cache_dir, seed=cfg.seed, **limits)


def serve_mock(cfg: ServeMockConfig) -> int:
    """``codetool serve-mock tmdb|openapi|stabletoolbench [--port N] [--host H]``: serve until interrupted."""
    from codetool.secrets import key_from_env
    from codetool.serving import serve_forever

    api_key = key_from_env(cfg.api_key_env)
    check_bind(cfg.host, api_key, what=f"serve-mock {cfg.kind}", api_key_env=cfg.api_key_env)
    app = build_mock_app(cfg, api_key)
    path = "/virtual" if cfg.kind == "stabletoolbench" else "/"
    logger.info("serving the %s mock on http://%s:%d%s%s", cfg.kind, cfg.host, cfg.port, path,
                " (API key required)" if api_key else "")
    serve_forever(app, cfg.host, cfg.port)
    return 0


