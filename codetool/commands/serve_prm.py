"""``codetool serve-prm --prm DIR --port N``: serve a PRM over HTTP until interrupted.

The app is :func:`codetool.prm.server.create_app` (batching of concurrent requests, fair turns
per client, the guard of every codetool server); this command loads the scorer, checks the bind
address against the API key and serves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.models.spec import ModelSpec

logger = logging.getLogger(__name__)


@dataclass
class ServePRMConfig:
    """Settings of ``codetool serve-prm``."""

    prm: str = option("checkpoints/prm/quickstart", "PRM checkpoint folder (or vllm:FOLDER on a GPU)")
    host: str = option("127.0.0.1", "address to bind; anything but loopback needs an API key")
    port: int = option(8600, "TCP port")
    api_key_env: str = option("CODETOOL_PRM_API_KEY", "environment variable holding the bearer key; several keys, "
                              "comma-separated, one per client: the server is then fair between keys, whatever "
                              "connections or addresses a client uses")
    max_body_bytes: int = option(4_000_000, "largest request body accepted")
    max_items: int = option(256, "most items in one request")
    max_batch_items: int = option(64, "most items scored in one forward pass across requests")
    batch_wait_ms: float = option(5.0, "how long a request waits for others to batch with")
    request_timeout_s: float = option(120.0, "a request not scored by then gets 504 (and its work stops)")
    read_timeout_s: float = option(30.0, "a request body not received by then gets 408")
    max_history_steps: int = option(1000, "an item with a longer history gets 413 (a work budget)")
    max_batch_tokens: int = option(8192, "tokens of one batch handed to the scorer (fair turns are cut in these)")
    workers: int = option(2, "threads scoring batches at once")
    max_connections_per_client: int = option(64, "open connections one address may hold (over it, the one idle "
                                             "longest is closed to make room)")
    device: str = option("auto", "auto, cpu or cuda")

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}.")
        for name in ("max_body_bytes", "max_items", "max_batch_items", "max_history_steps", "max_batch_tokens",
                     "workers", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("request_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:  # also refuses nan
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}.")
        self.prm_spec = ModelSpec.parse(self.prm, role="prm")  # parsed once (not a setting)


def serve_prm(cfg: ServePRMConfig) -> int:
    """Load the PRM and serve it until interrupted."""
    from codetool.prm.scorer import load_scorer
    from codetool.prm.server import create_app
    from codetool.secrets import key_from_env
    from codetool.serving import check_bind, serve_forever

    api_key = key_from_env(cfg.api_key_env)
    check_bind(cfg.host, api_key, what="serve-prm", api_key_env=cfg.api_key_env)
    if cfg.prm_spec.kind in ("server", "none"):
        raise CodetoolError(f"serve-prm needs a checkpoint folder, got --prm {cfg.prm!r}.")
    scorer = load_scorer(cfg.prm_spec, device=cfg.device)
    app = create_app(scorer, api_key=api_key, name=cfg.prm, max_body_bytes=cfg.max_body_bytes,
                     max_items=cfg.max_items, max_batch_items=cfg.max_batch_items,
                     batch_wait_ms=cfg.batch_wait_ms, request_timeout_s=cfg.request_timeout_s,
                     read_timeout_s=cfg.read_timeout_s, max_history_steps=cfg.max_history_steps,
                     max_batch_tokens=cfg.max_batch_tokens, workers=cfg.workers,
                     max_connections_per_client=cfg.max_connections_per_client)
    logger.info("serving PRM %s on http://%s:%d (auth %s)", cfg.prm, cfg.host, cfg.port,
                "on" if api_key else "off")
    serve_forever(app, cfg.host, cfg.port)
    return 0
