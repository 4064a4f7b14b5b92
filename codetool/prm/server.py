"""``codetool serve-prm --prm DIR --port N``: the PRM over HTTP JSON (DESIGN.md §5b).

``POST /score`` with ``{"items": [{"query", "tools", "history", "candidate", "candidate_plan",
"candidate_output"}, ...]}`` answers ``{"scores": [float in [0, 1], ...]}``; ``GET /health``
answers ``{"status": "ok", "prm": ...}``. Concurrent requests are queued and scored together (up
to ``max_batch_items`` items, waiting at most ``batch_wait_ms`` for company), so candidates from
several searches share one forward pass and siblings still share their prefix.

Safety: the app is wrapped in ``codetool.serving.ServerGuard``, the guard of every codetool
server: binds 127.0.0.1 by default; on any other address it refuses to start unless the
environment variable ``api_key_env`` holds a key, then checks ``Authorization: Bearer <key>`` on
every request (also on loopback when the variable is set). Bodies over ``max_body_bytes`` or
chunked get 413/411, JSON nested too deeply 400, a body not received within ``read_timeout_s``
408 (all from the guard); more than ``max_items`` items 413, malformed JSON or items 400, a
request not scored within ``request_timeout_s`` 504; every error body is
``{"error": "<one line>"}``, never a traceback.

Robustness (issue 19): one client cannot stall the others.

- Text is cleaned on arrival (lone surrogates such as ``"\ud800"`` become U+FFFD), so no item
  can make the tokenizer raise; JSON nested too deeply is a 400 (the guard's depth limit, and the
  parser's own as a backstop); an item with more than
  ``max_history_steps`` history steps is a 413 (a work budget: a 20,000-step history is abuse).
- The body must arrive within ``read_timeout_s`` (408), and request heads within the header
  deadline of ``codetool.serving`` (slow-loris connections are closed).
- Each request has a work budget (``request_timeout_s``): when it runs out the client gets 504
  and the server stops working on it (its items are skipped at the next check, between items).
- Requests whose body exceeds ``heavy_body_bytes`` are scored in their own lane (a second worker),
  so a huge item does not queue the small requests of everybody else behind it.
- If scoring a batch fails, each request of it is retried alone, then each item of a failing
  request alone: only the request holding the bad item gets its error (422, naming the item).
"""

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.jsonl import clean_text
from codetool.rewards import PRMItem
from codetool.secrets import key_from_env
from codetool.serving import (
    ServerGuard,
    check_bind,
    json_internal_errors,
    serve_forever,
    serve_in_background,
)

logger = logging.getLogger(__name__)

_TEXT_FIELDS = ("query", "tools", "candidate", "candidate_output", "candidate_plan", "step_text", "previous_steps",
                "parent_result")
GUARD_GRACE_S = 5.0  # the guard's deadline is the scoring budget plus this (see create_app)


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
    request_timeout_s: float = option(120.0, "a request not scored by then gets 504 (and its work stops)")
    read_timeout_s: float = option(30.0, "a request body not received by then gets 408")
    max_history_steps: int = option(1000, "an item with a longer history gets 413 (a work budget)")
    heavy_body_bytes: int = option(262_144, "bodies larger than this are scored in their own lane")
    device: str = option("auto", "auto, cpu or cuda")

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}.")
        for name in ("max_body_bytes", "max_items", "max_batch_items", "max_history_steps", "heavy_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("request_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:  # also refuses nan
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}.")


