"""``Executor``: run model-written steps in a sandboxed, stateful, forkable Python worker.

``run`` executes one step in the current state and keeps the new state; ``fork`` returns an
independent executor holding a copy of the state (``os.fork`` of the warm worker, so no earlier
step and no earlier tool call is repeated); ``close`` kills the worker and everything it started.
See the package docstring for the isolation layers and their limits.

What the result reports is decided by the host, not by the interpreter that ran the step:
``codetool.executor.host.step`` runs one step (the verdict, tool calls, budgets, deadlines, limits);
this module keeps the executor's worker, its forks and its life cycle, and turns failures of the
machine into retries: a fork, copy or worker start that failed for a reason outside the code is
tried again (``ExecutorConfig.infra_retries``, deadlines doubled), and only then is the step
``not_executed``. :attr:`Executor.infra_counts` counts them for the family.
"""

from __future__ import annotations

import builtins
import dataclasses
import keyword
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from codetool.executor.config import ExecutorConfig
from codetool.executor.host.channel import ProtocolError, log_safe
from codetool.executor.host.family import WorkerHandle
from codetool.executor.host.launch import ExecutorError
from codetool.executor.host.pool import FamilyPool
from codetool.executor.host.report import CHANNEL_FAILURES, states_signal
from codetool.executor.host.sandbox import ForkFailed, Sandbox
from codetool.executor.host.step import run_step
from codetool.executor.host.verdict import failure_outcome
from codetool.executor.kernel.schedstat import exit_status
from codetool.executor.result import NOT_EXECUTED, ExecutionResult

logger = logging.getLogger(__name__)

RESERVED_NAMES = frozenset({"finish", "give_up", "ToolError"})


class _Slot:
    """The executor's current worker (``None`` after a loss, until the next run spawns one)."""

    def __init__(self, worker: WorkerHandle | None):
        self.worker = worker
        self.lost = False  # the worker was lost between runs (outside the code): the next step is not executed
        self.failure: ExecutionResult | None = None  # a fork that failed: its first result


def _finalize(sandbox: Sandbox, slot: _Slot) -> None:
    worker, slot.worker = slot.worker, None
    if worker is not None:
        sandbox.release_worker(worker, wait=False)
        worker.close()
    sandbox.release()


