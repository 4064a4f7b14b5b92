"""HTTP to remote model servers within settings: in-flight limit, timeouts, retries, endpoints.

Every remote client (the OpenAI-compatible policy and judge backend, the PRM client) sends its
requests through one :class:`RemoteClient`, configured by one :class:`RemoteConfig` group:
``--policy_client.*``, ``--prm_client.*`` and ``--judge.client.*`` (issue 28).

- **In flight**: at most ``max_in_flight`` *sequences* at once, over all endpoints and threads:
  a chat request for ``n`` samples holds ``n``, a PRM request holds one per item (what a vLLM
  server batches, ``--max-num-seqs``). Waiters are served in arrival order.
- **Timeouts**: a request that has no answer within ``timeout_s`` is closed, so a server that
  aborts on disconnect (vLLM) stops generating, and it is retried like a connection error.
- **Retries** (:class:`codetool.retry.RetryPolicy`, the one policy of every HTTP client): every
  transient fault is retried ``retries`` times after ``backoff_s``, doubling, at most
  ``max_backoff_s``: a connection error (refused, reset, a reply cut off), a timeout, HTTP 429 and
  5xx, and a 2xx whose body is not what was asked (``parse`` raised ``ValueError``: not JSON, as a
  proxy's HTML error page); a ``Retry-After`` header (seconds or an HTTP date) replaces the wait,
  capped alike. Other 4xx fail at once: the caller names the setting that caused them. Until some
  endpoint has answered once, a connection error is retried only twice (a wrong URL fails in
  seconds; a server that goes away mid-run gets every retry). The faults retried are counted by
  kind (``stats()["faults"]``: ``connection``, ``timeout``, ``http_429``, ``http_5xx``,
  ``bad_body``) and shown in the summaries of ``run``, ``build-trees`` and ``eval``.
- **Several endpoints** (one URL per vLLM data-parallel rank, say): each request carries an
  affinity key (its prompt prefix); rendezvous hashing sends equal keys to the same endpoint, so
  that server's prefix cache holds the query. An endpoint that fails (connection error, timeout,
  5xx) is left out for ``failover_s`` and its keys go to their next endpoint at once, without
  waiting out a backoff; when every endpoint is out, the backoff applies.

The exchanges run on one asyncio loop per client (httpx's async client, in a daemon thread);
the threads that wait for them (episodes, tree nodes) hold the in-flight limit, sleep out the
backoff and see the errors. Closing the client cancels what is in flight.

Limits: the limit is per client object, not per server: two processes against one server each
hold their own ``max_in_flight``. Streaming responses are not used, so a request's whole reply
counts against ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.jsonl import clean_obj
from codetool.retry import RetryPolicy

logger = logging.getLogger(__name__)

# Connection errors before any endpoint ever answered are retried this often at most (a wrong URL
# should fail in seconds; an outage after the server has answered gets every retry).
NEVER_REACHED_RETRIES = 2
# How a constraint's regex travels in the request body, per server family (constraint_field).
CONSTRAINT_FIELDS = ("structured_outputs", "guided_regex", "regex", "none")
# The transient faults a request is retried for (RemoteClient.faults counts them by kind).
FAULTS = ("connection", "timeout", "http_429", "http_5xx", "bad_body")


@dataclass
class RemoteConfig:
    """Limits of one remote client: a policy or judge server, or a PRM server (issue 28).

    The same group serves every role (``policy_client``, ``prm_client``, ``judge.client``);
    ``constraint_field`` and ``require_constraints`` only matter for policy servers.
    """

    max_in_flight: int = option(64, "sequences in flight at once over all endpoints: a request for n samples "
                                "(or n PRM items) holds n; match the server's batch (vLLM --max-num-seqs)")
    timeout_s: float = option(120.0, "seconds one request may take; past it the request is closed (a vLLM "
                              "server then stops generating it) and retried")
    retries: int = option(8, "further attempts after a transient fault: a connection error (refused, reset, a "
                          "reply cut off), a timeout, HTTP 429 or 5xx, a reply whose body is not JSON")
    backoff_s: float = option(1.0, "wait before the first retry, doubling with each one")
    max_backoff_s: float = option(60.0, "longest wait between two attempts, a server's Retry-After included")
    failover_s: float = option(30.0, "with several endpoints: seconds an endpoint that failed is left out "
                               "before it is tried again")
    constraint_field: str = option("auto", "policy servers: the request field that carries search.constrain's "
                                   "regex: auto (probe structured_outputs, guided_regex, regex in turn), "
                                   "structured_outputs (vLLM >= 0.12), guided_regex (older vLLM), regex "
                                   "(SGLang), none (send nothing)", choices=["auto", *CONSTRAINT_FIELDS])
    require_constraints: bool = option(True, "policy servers: with search.constrain on, stop with an error when "
                                       "the server cannot apply the constraint (false: warn once, sample "
                                       "unconstrained, and record it in the trajectories)")

    def __post_init__(self):
        if self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {self.max_in_flight}.")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds, got {self.timeout_s}.")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}.")
        if self.backoff_s < 0 or self.max_backoff_s < 0 or self.failover_s < 0:
            raise ConfigError(f"backoff_s, max_backoff_s and failover_s must be >= 0, got {self.backoff_s}, "
                              f"{self.max_backoff_s}, {self.failover_s}.")

    def summary(self) -> str:
        """The limits in one line, for run summaries."""
        return (f"{self.max_in_flight} in flight, timeout {self.timeout_s:g} s, {self.retries} retries "
                f"(backoff {self.backoff_s:g} s doubling, at most {self.max_backoff_s:g} s)")


class InFlight:
    """A first-come, first-served counter of sequences in flight, with its measurements.

    ``acquire(units)`` waits until ``units`` fit under ``limit`` (a request larger than the limit
    waits until it is alone); ``stats()`` gives the peak and the mean number in flight while
    anything was (the effective concurrency: sequence-seconds over busy seconds).
    """

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.current = self.peak = 0
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self._area = self._busy = 0.0
        self._last = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        if self.current:
            self._area += self.current * (now - self._last)
            self._busy += now - self._last
        self._last = now

    def acquire(self, units: int) -> int:
        """Wait for ``units`` (cut to the limit); returns what was taken, for :meth:`release`."""
        units = max(1, min(int(units), self.limit))
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self.current + units > self.limit:
                self._cond.wait()
            self._queue.popleft()
            self._tick()
            self.current += units
            self.peak = max(self.peak, self.current)
            self._cond.notify_all()
        return units

    def release(self, units: int) -> None:
        with self._cond:
            self._tick()
            self.current -= units
            self._cond.notify_all()

    @contextmanager
    def hold(self, units: int):
        taken = self.acquire(units)
        try:
            yield
        finally:
            self.release(taken)

    def stats(self) -> dict[str, float]:
        """``peak`` sequences in flight, ``effective`` (their mean while busy) and ``busy_s``."""
        with self._cond:
            self._tick()
            return {"peak": self.peak, "effective": self._area / self._busy if self._busy else 0.0,
                    "busy_s": self._busy}


class EndpointError(CodetoolError):
    """The server answered with an HTTP error that retrying does not fix; ``status`` is its code
    and ``text`` the server's reason (cleaned, one line)."""

    def __init__(self, message: str, status: int, text: str = ""):
        super().__init__(message)
        self.status, self.text = status, text


