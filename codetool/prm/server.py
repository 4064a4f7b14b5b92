"""``codetool serve-prm --prm DIR --port N``: the PRM over HTTP JSON (DESIGN.md §5b).

``POST /score`` with ``{"items": [{"query", "tools", "history", "candidate",
"candidate_output"}, ...]}`` answers ``{"scores": [float in [0, 1], ...]}``; ``GET /health``
answers ``{"status": "ok", "prm": ...}``. Concurrent requests are queued and scored together (up
to ``max_batch_items`` items, waiting at most ``batch_wait_ms`` for company), so candidates from
several searches share one forward pass and siblings still share their prefix.

Safety: binds 127.0.0.1 by default; on any other address it refuses to start unless the
environment variable ``api_key_env`` holds a key, then checks ``Authorization: Bearer <key>`` on
every request (also on loopback when the variable is set). Bodies over ``max_body_bytes`` or
without a Content-Length get 413/411, more than ``max_items`` items 413, malformed JSON or items
400, a request not scored within ``request_timeout_s`` 504; every error body is
``{"error": "<one line>"}``, never a traceback.
"""

import asyncio
import hmac
import json
import logging
import os
from dataclasses import dataclass

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.rewards import PRMItem
from codetool.serving import serve_in_background

logger = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_TEXT_FIELDS = ("query", "tools", "candidate", "candidate_output")