class _Reject(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def parse_items(body: bytes, max_items: int, max_history_steps: int = 1000) -> list[PRMItem]:
    """Validate a ``/score`` body; raises ``_Reject`` with a 4xx status and a one-line reason.
    Text fields come back cleaned (``codetool.jsonl.clean_text``). JSON nested too deeply for the
    parser (e.g. a 100,000-deep array; a valid body nests 5 levels) is a 400."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise _Reject(400, "JSON nested too deeply; a /score body nests at most 5 levels") from None
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
        if isinstance(history, list) and len(history) > max_history_steps:  # a work budget per item
            raise _Reject(413, f"items[{i}].history has {len(history)} steps; the limit is {max_history_steps}")
        if not isinstance(history, list) or not all(
                isinstance(h, dict) and all(isinstance(h.get(k, ""), str) for k in ("code", "output", "plan"))
                for h in history):
            raise _Reject(400, f"items[{i}].history must be a list of {{'code', 'output'}} text objects")
        items.append(PRMItem(
            query=clean_text(raw["query"]), tools=clean_text(raw.get("tools", "")),
            history=[{"code": clean_text(h.get("code", "")), "output": clean_text(h.get("output", "")),
                      **({"plan": clean_text(h["plan"])} if h.get("plan") else {})} for h in history],
            candidate=clean_text(raw.get("candidate", "")), candidate_output=clean_text(raw.get("candidate_output", "")),
            candidate_plan=clean_text(raw.get("candidate_plan", "")),
            **{name: clean_text(raw.get(name, "")) for name in _TEXT_FIELDS[5:]}))
    return items


class _Job:
    """One request in the queue: its items, its future, and its work deadline (monotonic s)."""

    def __init__(self, items: list[PRMItem], future: asyncio.Future, deadline: float):
        self.items, self.future, self.deadline = items, future, deadline

    def abandoned(self) -> bool:
        # Read from the worker thread: a done future (timed out, client gone) is never set again.
        return self.future.done() or time.monotonic() > self.deadline


class _Batcher:
    """Collects concurrent requests and scores them in one worker thread, one batch at a time.

    A failing batch is retried request by request, and a failing request item by item, so only
    the request with the bad item fails. Work for a request whose deadline passed is skipped.
    """

    def __init__(self, scorer, max_batch_items: int, wait_s: float):
        self.scorer, self.max_batch_items, self.wait_s = scorer, max_batch_items, wait_s
        self.queue: asyncio.Queue = asyncio.Queue()

    async def submit(self, items: list[PRMItem], timeout_s: float) -> list[float]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(items, future, time.monotonic() + timeout_s))
        return await asyncio.wait_for(future, timeout_s)

    def _prepare(self, jobs: list[_Job]) -> list[_Job | tuple[_Job, Exception]]:
        """Encode each job's items (filling the scorer's prefix cache) with a deadline check between
        items; a job whose item fails to encode is returned with its error."""
        encode = getattr(getattr(self.scorer, "encoder", None), "encode", None)
        out: list = []
        for job in jobs:
            if job.abandoned():
                continue
            if encode is None:
                out.append(job)
                continue
            try:
                for i, item in enumerate(job.items):
                    if job.abandoned():
                        break
                    try:
                        encode(item)
                    except Exception as e:
                        raise _Reject(422, f"items[{i}] cannot be scored ({type(e).__name__}: {str(e)[:120]})") from e
                else:
                    out.append(job)
            except _Reject as e:
                out.append((job, e))
        return out

    def _score_jobs(self, jobs: list[_Job]) -> list[tuple[_Job, list[float] | Exception]]:
        """Scores for ``jobs``, together if possible; on failure each job alone, then item by item."""
        flat = [item for job in jobs for item in job.items]
        try:
            scores = self.scorer.score(flat) if flat else []
        except Exception as e:
            if len(jobs) == 1:
                return [(jobs[0], self._locate(jobs[0], e))]
            logger.warning("PRM scoring of a %d-request batch failed (%s); scoring each request alone",
                           len(jobs), type(e).__name__)
            return [pair for job in jobs if not job.abandoned() for pair in self._score_jobs([job])]
        results, start = [], 0
        for job in jobs:
            results.append((job, scores[start:start + len(job.items)]))
            start += len(job.items)
        return results

    def _locate(self, job: _Job, error: Exception) -> Exception:
        """The error of a failing request, naming its first item that fails alone when there is one."""
        if len(job.items) > 1:
            for i, item in enumerate(job.items):
                if job.abandoned():
                    break
                try:
                    self.scorer.score([item])
                except Exception as e:
                    logger.warning("PRM item %d of a request failed: %s: %s", i, type(e).__name__, e)
                    return _Reject(422, f"items[{i}] cannot be scored ({type(e).__name__}); the other items are fine")
        logger.error("PRM scoring failed: %s: %s", type(error).__name__, error)
        return error

    def _work(self, jobs: list[_Job]):
        prepared = self._prepare(jobs)
        failed = [p for p in prepared if isinstance(p, tuple)]
        ready = [p for p in prepared if not isinstance(p, tuple) and not p.abandoned()]
        return failed + (self._score_jobs(ready) if ready else [])

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            total, deadline = len(batch[0].items), loop.time() + self.wait_s
            while total < self.max_batch_items and (left := deadline - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), left))
                except asyncio.TimeoutError:
                    break
                total += len(batch[-1].items)
            batch = [job for job in batch if not job.abandoned()]  # drop timed-out requests
            if not batch:
                continue
            try:
                outcomes = await asyncio.to_thread(self._work, batch)
            except Exception as e:  # a bug here must not kill the worker
                logger.exception("PRM batch worker failed")
                outcomes = [(job, e) for job in batch]
            for job, outcome in outcomes:
                if job.future.done():
                    continue
                if isinstance(outcome, Exception):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)


def create_app(scorer, *, api_key: str | None = None, name: str = "prm", max_body_bytes: int = 4_000_000,
               max_items: int = 256, max_batch_items: int = 64, batch_wait_ms: float = 5.0,
               request_timeout_s: float = 120.0, read_timeout_s: float = 30.0, max_history_steps: int = 1000,
               heavy_body_bytes: int = 262_144):
    """The guarded app around ``scorer`` (any object with ``score(items)``); see the module docstring.

    Returns:
        A :class:`codetool.serving.ServerGuard` around the FastAPI app. Its own request deadline
        is ``request_timeout_s`` plus a grace of ``GUARD_GRACE_S``: a backstop, so the scorer's
        budget answers first with its precise 504 (and stops the work).
    """
    from contextlib import asynccontextmanager

    # FastAPI reads these annotations at definition time, hence no `from __future__ import annotations`.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    batcher = _Batcher(scorer, max_batch_items, batch_wait_ms / 1000.0)
    heavy = _Batcher(scorer, max_batch_items, 0.0)  # the lane of large bodies

    @asynccontextmanager
    async def lifespan(app):
        tasks = [asyncio.create_task(batcher.run()), asyncio.create_task(heavy.run())]
        yield
        for task in tasks:
            task.cancel()

    app = FastAPI(title="codetool PRM", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, reason: str) -> JSONResponse:
        return JSONResponse({"error": reason}, status_code=status)

    json_internal_errors(app, "error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "prm": name}

    @app.post("/score")
    async def score(request: Request):
        body = await request.body()  # already read (within read_timeout_s) and size-checked by the guard
        try:
            if len(body) > 65_536:  # parse big bodies off the event loop, so other requests keep flowing
                items = await asyncio.to_thread(parse_items, body, max_items, max_history_steps)
            else:
                items = parse_items(body, max_items, max_history_steps)
        except _Reject as e:
            return error(e.status, e.reason)
        lane = heavy if len(body) > heavy_body_bytes else batcher
        try:
            scores = await lane.submit(items, request_timeout_s)
        except asyncio.TimeoutError:
            return error(504, f"not scored within {request_timeout_s:g} s; retry or send fewer items")
        except _Reject as e:
            return error(e.status, e.reason)
        except Exception as e:
            return error(500, f"scoring failed ({type(e).__name__}); see the server log")
        return {"scores": scores}

    return ServerGuard(app, api_key=api_key, max_body_bytes=max_body_bytes, read_timeout_s=read_timeout_s,
                       request_timeout_s=request_timeout_s + GUARD_GRACE_S, error_field="error")


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0):
    """Serve the PRM ``app`` in a background thread; yields its base URL (tests, benchmarks)."""
    return serve_in_background(app, host, port, name="the PRM server")


def serve_prm(cfg: ServePRMConfig) -> int:
    """Load the PRM and serve it until interrupted."""
    from codetool.prm.scorer import load_scorer

    api_key = key_from_env(cfg.api_key_env)
    check_bind(cfg.host, api_key, what="serve-prm", api_key_env=cfg.api_key_env)
    from codetool.models.spec import ModelSpec

    if ModelSpec.parse(cfg.prm, role="prm").kind in ("server", "none"):
        raise CodetoolError(f"serve-prm needs a checkpoint folder, got --prm {cfg.prm!r}.")
    scorer = load_scorer(cfg.prm, device=cfg.device)
    app = create_app(scorer, api_key=api_key, name=cfg.prm, max_body_bytes=cfg.max_body_bytes,
                     max_items=cfg.max_items, max_batch_items=cfg.max_batch_items,
                     batch_wait_ms=cfg.batch_wait_ms, request_timeout_s=cfg.request_timeout_s,
                     read_timeout_s=cfg.read_timeout_s, max_history_steps=cfg.max_history_steps,
                     heavy_body_bytes=cfg.heavy_body_bytes)
    logger.info("serving PRM %s on http://%s:%d (auth %s)", cfg.prm, cfg.host, cfg.port,
                "on" if api_key else "off")
    serve_forever(app, cfg.host, cfg.port)
    return 0