class ServerFailure(CodetoolError):
    """The server (or the network to it) failed the request after every retry: unreachable,
    timeouts, 429/5xx, bodies that do not parse. Not the request's fault, nor the policy's: a job
    records the unit as not run (``not_executed``), which no rate counts and ``--retry_failed``
    runs again."""


class BadReply(ValueError):
    """A 2xx body that parses but does not answer the request (e.g. not one score per item sent):
    the server's fault, retried like a body that does not parse (``RemoteClient.request``)."""


def json_object(response) -> dict[str, Any]:
    """The JSON object of a reply's body.

    Raises:
        ValueError: the body is not JSON, or not an object (``RemoteClient`` retries it as a fault).
    """
    value = response.json()
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")
    return value


def split_urls(spec: str | list[str]) -> list[str]:
    """The endpoint URLs of a spec: a list, or one string of comma-separated URLs."""
    parts = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    return [p.strip() for p in parts if p and p.strip()]


class RemoteClient:
    """Requests to the endpoints of one service within a :class:`RemoteConfig` (module docstring).

    Args:
        urls (`list[str]`): base URLs of equivalent endpoints (same model), at least one.
        config (`RemoteConfig`): limits, timeouts, retries.
        setting (`str`, *optional*, defaults to `"policy_client"`): the settings group, named in
            error messages (``policy_client.timeout_s``).
        headers (`Callable[[], dict]`, *optional*): headers for each request (read at request
            time, so a key comes from the environment only when it is sent).
        clean (`Callable[[str], str]`, *optional*): makes a server's text safe for a message.
    """

    def __init__(self, urls: list[str], config: RemoteConfig, *, setting: str = "policy_client",
                 headers: Callable[[], dict[str, str]] | None = None, clean: Callable[[str], str] | None = None):
        import httpx

        if not urls:
            raise CodetoolError(f"{setting}: no endpoint URL given.")
        self.urls, self.config, self.setting = list(urls), config, setting
        self.in_flight = InFlight(config.max_in_flight)
        self._headers = headers or dict
        self._clean = clean or (lambda text: " ".join(str(text).split())[:200])
        self._down: dict[str, float] = {}  # endpoint -> monotonic time it may be tried again
        self._answered: set[str] = set()  # endpoints that have answered (with any HTTP status)
        self._lock = threading.Lock()
        self.counts = {"requests": 0, "retries": 0, "failovers": 0, "timeouts": 0}
        self.faults = dict.fromkeys(FAULTS, 0)  # faults that were retried, by kind
        # The message of the last request that spent its retries unable to connect, until some
        # request is answered again: a long job stops on it (``codetool.jobs``) instead of spending
        # every retry again on each unit left.
        self.unreachable: str | None = None
        connections = config.max_in_flight + 4
        # plain-http endpoints (a local server) need no TLS context, whose set-up takes ~0.15 s of a start
        tls = any(u.lower().startswith("https:") for u in self.urls)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_s, connect=min(config.timeout_s, 10.0)), verify=tls,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[concurrent.futures.Future] = set()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The asyncio loop (in its own daemon thread) that carries every exchange of this client."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="codetool-http", daemon=True).start()
                self._loop = loop
            return self._loop

    def _exchange(self, method: str, url: str, body: Any, timeout_s: float | None = None):
        """One HTTP exchange on the loop; the calling thread waits for it. Cancelling it (close,
        or an interrupt of the waiting thread) closes its connection, so the server sees the
        request go away."""
        import httpx

        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": httpx.Timeout(timeout_s)}

        async def send():
            return await self._client.request(method, url, json=body, headers=self._headers(), **extra)

        future = asyncio.run_coroutine_threadsafe(send(), self._event_loop())
        with self._lock:
            self._pending.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise CodetoolError(f"{url}: the request was cancelled (its client was closed).") from None
        except BaseException:
            future.cancel()
            raise
        finally:
            with self._lock:
                self._pending.discard(future)

    def close(self) -> None:
        """Cancel the requests in flight (their connections close) and close the client."""
        with self._lock:
            pending, loop, self._loop = list(self._pending), self._loop, None
        for future in pending:
            future.cancel()
        if loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._client.aclose(), loop).result(timeout=10)
            except (concurrent.futures.TimeoutError, RuntimeError):
                logger.debug("the HTTP client did not close in time", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)

    def ranked(self, key: str) -> list[str]:
        """The endpoints in the order ``key`` prefers them (rendezvous hashing), those left out
        after a failure last."""
        def weight(url: str) -> bytes:
            return hashlib.sha256(f"{url}|{key}".encode("utf-8", "replace")).digest()

        order = sorted(self.urls, key=weight, reverse=True) if len(self.urls) > 1 else self.urls
        now = time.monotonic()
        with self._lock:
            return [u for u in order if self._down.get(u, 0.0) <= now] + [
                u for u in order if self._down.get(u, 0.0) > now]

    def _mark_down(self, url: str) -> None:
        if len(self.urls) > 1:
            with self._lock:
                self._down[url] = time.monotonic() + self.config.failover_s

    def _healthy(self, url: str) -> bool:
        with self._lock:
            return self._down.get(url, 0.0) <= time.monotonic()

    def _reached(self) -> bool:
        with self._lock:
            return bool(self._answered)

    @property
    def answered(self) -> bool:
        """Whether some endpoint has answered a request (with any HTTP status)."""
        return self._reached()

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _fault(self, kind: str) -> None:
        with self._lock:
            self.faults[kind] += 1

    def request(self, method: str, path: str, payload: dict | None = None, *, key: str = "", units: int = 1,
                describe: Callable[[str, int, str], str] | None = None, retries: int | None = None,
                parse: Callable[[Any], Any] | None = None, timeout_s: float | None = None):
        """One call with the limits, retries and failover of the module docstring.

        Args:
            key (`str`, *optional*): the affinity key (equal keys go to the same endpoint).
            units (`int`, *optional*, defaults to 1): sequences this request holds in flight.
            describe (`Callable[[str, int, str], str]`, *optional*): the message of a non-retryable
                HTTP error from ``(url, status, server text)``.
            retries (`int`, *optional*): fewer retries than configured.
            parse (`Callable[[httpx.Response], Any]`, *optional*): reads a 2xx answer; a
                ``ValueError`` (a body that is not JSON) is a fault, retried like a 5xx.
            timeout_s (`float`, *optional*): a shorter timeout than ``timeout_s`` of the settings
                (a reachability check).
        Returns:
            ``parse(response)`` of a 2xx answer, or the ``httpx.Response`` without ``parse``.
        Raises:
            EndpointError: a non-retryable HTTP error (4xx other than 429).
            ServerFailure: the retries ran out (unreachable, timeouts, 429/5xx, bodies that do not parse).
        """
        import httpx

        cfg = self.config
        policy = RetryPolicy(cfg.retries if retries is None else min(retries, cfg.retries), cfg.backoff_s,
                             cfg.max_backoff_s)
        body = clean_obj(payload) if payload is not None else None
        problem = fix = url = kind = ""
        attempt = 0
        while True:
            endpoint = self.ranked(key)[0]
            url = endpoint + path
            retry_after = None
            self._count("requests")
            connect_failed = False
            with self.in_flight.hold(units):
                try:
                    response = self._exchange(method, url, body, timeout_s)
                except httpx.TimeoutException:
                    self._count("timeouts")
                    limit_s = cfg.timeout_s if timeout_s is None else timeout_s
                    problem, kind = f"no answer within {limit_s:g} s (the request was closed)", "timeout"
                    fix = f"raise {self.setting}.timeout_s, or check that the server is not overloaded"
                    response = None
                except httpx.TransportError as e:
                    problem, kind = f"cannot connect ({type(e).__name__})", "connection"
                    fix = "check that the server is running and that the URL is right"
                    response, connect_failed = None, True
            failover = True
            if response is not None:
                with self._lock:
                    self._answered.add(endpoint)
                    self.unreachable = None
                status = response.status_code
                if status < 400 and parse is None:
                    return response
                if status < 400 and parse is not None:
                    try:
                        return parse(response)
                    except ValueError as exc:  # not JSON (a proxy's error page, a reply cut short): a fault
                        kind = "bad_body"
                        problem = (f"HTTP {status} with a reply that does not fit the request ({exc})"
                                   if isinstance(exc, BadReply) else
                                   f"HTTP {status} with a body that is not a JSON object ({self._clean(response.text)})")
                        fix = "is it the right endpoint (an OpenAI-compatible one usually ends in /v1)?"
                else:
                    text = self._clean(response.text)
                    if status != 429 and status < 500:
                        raise EndpointError(describe(url, status, text) if describe else
                                            f"{url} answered HTTP {status}: {text}.", status, text)
                    problem, kind = f"HTTP {status} ({text})", "http_429" if status == 429 else "http_5xx"
                    fix = f"the server is overloaded or failing; retry later or lower {self.setting}.max_in_flight"
                    retry_after = response.headers.get("retry-after")
                    failover = status != 429  # busy, not broken: stay on this endpoint
            # Until an endpoint has answered once, a failure most likely means a wrong URL, not an
            # outage: say so within seconds.
            limit = policy.retries if self._reached() else min(policy.retries, NEVER_REACHED_RETRIES)
            if attempt >= limit:
                break
            attempt += 1
            self._count("retries")
            self._fault(kind)
            if failover:
                self._mark_down(endpoint)
                following = self.ranked(key)[0]
                if following != endpoint and self._healthy(following):
                    self._count("failovers")
                    logger.warning("%s: %s; failing over to %s", url, problem, following)
                    continue
            wait = policy.wait_s(attempt, retry_after)
            logger.warning("%s: %s; retry %d/%d in %.1f s", url, problem, attempt, limit, wait)
            if wait > 0:
                time.sleep(wait)
        message = f"{url}: {problem} after {attempt + 1} attempts; {fix}."
        if connect_failed:
            with self._lock:
                self.unreachable = message
        raise ServerFailure(message)

    def stats(self) -> dict[str, Any]:
        """What the client did: requests, retries (``faults``: the retried faults by kind), failovers,
        timeouts, peak and effective in flight."""
        with self._lock:
            counts, faults = dict(self.counts), dict(self.faults)
        return {"endpoints": len(self.urls), "max_in_flight": self.config.max_in_flight, **counts, "faults": faults,
                **{f"in_flight_{k}": round(v, 2) for k, v in self.in_flight.stats().items()}}