class Executor:
    """A sandboxed Python state that runs model-written steps.

    Args:
        config (`ExecutorConfig`, *optional*): limits and isolation (defaults to ``ExecutorConfig()``).
        tools (`Mapping[str, Callable]`, *optional*): Python function name -> host callable. Inside
            the sandbox each name is a proxy; a call is performed here as ``callable(**kwargs)``
            (positionals mapped to names by the callable's signature) and returns a
            ``codetool.tools.spec.ToolResponse`` or any JSON value. The code receives the parsed
            JSON of the content (the raw text when it is not JSON), or a ``ToolError`` when the
            status is not ``ok``. ``finish(answer)`` and ``give_up(reason)`` are always defined.
        pool (`FamilyPool`, *optional*): a pool whose families this executor may share with the
            executors of other tasks (``codetool.executor.host.pool``); without one it starts a family
            of its own.
    Raises:
        ExecutorError: a tool name is not a usable identifier, or the sandbox cannot start.

    Example:
        ```python
        with Executor(ExecutorConfig(timeout_s=5), tools={"get_weather": get_weather}) as ex:
            ex.run("x = get_weather(city='Paris')")
            child = ex.fork()
            print(child.run("print(x['temp'])").stdout)
            child.close()
        ```
    """

    def __init__(self, config: ExecutorConfig | None = None,
                 tools: Mapping[str, Callable[..., Any]] | None = None, *, pool: FamilyPool | None = None):
        self.config = config or ExecutorConfig()
        self.tools = dict(tools or {})
        for name, func in self.tools.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
                    or name in RESERVED_NAMES or name.startswith("__") or hasattr(builtins, name):
                raise ExecutorError(f"tool name {name!r} cannot be a Python function in the sandbox; use "
                                    f"an identifier that is not a keyword, a dunder, a builtin (print, "
                                    f"open...) or one of {sorted(RESERVED_NAMES)}.")
            if not callable(func):
                raise ExecutorError(f"tool {name!r} maps to a {type(func).__name__}, not a callable.")
        sandbox = Sandbox(self.config, sorted(self.tools)) if pool is None else pool.take()
        try:
            worker = _spawn(sandbox, self.config, sorted(self.tools))
        except ExecutorError:
            if pool is None:
                sandbox.close()
            else:
                sandbox.release()
            raise
        self._attach(sandbox, worker)
        if pool is not None:
            sandbox.release()  # the pool's reference: this executor holds its own now

    @classmethod
    def _adopt(cls, parent: Executor, worker: WorkerHandle | None) -> Executor:
        child = cls.__new__(cls)
        child.config, child.tools = parent.config, parent.tools
        child._attach(parent._sandbox, worker)
        child._slot.lost = parent._slot.lost
        return child

    def _attach(self, sandbox: Sandbox, worker: WorkerHandle | None) -> None:
        sandbox.acquire()
        self._sandbox = sandbox
        self._slot = _Slot(worker)
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _finalize, sandbox, self._slot)

    # ------------------------------------------------------------------------------ public API
    @property
    def isolation(self) -> str:
        """The isolation layers active for this executor's family (see ``ExecutionResult.isolation``)."""
        return self._sandbox.isolation

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def infra_counts(self) -> dict[str, int]:
        """Failures of the machine in this executor's family (the root executor and all its forks):
        ``retries`` (forks, copies or worker starts tried again), ``recovered`` (runs and forks
        that worked after a retry) and ``not_executed`` (steps recorded as not executed)."""
        return dict(self._sandbox.counts)

    def run(self, code: str, *, timeout_s: float | None = None) -> ExecutionResult:
        """Run one step in the current state; the state it leaves becomes the current state.

        Args:
            code (`str`): Python source of the step.
            timeout_s (`float`, *optional*): wall-clock limit of this run (defaults to
                ``config.timeout_s``).
        Returns:
            An :class:`ExecutionResult`; problems caused by the code never raise.
        Raises:
            TypeError, ValueError: ``code`` is not text, or ``timeout_s`` is not > 0.
            ExecutorError: the executor is closed, or the sandbox cannot be restarted.
        """
        if not isinstance(code, str):
            raise TypeError(f"Executor.run expects the code as str, got {type(code).__name__}.")
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        if timeout <= 0:
            raise ValueError(f"Executor.run timeout_s must be > 0 seconds, got {timeout_s!r}.")
        with self._lock:
            self._check_open()
            counts = self._sandbox.counts
            if self._slot.failure is not None:  # a fork that failed: this candidate's result
                result, self._slot.failure = self._slot.failure, None
                self._slot.lost = False
                return self._count(result)
            attempts = 0
            while True:
                attempts += 1
                result = self._run_once(code, timeout)
                retry = result.outcome == NOT_EXECUTED and not result.state_lost and attempts <= self.config.infra_retries
                if not retry:
                    break
                counts["retries"] += 1
            result.attempts = attempts
            return self._count(result)

    def _run_once(self, code: str, timeout: float) -> ExecutionResult:
        try:
            worker = self._ensure_worker()
        except ExecutorError as exc:
            return _failed("not_executed", "WorkerStart", f"NotExecuted: no sandbox worker could be started "
                                                         f"({log_safe(exc, 200)}); nothing ran.", self.isolation)
        if self._slot.lost:  # its state was lost between runs, by no doing of the code
            self._slot.lost = False
            return _failed("not_executed", "StateLost", "NotExecuted: the worker holding the state was lost "
                                                        "between steps; nothing ran.", self.isolation)
        try:
            if worker.cpu_s > self.config.cpu_time_s / 2:
                worker = self._refresh(worker)
            return run_step(self._sandbox, worker, code, timeout, config=self.config, tools=self.tools,
                            drop=self._drop_worker)
        except (ProtocolError, EOFError, TimeoutError, OSError) as exc:
            # whatever the state did to the protocol, it is this candidate's failure
            violation = isinstance(exc, ProtocolError)
            logger.warning("sandbox %s: %s", "protocol violation" if violation else "failure", log_safe(exc))
            self._drop_worker(worker, wait=False)
            if violation:
                return _failed("sandbox_violation", "ProtocolError",
                               "ProtocolError: the sandbox sent malformed data to the host and was stopped.",
                               self.isolation)
            outcome, error_type, message = failure_outcome(None)
            return _failed(outcome, error_type, message, self.isolation)

    def _count(self, result: ExecutionResult) -> ExecutionResult:
        if not result.executed:
            self._sandbox.counts["not_executed"] += 1
        elif result.attempts > 1:
            self._sandbox.counts["recovered"] += 1
        return result

    def fork(self) -> Executor:
        """An independent executor holding a copy of the current state (nothing is re-executed).

        The copy is its own principal (its own uid, scratch and memory budget when the host is
        root). The fork is the keeper's, not the code's: no code of the state runs during it. A
        fork that does not complete within ``config.start_timeout_s`` of time the machine gave
        the sandbox (run-queue waits do not count, up to ``busy_backstop`` times) is tried again
        with twice the budget, up to ``config.infra_retries`` times; then the new executor is a
        candidate that could not start: its first ``run`` returns ``not_executed``
        (``error_type`` ``WorkerStart``, ``attempts`` the forks tried) without running
        anything, and later runs start from a fresh state. When the parent's worker itself was
        lost, this executor's next result is ``not_executed`` too (``StateLost``). A copy that
        could not start because the state lowered its own rlimits is the code's failure instead
        (``resource_limit``, ``LimitLowered``), never retried.

        Raises:
            ExecutorError: the executor is closed, or the sandbox cannot start a worker at all.
        """
        with self._lock:
            self._check_open()
            counts = self._sandbox.counts
            try:
                worker = self._ensure_worker()
            except ExecutorError as exc:
                return self._failed_fork(_failed("not_executed", "WorkerStart", f"NotExecuted: no sandbox worker "
                                                 f"could be started ({log_safe(exc, 200)}); nothing ran.",
                                                 self.isolation))
            attempts, budget = 0, self.config.start_timeout_s
            while True:
                attempts += 1
                try:
                    child = Executor._adopt(self, self._sandbox.fork_worker(worker, budget))
                    if attempts > 1:
                        counts["recovered"] += 1
                    return child
                except ForkFailed as exc:
                    logger.warning("fork failed: %s", log_safe(exc, 300))
                    killed_by = None
                    if exc.parent_lost:  # (how it ended: a signal only its state arranges is the state's)
                        ended = exit_status(worker.pid) if exc.kind == "infra" else {}
                        status = self._drop_worker(worker, wait=exc.kind == "infra") or {}
                        status = status if "signal" in status or "exit" in status else {**status, **ended}
                        killed_by = states_signal(status) if exc.kind == "infra" else None
                        self._slot.lost = exc.kind == "infra" and not killed_by
                    lowered = [] if exc.kind == "violation" or killed_by else self._sandbox.lowered_limits(worker)
                    if killed_by:
                        failure = _failed("sandbox_violation", "ProtocolError",
                                          CHANNEL_FAILURES["signal"].format(signal=killed_by), self.isolation)
                    elif exc.kind == "violation":
                        failure = _failed("sandbox_violation", "ProtocolError",
                                          f"ProtocolError: the state this step was forked from broke the sandbox "
                                          f"protocol ({log_safe(exc, 200)}); nothing ran.", self.isolation)
                    elif lowered:  # the state's own doing (resource.setrlimit), not the machine's
                        failure = _lowered(lowered, self.isolation)
                    elif exc.parent_lost or attempts > self.config.infra_retries:
                        failure = _failed("not_executed", "WorkerStart",
                                          f"NotExecuted: the state this step was forked from could not be copied "
                                          f"({log_safe(exc, 200)}); nothing ran.", self.isolation)
                    else:
                        counts["retries"] += 1
                        budget *= 2
                        continue
                    failure.attempts = attempts
                    if exc.parent_lost and failure.outcome == "sandbox_violation":  # the state's own doing:
                        self._slot.failure = dataclasses.replace(failure)  # its next step answers for it too
                    return self._failed_fork(failure)

    def _failed_fork(self, failure: ExecutionResult) -> Executor:
        """A failed candidate: its first ``run`` returns ``failure`` (nothing ran), later runs start
        from a fresh state."""
        child = Executor._adopt(self, None)
        child._slot.lost = False
        child._slot.failure = failure
        return child

    def close(self) -> None:
        """Kill the worker and every process it started; the family's sandbox goes with its last
        executor. Idempotent."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.isolation
        return f"Executor({state})"

    # ---------------------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self.closed:
            raise ExecutorError("this executor is closed; fork or create a new one before running code.")

    def _ensure_worker(self) -> WorkerHandle:
        worker = self._slot.worker
        if worker is not None and worker.dead():
            self._drop_worker(worker, wait=False)
            self._slot.lost = True
        if self._slot.worker is None:
            self._slot.worker = _spawn(self._sandbox, self.config, sorted(self.tools))
        return self._slot.worker

    def _refresh(self, worker: WorkerHandle) -> WorkerHandle:
        """Swap the worker for a fork of itself: same state, CPU-time counters back at zero."""
        try:
            fresh = self._sandbox.fork_worker(worker, 2 * self.config.start_timeout_s)
        except ForkFailed as exc:
            logger.warning("could not refresh a worker near its CPU limit: %s", log_safe(exc, 300))
            if exc.parent_lost:
                raise EOFError(str(exc)) from None
            return worker
        self._drop_worker(worker, wait=False)
        self._slot.worker = fresh
        return fresh

    def _drop_worker(self, worker: WorkerHandle, wait: bool = True) -> dict | None:
        status = self._sandbox.release_worker(worker, wait=wait)
        worker.close()
        if self._slot.worker is worker:
            self._slot.worker = None
        return status


def _spawn(sandbox: Sandbox, config: ExecutorConfig, tool_names: list[str]) -> WorkerHandle:
    """A fresh worker defining ``tool_names``, retried (deadline doubled) when it does not start: a
    busy or failing machine (a family whose root died restarts on the retry).

    Raises:
        ExecutorError: it never started within ``infra_retries`` more tries.
    """
    timeout = 4 * config.start_timeout_s
    for attempt in range(config.infra_retries + 1):
        try:
            worker = sandbox.spawn(tool_names, timeout)
        except ExecutorError:
            if attempt == config.infra_retries:
                raise
            sandbox.counts["retries"] += 1
            timeout *= 2
            continue
        if attempt:
            sandbox.counts["recovered"] += 1
        return worker
    raise ExecutorError("no sandbox worker could be started")  # (not reached)


def _lowered(names: list[str], isolation: str) -> ExecutionResult:
    """The result of a step that could not start because its state lowered its own rlimits
    (``names``): the code's failure (``resource_limit``), never ``not_executed``."""
    return _failed("resource_limit", "LimitLowered", f"LimitLowered: the state this step runs in lowered its own "
                   f"{', '.join(names)} limit, so the step could not start; nothing ran.", isolation)


def _failed(outcome: str, error_type: str, message: str, isolation: str) -> ExecutionResult:
    return ExecutionResult(ok=False, error_type=error_type, error_message=message, outcome=outcome,
                           state_lost=True, isolation=isolation)
