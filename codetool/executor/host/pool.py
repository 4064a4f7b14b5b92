"""Executor families shared by the executors of many tasks (issue 39): fewer sandbox roots.

An :class:`~codetool.executor.Executor` made without a pool starts a family of its own: a root
process (a whole Python interpreter, in bubblewrap or not) that spawns its workers. A long job
keeps many episodes (or trees) in flight, each with its own root: ~6 MiB of memory (proportional
set size) and one interpreter start each, the start on the way of the episode's first step.
Through a :class:`FamilyPool` the root executors of different tasks share families: a new
executor's worker is a fork of the family's template worker (milliseconds) as long as the family holds fewer
than ``per_family`` executors (a step's forks count), and a new family starts only when every
family is full. Families start in parallel, and executors that arrive while one starts wait for
it instead of starting their own. A family still closes with its last executor, as without a pool.
:class:`StartingExecutor` starts an executor in the background, so a search's first generation
does not wait for its sandbox either.

What sharing changes, and what it does not: every executor of a family is still its own
principal (its own uid, scratch tmpfs and memory budget, ``codetool.executor``), so executors
of different tasks are kept apart exactly as the candidates of one step are. The root serves the
requests of all of them in order, and a root that dies (a machine fault, never the code: the
root runs no model code) loses the state of every executor of its family (each one's next
result says ``state_lost``). Where executors are not separate principals (the host is not root,
or ``executor.drop_uid`` is off) they would share one scratch folder, so each executor gets a
family of its own, as without a pool. Finding that out runs the sandbox interpreter once; it
starts with the pool in a thread of its own, so a job's first request does not wait for it (the
first family does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from codetool.executor.config import ExecutorConfig
from codetool.executor.host.family import separate_principals
from codetool.executor.host.sandbox import Sandbox

logger = logging.getLogger(__name__)

PER_FAMILY = 16  # executors (a step's forks included) one family serves before a new one starts


class _Starting:
    """A family being started, and the callers waiting for it (each holds one reference)."""

    def __init__(self):
        self.waiting = 1
        self.ready = threading.Event()
        self.family: Sandbox | None = None
        self.error: BaseException | None = None


class FamilyPool:
    """Families shared by the executors made through it (module docstring).

    Args:
        config (`ExecutorConfig`): the limits and isolation of every family.
        per_family (`int`, *optional*, defaults to 16): executors (forks included) one family
            holds before a new family starts; 1 gives every executor its own family.
    """

    def __init__(self, config: ExecutorConfig, per_family: int = PER_FAMILY):
        self.config = config
        self._wanted = max(1, int(per_family))
        self._families: list[Sandbox] = []
        self._starting: list[_Starting] = []
        self._lock = threading.Lock()
        self.started = 0  # families started through the pool
        # Whether executors are separate principals takes a run of the sandbox interpreter (tenths
        # of a second on a busy machine): it is found in the background from here, not on the way
        # of a job's first request (issue 39); the first take() waits for it.
        self._principals: Future = Future()
        threading.Thread(target=self._find_principals, name="codetool-principals", daemon=True).start()

    def _find_principals(self) -> None:
        try:
            self._principals.set_result(separate_principals(self.config))
        except BaseException as exc:  # noqa: BLE001 - raised to whoever asks (per_family, take)
            self._principals.set_exception(exc)

    @property
    def per_family(self) -> int:
        """Executors one family holds: ``per_family`` where executors are separate principals,
        else 1 (waits for the check started with the pool; raises what it raised, e.g. an
        ``ExecutorError`` for an interpreter that does not run)."""
        return self._wanted if self._principals.result() else 1

    def take(self) -> Sandbox:
        """A running family with room, holding one reference for the caller (who hands it back
        with ``release()`` once its executor holds its own); a new family when none has room.

        Raises:
            ExecutorError: the family the caller needs could not start.
        """
        if self.per_family == 1:
            family = Sandbox(self.config, [])
            family.acquire_open()
            self.started += 1
            return family
        with self._lock:
            self._families = [f for f in self._families if f.alive and f.principals]
            for family in sorted(self._families, key=lambda f: f.executors):
                if family.executors < self.per_family and family.acquire_open():
                    return family
            starting = next((s for s in self._starting if s.waiting < self.per_family), None)
            if starting is not None:
                starting.waiting += 1
            else:
                starting = _Starting()
                self._starting.append(starting)
                threading.Thread(target=self._start, args=(starting,), name="codetool-family", daemon=True).start()
        starting.ready.wait()
        if starting.error is not None:
            raise starting.error
        assert starting.family is not None  # started, or its error raised above
        return starting.family

    def _start(self, starting: _Starting) -> None:
        try:
            family = Sandbox(self.config, [])
        except BaseException as exc:  # noqa: BLE001 - every waiter raises it
            with self._lock:
                self._starting.remove(starting)
                starting.error = exc
        else:
            with self._lock:
                self._starting.remove(starting)
                family.acquire_open(starting.waiting)  # one reference per waiter (no more can join now)
                self._families.append(family)
                self.started += 1
                starting.family = family
        starting.ready.set()


_STARTER: ThreadPoolExecutor | None = None
_STARTER_LOCK = threading.Lock()
STARTS_AT_ONCE = 32  # executors being started in the background at once


def _starter() -> ThreadPoolExecutor:
    global _STARTER
    with _STARTER_LOCK:
        if _STARTER is None:
            _STARTER = ThreadPoolExecutor(max_workers=STARTS_AT_ONCE, thread_name_prefix="codetool-start")
        return _STARTER


class StartingExecutor:
    """An executor being started in the background (``make()`` runs in a thread at once): its
    first ``run`` or ``fork`` waits for it and raises what the start raised, so an episode's first
    generation need not wait for its sandbox. ``close`` before the start ran cancels it, after it
    closes the executor. Other attributes are the started executor's.

    Args:
        make (`Callable[[], StepExecutor]`): starts the executor (e.g. ``lambda: factory(task)``).
    """

    def __init__(self, make: Callable[[], Any]):
        self._future: Future = _starter().submit(make)
        self._closed = False

    def started(self):
        """The executor (waits for its start; raises what the start raised)."""
        return self._future.result()

    def run(self, code: str, *, timeout_s: float | None = None):
        return self.started().run(code, timeout_s=timeout_s)

    def fork(self):
        return self.started().fork()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._future.cancel():
            return
        try:
            executor = self._future.result()
        except Exception:  # noqa: BLE001 - it never started: nothing to close
            return
        executor.close()

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.started(), name)


def started_in_background(make_executor: Callable[[Any], Any]) -> Callable[[Any], StartingExecutor]:
    """``task -> StartingExecutor`` from an executor factory ``task -> Executor``."""
    return lambda task: StartingExecutor(lambda: make_executor(task))
