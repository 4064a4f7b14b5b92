"""The PRM over HTTP JSON (docs/DESIGN.md §5b): :func:`create_app`, which ``codetool serve-prm --prm
DIR --port N`` (``codetool.commands.serve_prm``) serves.

``POST /score`` with ``{"items": [{"query", "tools", "history", "candidate", "candidate_plan",
"candidate_output"}, ...]}`` answers ``{"scores": [float in [0, 1], ...]}``; ``GET /health``
answers ``{"status": "ok", "prm": ..., "workers", "workers_alive", "worker_restarts"}``, or 503 with
``"unhealthy"`` when a scoring worker had died (it is restarted then; a dead worker is never hidden
behind an ok); ``/openapi.json`` and ``/docs`` describe the fields (:mod:`codetool.prm.schema`), and
bodies are checked by :mod:`codetool.prm.parse` (an unknown field is a 422 naming it; an empty
``items`` list is answered at once, never queued). Concurrent requests are queued and scored together (up
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
- Clients are served fairly by token count (issues 27, 39). A client is its API key (with one key
  per client) or its connection, never its address (:mod:`codetool.fairness`): one process on 16
  loopback addresses is not 16 clients, and another process on 127.0.0.1 is not the same one.
  Items of all requests are scored in batches of at most ``max_batch_tokens`` tokens by
  ``workers`` threads; each item gets a start-time fair queuing tag (its client's previous tag, or
  the virtual time, plus its estimated tokens), a batch starts with the smallest tag and takes
  the next items of alike cost (concurrent requests share a forward pass, a short item never
  rides with long ones), and while others wait, a client has at most one batch being scored;
  while short items keep coming, the last idle worker is kept for them. A one-item request
  therefore waits for neither another client's queue nor its long batches, however many
  connections that client opens.
- Large bodies are parsed one at a time, in fair order (:class:`~codetool.fairness.FairTurns`),
  in a thread and in pieces (:func:`~codetool.fairness.loads_without_stalling`), so ``/health``
  and small requests keep flowing; a body of more than ``max_json_members`` values is a 413
  before it is parsed.
- If scoring a batch fails, each item of it is scored alone: only the request holding the bad
  item gets its error (422, naming the item).
- The guard (``codetool.serving``) caps the connections and the body bytes in flight per client
  and in all.
"""

import asyncio
import logging
import threading
import time
from collections import deque

from codetool import CodetoolError, __version__
from codetool.fairness import FairTurns
from codetool.prm.parse import _Reject, parse_items
from codetool.prm.schema import API_DESCRIPTION, ErrorResponse, HealthResponse, ScoreResponse, install_openapi
from codetool.rewards import PRMItem
from codetool.serving import (
    ServerGuard,
    json_internal_errors,
    serve_in_background,
)

logger = logging.getLogger(__name__)

GUARD_GRACE_S = 5.0  # the guard's deadline is the scoring budget plus this (see create_app)
# Values in one /score body: 256 items of 100 history steps hold ~80,000; a 3.9 MB object of
# 300,000 keys is refused before it is parsed.
MAX_JSON_MEMBERS = 200_000
# Items of other requests join a batch when they cost at most this many times its first item (or
# this many tokens): alike items share a forward pass, a short one never waits for long ones.
COMPANION_RATIO, COMPANION_TOKENS = 4, 256
# The last idle worker is kept for light items (an eighth of max_batch_tokens at most) while one
# came within this many seconds, so a short request never waits for a long batch to end.
LIGHT_HOLD_S = 2.0


class _Job:
    """One request in the queue: its items, their scores so far, its client (``codetool.fairness``
    id), each item's fair-queuing finish tag, and its work deadline (monotonic s). The future
    belongs to the event loop that waits for it."""

    def __init__(self, items: list[PRMItem], future: asyncio.Future, loop, deadline: float, client: str):
        self.items, self.future, self.loop, self.deadline, self.client = items, future, loop, deadline, client
        self.tags: list[float] = []  # set by the scheduler when queued
        self.scores: list[float | None] = [None] * len(items)
        self.taken = 0  # items handed to a worker so far
        self.left = len(items)  # items not scored yet
        self.failed = False

    def abandoned(self) -> bool:
        # Read from the worker threads: a done future (timed out, client gone) is never set again.
        return self.failed or self.future.done() or time.monotonic() > self.deadline

    def deliver(self, outcome) -> None:
        def settle():
            if not self.future.done():
                if isinstance(outcome, BaseException):
                    self.future.set_exception(outcome)
                else:
                    self.future.set_result(outcome)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the server stopped meanwhile: nobody waits for it
            pass