@dataclass
class ServePRMConfig:
    """Settings of ``codetool serve-prm``."""

    prm: str = option("checkpoints/prm/quickstart", "PRM checkpoint folder (or vllm:FOLDER on a GPU)")
    host: str = option("127.0.0.1", "address to bind; anything but loopback needs an API key")
    port: int = option(8600, "TCP port")
    api_key_env: str = option("CODETOOL_PRM_API_KEY", "environment variable holding the bearer key")
    max_body_bytes: int = option(4_000_000, "largest request body accepted")
    max_items: int = option(256, "most items in one request")
    max_batch_items: int = option(64, "most items scored in one forward pass across requests")
    batch_wait_ms: float = option(5.0, "how long a request waits for others to batch with")
    request_timeout_s: float = option(120.0, "a request not scored by then gets 504")
    device: str = option("auto", "auto, cpu or cuda")

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}.")
        for name in ("max_body_bytes", "max_items", "max_batch_items"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")


class _Reject(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def parse_items(body: bytes, max_items: int) -> list[PRMItem]:
    """Validate a ``/score`` body; raises ``_Reject`` with a 4xx status and a one-line reason."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise _Reject(400, "body is not valid JSON; send {\"items\": [...]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise _Reject(400, "body must be a JSON object with an 'items' list")
    if len(data["items"]) > max_items:
        raise _Reject(413, f"{len(data['items'])} items in one request; the limit is {max_items}")
    items = []
    for i, raw in enumerate(data["items"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("query"), str):
            raise _Reject(400, f"items[{i}] must be an object with a text 'query'")
        for name in _TEXT_FIELDS[1:]:
            if not isinstance(raw.get(name, ""), str):
                raise _Reject(400, f"items[{i}].{name} must be text")
        history = raw.get("history", [])
        if not isinstance(history, list) or not all(
                isinstance(h, dict) and all(isinstance(h.get(k, ""), str) for k in ("code", "output"))
                for h in history):
            raise _Reject(400, f"items[{i}].history must be a list of {{'code', 'output'}} text objects")
        items.append(PRMItem(query=raw["query"], tools=raw.get("tools", ""),
                             history=[{"code": h.get("code", ""), "output": h.get("output", "")} for h in history],
                             candidate=raw.get("candidate", ""), candidate_output=raw.get("candidate_output", "")))
    return items


class _Batcher:
    """Collects concurrent requests and scores them in one worker thread, one batch at a time."""

    def __init__(self, scorer, max_batch_items: int, wait_s: float):
        self.scorer, self.max_batch_items, self.wait_s = scorer, max_batch_items, wait_s
        self.queue: asyncio.Queue = asyncio.Queue()

    async def submit(self, items: list[PRMItem]) -> list[float]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((items, future))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            total, deadline = len(batch[0][0]), loop.time() + self.wait_s
            while total < self.max_batch_items and (left := deadline - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), left))
                except asyncio.TimeoutError:
                    break
                total += len(batch[-1][0])
            batch = [(items, fut) for items, fut in batch if not fut.done()]  # drop timed-out requests
            flat = [item for items, _ in batch for item in items]
            try:
                scores = await asyncio.to_thread(self.scorer.score, flat) if flat else []
            except Exception as e:  # reported to each waiting request as a 500, never a traceback
                logger.exception("PRM scoring failed")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            start = 0
            for items, fut in batch:
                if not fut.done():
                    fut.set_result(scores[start:start + len(items)])
                start += len(items)


def create_app(scorer, *, api_key: str | None = None, name: str = "prm", max_body_bytes: int = 4_000_000,
               max_items: int = 256, max_batch_items: int = 64, batch_wait_ms: float = 5.0,
               request_timeout_s: float = 120.0):
    """The FastAPI app around ``scorer`` (any object with ``score(items)``); see the module docstring."""
    from contextlib import asynccontextmanager

    # FastAPI reads these annotations at definition time, hence no `from __future__ import annotations`.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    batcher = _Batcher(scorer, max_batch_items, batch_wait_ms / 1000.0)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app = FastAPI(title="codetool PRM", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, reason: str) -> JSONResponse:
        return JSONResponse({"error": reason}, status_code=status)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error(401, "missing or wrong bearer token (Authorization: Bearer <key>)")
        if request.method == "POST":
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return error(411, "a Content-Length header is required")
            if int(length) > max_body_bytes:
                return error(413, f"body of {length} bytes; the limit is {max_body_bytes}")
        try:
            return await call_next(request)
        except Exception as e:  # a bug must not leak a traceback to the client
            logger.exception("PRM server error")
            return error(500, f"internal error ({type(e).__name__}); see the server log")

    @app.get("/health")
    async def health():
        return {"status": "ok", "prm": name}

    @app.post("/score")
    async def score(request: Request):
        body = await request.body()
        if len(body) > max_body_bytes:
            return error(413, f"body over {max_body_bytes} bytes")
        try:
            items = parse_items(body, max_items)
        except _Reject as e:
            return error(e.status, e.reason)
        try:
            scores = await asyncio.wait_for(batcher.submit(items), request_timeout_s)
        except asyncio.TimeoutError:
            return error(504, f"not scored within {request_timeout_s} s; retry or send fewer items")
        except Exception as e:
            return error(500, f"scoring failed ({type(e).__name__}); see the server log")
        return {"scores": scores}

    return app


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0):
    """Serve the PRM ``app`` in a background thread; yields its base URL (tests, benchmarks)."""
    return serve_in_background(app, host, port, name="the PRM server")


def serve_prm(cfg: ServePRMConfig) -> int:
    """Load the PRM and serve it until interrupted."""
    import uvicorn

    from codetool.prm.scorer import load_scorer

    api_key = os.environ.get(cfg.api_key_env) or None
    if cfg.host not in _LOOPBACK and api_key is None:
        raise CodetoolError(f"serve-prm on {cfg.host} needs an API key: set the environment variable "
                            f"{cfg.api_key_env} (clients send it as a bearer token), or bind 127.0.0.1.")
    if cfg.prm.startswith(("http://", "https://")) or cfg.prm.lower() in ("", "none"):
        raise CodetoolError(f"serve-prm needs a checkpoint folder, got --prm {cfg.prm!r}.")
    scorer = load_scorer(cfg.prm, device=cfg.device)
    app = create_app(scorer, api_key=api_key, name=cfg.prm, max_body_bytes=cfg.max_body_bytes,
                     max_items=cfg.max_items, max_batch_items=cfg.max_batch_items,
                     batch_wait_ms=cfg.batch_wait_ms, request_timeout_s=cfg.request_timeout_s)
    logger.info("serving PRM %s on http://%s:%d (auth %s)", cfg.prm, cfg.host, cfg.port,
                "on" if api_key else "off")
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", timeout_keep_alive=5)
    return 0
