"""Units of a long job in threads, with nothing on the way of the next one (issues 28, 39).

- :func:`stream` runs ``func(item)`` for a stream of items, ``workers`` at a time, and hands each
  result to a callback as soon as it is ready, in a thread of its own (:class:`Delivery`): a new
  item starts the moment a worker is free, whatever the callback does with the last result
  (write a record, fsync it, update a progress bar);
- :class:`Finisher` runs what a finished unit still needs (re-running its steps, writing its
  final answer) in a pool beside the work, then hands each result on in one thread.

The episodes of a search (:mod:`codetool.search.schedule`), the trajectories of ``run``
(:mod:`codetool.jobs.queries`) and the verdicts of a judge on a server
(:mod:`codetool.judge.llm`) go through them. The order of delivery is the order of completion,
which varies run to run: nothing that a unit draws may depend on it (seeds come from the unit).

Limits: threads share the process (the GIL); a callback that raises stops the stream at once
(the running items are left to end on their own), an item that raises stops new items and is
raised once the running ones were delivered.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any


def stream(func: Callable[[Any], Any], items: Iterable, workers: int, on_result: Callable[[Any], None],
           admit: Callable[[int], bool] | None = None, recheck_s: float = 0.5) -> None:
    """``func(item)`` for every item, ``workers`` at a time in threads; ``on_result`` sees each
    result as soon as it is ready (completion order), in a thread of its own (:class:`Delivery`),
    so what a finished unit needs (writing its record, re-running its steps) never holds back the
    next unit: a new item starts as soon as a worker is free.

    Items are taken from ``items`` only when a worker is free (a generator may build them
    lazily) and ``admit(running)`` (given the number of items running, e.g.
    :meth:`codetool.memory_use.MemoryGate.admit`) says yes; it is asked again when an item ends
    or ``recheck_s`` later, and never while no item runs (one always may). When ``func`` raises, no further item starts, the running ones finish and are
    delivered, then the first exception is raised. When ``on_result`` raises, no further item
    starts and its exception is raised at once (the running items are left to end on their own),
    as on ``KeyboardInterrupt`` (the items not yet started are dropped).
    """
    pending = iter(items)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="codetool-unit")
    running: set[Future] = set()
    error: BaseException | None = None
    delivery = Delivery(on_result)
    try:
        while True:
            held = False
            while error is None and len(running) < max(1, workers):
                if running and admit is not None and not admit(len(running)):
                    held = True
                    break
                item = next(pending, _END)
                if item is _END:
                    break
                running.add(pool.submit(func, item))
            if not running:
                break
            done, _ = wait(running | {delivery.failed}, timeout=recheck_s if held else None,
                           return_when=FIRST_COMPLETED)
            delivery.check()
            for future in done:
                running.discard(future)
                exc = future.exception()
                if exc is not None:
                    error = error or exc
                else:
                    delivery.put(future.result())
        delivery.close()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        delivery.abandon()
        raise
    pool.shutdown(wait=True)
    if error is not None:
        raise error


_END = object()


class Delivery:
    """Hands results to ``on_result`` in one background thread, in the order they were put, so
    the thread that produces them (a scheduler) never waits on what a finished unit needs.

    ``put(result)`` queues and returns at once; ``close()`` waits until everything queued was
    delivered and raises what ``on_result`` raised. After ``on_result`` raised, nothing more is
    delivered: ``failed`` (a future, for ``concurrent.futures.wait``) is done, and ``put`` and
    ``check`` raise that exception. ``abandon()`` drops what was not delivered yet (the call in
    progress finishes on its own).

    Args:
        on_result (`Callable[[Any], None]`): called with each result, by one thread at a time.
    """

    def __init__(self, on_result: Callable[[Any], None]):
        self.on_result = on_result
        self.failed: Future = Future()
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._closing = self._abandoned = False
        self._thread = threading.Thread(target=self._loop, name="codetool-deliver", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not (self._closing or self._abandoned):
                    self._cond.wait()
                if self._abandoned or not self._queue:
                    return
                result = self._queue.popleft()
            try:
                self.on_result(result)
            except BaseException as exc:  # noqa: BLE001 - handed to the producer (check, put, close)
                self.failed.set_exception(exc)
                return

    def check(self) -> None:
        """Raise what ``on_result`` raised, if it did."""
        error = self.failed.exception() if self.failed.done() else None
        if error is not None:
            raise error

    def put(self, result) -> None:
        """Queue ``result`` for ``on_result``."""
        self.check()
        with self._cond:
            self._queue.append(result)
            self._cond.notify()

    def close(self) -> None:
        """Wait until every queued result was delivered; raise what ``on_result`` raised."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self.check()

    def abandon(self) -> None:
        """Deliver nothing more (what is queued is dropped)."""
        with self._cond:
            self._abandoned = True
            self._queue.clear()
            self._cond.notify()


class Finisher:
    """What a finished unit still needs (re-running its steps, writing its final answer), done in
    a pool of ``workers`` threads beside the search, each result then handed to ``land`` by one
    thread at a time (:class:`Delivery`), in the order they are ready.

    ``submit(func, unit)`` returns at once; ``close()`` waits until everything submitted has
    landed and raises the first exception of a ``func`` or of ``land`` (``submit`` raises it too,
    once it happened, so the search stops starting units); ``abandon()`` drops what has not
    started (on an interrupt).

    Args:
        workers (`int`): threads (``func`` calls at once).
        land (`Callable[[Any], None]`): called with each ``func(unit)``.
    """

    def __init__(self, workers: int, land: Callable[[Any], None]):
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="codetool-finish")
        self._delivery = Delivery(land)
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def _done(self, future: Future) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            with self._lock:
                self._error = self._error or exc
            return
        try:
            self._delivery.put(future.result())
        except BaseException as exc:  # noqa: BLE001 - land failed earlier: kept for check/close
            with self._lock:
                self._error = self._error or exc

    def check(self) -> None:
        """Raise the first exception of a ``func`` or of ``land``, if one happened."""
        with self._lock:
            error = self._error
        if error is not None:
            raise error
        self._delivery.check()

    def submit(self, func: Callable[[Any], Any], unit) -> None:
        """Run ``func(unit)`` in the pool, then ``land`` its result."""
        self.check()
        self._pool.submit(func, unit).add_done_callback(self._done)

    def close(self) -> None:
        """Wait until every submitted unit has landed; raise the first exception."""
        self._pool.shutdown(wait=True)
        self.check()
        self._delivery.close()
        self.check()

    def abandon(self) -> None:
        """Start nothing more and deliver nothing more."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._delivery.abandon()