class _Scheduler:
    """Scores the items of every request in worker threads, fairly between clients.

    Start-time fair queuing over clients (``codetool.fairness`` ids: a key or a connection): each
    queued item is tagged ``max(virtual time, its client's last tag) + its tokens``; a batch of at
    most ``max_batch_tokens`` **tokens** starts with the smallest tag and takes the next smallest
    among items of alike cost (:meth:`_fill`). A large request is spread over many batches, so a
    one-item request of another client, tagged a few tokens past the virtual time, goes next. The
    virtual time is the start tag of the last batch's first item. The tokens an item really had
    once encoded correct its client's tags, and while other clients wait a client has at most
    one batch being scored, so with two workers one client's long items never hold every worker.
    An item's cost before encoding is estimated from its characters (capped at the format's
    ``max_length``). With two workers or more, the last idle one is kept for light items (at most
    an eighth of ``max_batch_tokens``) while such items keep coming (within ``LIGHT_HOLD_S``): long
    batches then hold every worker but one, and a short request waits for none of them.

    If scoring a batch fails, its items are scored one by one: only the request holding the bad
    item gets its error (422, naming the item). Work for a request whose deadline passed is
    skipped.
    """

    def __init__(self, scorer, *, max_batch_items: int, max_batch_tokens: int, wait_s: float, workers: int):
        self.scorer, self.max_items, self.max_tokens, self.wait_s = scorer, max_batch_items, max_batch_tokens, wait_s
        encoder = getattr(scorer, "encoder", None)
        self.encode = getattr(encoder, "encode", None)
        self.max_length = getattr(getattr(encoder, "fmt", None), "max_length", 2048)
        self.cond = threading.Condition()
        self.queues: dict[str, deque[_Job]] = {}
        self.last: dict[str, float] = {}  # each client's last finish tag
        self.vtime = 0.0
        self.light = max(1, max_batch_tokens // 8)  # an item this small may use the last idle worker
        self.light_at = float("-inf")  # when the last light item came
        self.working = 0  # batches being scored
        self.busy: dict[str, int] = {}  # batches in the workers holding the client's items
        self.ring: deque[str] = deque()  # clients with queued items
        self.oldest = 0.0  # when the oldest waiting item arrived
        self.stopped = False
        self.restarts = 0
        self.threads = [self._thread(i) for i in range(max(1, workers))]

    def _thread(self, i: int) -> threading.Thread:
        thread = threading.Thread(target=self._work, name=f"codetool-prm-worker-{i}", daemon=True)
        thread.start()
        return thread

    def alive(self) -> int:
        """How many scoring threads are alive."""
        return sum(thread.is_alive() for thread in self.threads)

    def revive(self) -> int:
        """Restart the scoring threads that died; returns how many were dead (``/health`` reports
        them: a dead worker is never hidden behind an ok)."""
        dead = [i for i, thread in enumerate(self.threads) if not thread.is_alive()]
        if dead and not self.stopped:
            logger.error("%d of %d PRM scoring workers had died; restarting them", len(dead), len(self.threads))
            for i in dead:
                self.threads[i] = self._thread(i)
            self.restarts += len(dead)
        return len(dead)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    async def submit(self, items: list[PRMItem], timeout_s: float, client: str) -> list[float]:
        if not items:  # nothing to score: never queued (an empty job once killed every worker)
            return []
        self.revive()
        loop = asyncio.get_running_loop()
        job = _Job(items, loop.create_future(), loop, time.monotonic() + timeout_s, client)
        with self.cond:
            if client not in self.queues or not self.queues[client]:
                self.queues.setdefault(client, deque())
                if client not in self.ring:
                    self.ring.append(client)
            if not any(self.queues.values()):
                self.oldest = time.monotonic()
            tag = max(self.vtime, self.last.get(client, 0.0))
            for item in items:
                cost = self._estimate(item)
                tag += cost
                job.tags.append(tag)
                if cost <= self.light:
                    self.light_at = time.monotonic()
            self.last[client] = tag
            if len(self.last) > 4096:  # clients the virtual time passed are like new ones
                self.last = {c: t for c, t in self.last.items() if t > self.vtime or self.queues.get(c)}
            self.queues[client].append(job)
            self.cond.notify()
        return await asyncio.wait_for(job.future, timeout_s)

    def _estimate(self, item: PRMItem) -> int:
        chars = len(item.query) + len(item.tools) + len(item.candidate) + len(item.candidate_output) + sum(
            len(h.get("code", "")) + len(h.get("output", "")) for h in item.history)
        return min(self.max_length, 16 + chars // 4)

    # -------------------------------------------------------------------------- the workers
    def _work(self) -> None:
        while True:
            try:
                batch = self._take()
            except Exception:  # a bug in the scheduling must not take the worker (and every later request) down
                logger.exception("PRM scheduling failed; the waiting requests get a 500 and the worker goes on")
                self._fail_waiting()
                continue
            if batch is None:
                return
            if batch:
                try:
                    self._score(batch)
                except Exception as e:  # noqa: BLE001 - the batch's requests get a 500; the worker goes on
                    logger.exception("PRM batch failed outside the scorer")
                    for job in {id(job): job for job, _, _ in batch}.values():
                        self._fail(job, e)
                finally:
                    with self.cond:
                        self.working -= 1
                        for client in {job.client for job, _, _ in batch}:
                            self.busy[client] -= 1
                        self.cond.notify_all()

    def _pending(self) -> int:
        return sum(len(job.items) - job.taken for q in self.queues.values() for job in q)

    def _take(self) -> list[tuple[_Job, int, int]] | None:
        """The next batch: ``[(job, item index, estimated tokens)]`` (``None`` once stopped)."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                self._drop_abandoned()
                if self.ring:
                    wait = self.oldest + self.wait_s - time.monotonic()
                    if wait > 0 and self._pending() < self.max_items and all(self.busy.get(c, 0) == 0 for c in self.ring):
                        self.cond.wait(wait)  # a moment for company: concurrent requests share a forward
                        continue
                    # The last idle worker stays for light items while they keep coming (a short
                    # request then waits for no long batch); with none lately, it takes any.
                    last = self.working == len(self.threads) - 1 and len(self.threads) > 1
                    batch = self._fill(light_only=last and time.monotonic() - self.light_at < LIGHT_HOLD_S)
                    if batch:
                        self.working += 1
                        for client in {job.client for job, _, _ in batch}:
                            self.busy[client] = self.busy.get(client, 0) + 1
                        self.oldest = time.monotonic()
                        return batch
                self.cond.wait(0.5)

    def _drop_abandoned(self) -> None:
        for client in list(self.ring):
            queue = self.queues.get(client)
            while queue and queue[0].abandoned():
                queue.popleft()
            if not queue:
                self.ring.remove(client)
                self.queues.pop(client, None)

    def _fill(self, light_only: bool = False) -> list[tuple[_Job, int, int]]:
        """The next batch: items in tag order, first the smallest tag among the clients without a
        batch being scored (among all, when each has one), then the next smallest of any of those
        clients whose cost is alike (at most ``COMPANION_RATIO`` times the first item's, or
        ``COMPANION_TOKENS``), up to ``max_batch_tokens`` and ``max_batch_items``. So concurrent
        requests share a forward pass (several searches' candidates, one search's connections),
        and a short item never rides with another client's long ones. With ``light_only``, only
        items of at most ``light_tokens`` are taken (the last idle worker's lane)."""
        idle = [c for c in self.ring if self.busy.get(c, 0) == 0]
        pool = set(idle or self.ring)
        batch: list[tuple[_Job, int, int]] = []
        tokens, alike = 0, 0
        while len(batch) < self.max_items:
            best: tuple[float, str, _Job, int] | None = None
            for client in pool:
                queue = self.queues.get(client)
                if not queue:
                    continue
                job = queue[0]
                cost = self._estimate(job.items[job.taken])
                if (batch and (cost > alike or tokens + cost > self.max_tokens)) or (light_only and cost > self.light):
                    continue
                if best is None or job.tags[job.taken] < best[0]:
                    best = (job.tags[job.taken], client, job, cost)
            if best is None:
                break
            tag, client, job, cost = best
            if not batch:  # the virtual time: the start tag of the first item taken
                self.vtime = max(self.vtime, tag - cost)
                alike = max(COMPANION_RATIO * cost, COMPANION_TOKENS)
            batch.append((job, job.taken, cost))
            job.taken += 1
            tokens += cost
            if job.taken == len(job.items):
                self.queues[client].popleft()
                if not self.queues[client]:
                    self.ring.remove(client)
                    self.queues.pop(client)
                    pool.discard(client)
        return batch

    def _score(self, batch: list[tuple[_Job, int, int]]) -> None:
        live = [(job, i, cost) for job, i, cost in batch if not job.abandoned()]
        if not live:
            return
        if self.encode is not None:  # tokenise (filling the scorer's prefix cache) and charge the real count
            charged = []
            for job, i, cost in live:
                try:
                    tokens = len(self.encode(job.items[i]).input_ids)
                except Exception as e:  # noqa: BLE001 - this item cannot be scored
                    self._fail(job, _Reject(422, f"items[{i}] cannot be scored ({type(e).__name__}: {str(e)[:120]})"))
                    continue
                with self.cond:  # the real count corrects the client's later tags
                    self._charge(job.client, tokens - cost)
                charged.append((job, i, cost))
            live = [entry for entry in charged if not entry[0].abandoned()]
        if not live:
            return
        try:
            scores = self.scorer.score([job.items[i] for job, i, _ in live])
        except Exception as e:  # noqa: BLE001 - each item alone, to find the bad one
            if len(live) > 1:
                logger.warning("PRM scoring of a %d-item batch failed (%s); scoring each item alone",
                               len(live), type(e).__name__)
                for entry in live:
                    self._score([entry])
                return
            job, i, _ = live[0]
            logger.warning("PRM item %d of a request failed: %s: %s", i, type(e).__name__, e)
            # An error of the item's data (it cannot be tokenized or read) is the item's, a 422 whether
            # or not it came with others; anything else is the server's (a 500 its client retries, then
            # counts as the machine's failure): the size of the request must not decide which.
            own = isinstance(e, (ValueError, TypeError, KeyError, IndexError, CodetoolError))
            others = "; the other items are fine" if len(job.items) > 1 else ""
            self._fail(job, _Reject(422, f"items[{i}] cannot be scored ({type(e).__name__}){others}") if own else e)
            return
        for (job, i, _), score in zip(live, scores):
            job.scores[i] = score
            job.left -= 1
            if job.left == 0 and not job.failed:
                job.deliver(list(job.scores))

    def _fail_waiting(self) -> None:
        with self.cond:
            jobs = [job for queue in self.queues.values() for job in queue]
            self.queues.clear()
            self.ring.clear()
        for job in jobs:
            self._fail(job, RuntimeError("the scheduler failed"))

    def _charge(self, client: str, extra: float) -> None:
        """Move ``client``'s tags (its last one, those of its queued items) by ``extra`` tokens."""
        if client in self.last:
            self.last[client] += extra
        for job in self.queues.get(client, ()):
            job.tags[job.taken:] = [t + extra for t in job.tags[job.taken:]]

    def _fail(self, job: _Job, error: BaseException) -> None:
        if not job.failed:
            job.failed = True
            job.deliver(error)


def create_app(scorer, *, api_key: str | None = None, name: str = "prm", max_body_bytes: int = 4_000_000,
               max_items: int = 256, max_batch_items: int = 64, batch_wait_ms: float = 5.0,
               request_timeout_s: float = 120.0, read_timeout_s: float = 30.0, max_history_steps: int = 1000,
               max_batch_tokens: int = 8192, workers: int = 2, **guard_limits):
    """The guarded app around ``scorer`` (any object with ``score(items)``); see the module docstring.

    Args:
        max_batch_tokens (`int`, *optional*, defaults to 8192): tokens of one batch handed to the
            scorer (the unit of work that cannot be interrupted; one item at least).
        workers (`int`, *optional*, defaults to 2): threads scoring batches at once (the scorer is
            called from each; LocalPRMScorer and the HTTP ones are safe so).
        guard_limits: the connection limits of :class:`codetool.serving.ServerGuard`
            (``max_connections_per_client``, ``max_inflight_bytes``...).
    Returns:
        A :class:`codetool.serving.ServerGuard` around the FastAPI app. Its own request deadline
        is ``request_timeout_s`` plus a grace of ``GUARD_GRACE_S``: a backstop, so the scorer's
        budget answers first with its precise 504 (and stops the work).
    """
    from contextlib import asynccontextmanager

    # FastAPI reads these annotations at definition time, hence no `from __future__ import annotations`.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    state: dict = {}

    @asynccontextmanager
    async def lifespan(app):
        state["scheduler"] = app.state.scheduler = _Scheduler(  # app.state: for tests and benchmarks
            scorer, max_batch_items=max_batch_items, max_batch_tokens=max_batch_tokens,
            wait_s=batch_wait_ms / 1000.0, workers=workers)
        yield
        state.pop("scheduler").stop()

    app = FastAPI(title="codetool PRM", lifespan=lifespan, version=__version__, description=API_DESCRIPTION)
    parsing = FairTurns(1)  # large bodies: one parsed at a time (a thread), in fair order over clients

    def error(status: int, reason: str) -> JSONResponse:
        return JSONResponse({"error": reason}, status_code=status)

    json_internal_errors(app, "error")

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}},
             summary="Whether the scoring workers are alive")
    async def health():
        scheduler = state.get("scheduler")
        if scheduler is None:
            return JSONResponse({"status": "unhealthy", "prm": name, "workers": workers, "workers_alive": 0,
                                 "worker_restarts": 0}, status_code=503)
        alive = scheduler.alive()
        dead = scheduler.revive()
        body = {"status": "unhealthy" if dead else "ok", "prm": name, "workers": len(scheduler.threads),
                "workers_alive": alive, "worker_restarts": scheduler.restarts}
        return JSONResponse(body, status_code=503 if dead else 200)

    @app.post("/score", response_model=ScoreResponse, summary="Score candidate steps",
              responses={code: {"model": ErrorResponse} for code in (400, 408, 411, 413, 422, 500, 504)},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"$ref": "#/components/schemas/ScoreRequest"}}}}})
    async def score(request: Request):
        body = await request.body()  # already read (within read_timeout_s) and size-checked by the guard
        client = request.scope.get("codetool.client") or (request.client.host if request.client else "?")
        try:
            if len(body) > 65_536:  # parse big bodies off the event loop, so other requests keep flowing
                async with parsing.turn(client, cost=len(body)):
                    items = await asyncio.to_thread(parse_items, body, max_items, max_history_steps)
            else:
                items = parse_items(body, max_items, max_history_steps)
        except _Reject as e:
            return error(e.status, e.reason)
        if not items:
            return {"scores": []}
        try:
            scores = await state["scheduler"].submit(items, request_timeout_s, client)
        except asyncio.TimeoutError:
            return error(504, f"not scored within {request_timeout_s:g} s; retry or send fewer items")
        except _Reject as e:
            return error(e.status, e.reason)
        except Exception as e:
            return error(500, f"scoring failed ({type(e).__name__}); see the server log")
        return {"scores": scores}

    install_openapi(app)
    guard_limits.setdefault("max_requests_per_client", 32)  # a search sends many at once; the scheduler is fair
    guard_limits.setdefault("max_json_members", MAX_JSON_MEMBERS)
    return ServerGuard(app, api_key=api_key, max_body_bytes=max_body_bytes, read_timeout_s=read_timeout_s,
                       request_timeout_s=request_timeout_s + GUARD_GRACE_S, error_field="error",
                       app_in_turn=False, **guard_limits)  # requests wait for their scores in the scheduler


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0):
    """Serve the PRM ``app`` in a background thread; yields its base URL (tests, benchmarks)."""
    return serve_in_background(app, host, port, name="the PRM server")
