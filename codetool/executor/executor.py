"""``Executor``: run model-written steps in a sandboxed, stateful, forkable Python worker.

``run`` executes one step in the current state and keeps the new state; ``fork`` returns an
independent executor holding a copy of the state (``os.fork`` of the warm worker, so no earlier
step and no earlier tool call is repeated); ``close`` kills the worker and everything it started.
See the package docstring for the isolation layers and their limits.

What the result reports is checked here, not trusted: frames are validated (``channel``), stamped
with the run's nonce and numbered, tool calls and every byte the host holds are budgeted per step,
answers capped, timeouts and limits decided here. Residual risk (see the package docstring):
``outcome``, ``error_*`` and ``final_answer`` come from the interpreter that ran the step, so the
step's code can forge them for itself and, with one ordinary line that reaches the worker's
objects, for every later step of its state and of its forks; a sibling candidate, another
episode or the host cannot.
"""

from __future__ import annotations

import builtins
import keyword
import logging
import math
import secrets
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from codetool.executor.channel import (
    POLL_IN,
    ProtocolError,
    clean_output,
    clean_text,
    log_safe,
    read_available,
)
from codetool.executor.config import ExecutorConfig
from codetool.executor.proxy import perform_tool_call
from codetool.executor.result import HOST_ERROR, NO_CODE, OUTCOMES, ExecutionResult, ToolCall
from codetool.executor.sandbox import ExecutorError, ForkFailed, Sandbox, WorkerHandle

logger = logging.getLogger(__name__)

RESERVED_NAMES = frozenset({"finish", "give_up", "ToolError"})
MAX_MESSAGE_CHARS = 2000
MAX_ANSWER_CHARS = 100_000  # of a finish answer or give_up reason, enforced here (not only in the sandbox)
TIMEOUT_SLACK_S = 0.05  # a "done" later than the timeout by more than this is a timeout, whatever it says
HOST_FRAMES = ("forked", "fork_failed")  # replies of the fork protocol that may arrive late


class _Step:
    """Host-side bookkeeping of one run: its nonce, the next frame number, the budget used."""

    def __init__(self, conn, cfg: ExecutorConfig):
        self.nonce = secrets.token_hex(8)
        self.seq = 0
        self.calls: list[ToolCall] = []
        self.requested = 0  # tool calls asked for, performed or not
        self.ended: dict[str, str | None] = {}
        self.limit: str | None = None  # why the step is over its budget
        self.out_of_time = False  # a tool call was cut short by the step's deadline
        self.bytes_start = conn.bytes_in
        self.max_calls, self.max_bytes = cfg.max_tool_calls, cfg.max_step_mb << 20

    def held(self, conn, output: _Output) -> int:
        """Bytes the host holds for this step: all it received, what it queued for the sandbox
        and that is not read yet, the output kept, the answer."""
        answer = sum(len(v or "") for v in self.ended.values())
        return conn.bytes_in - self.bytes_start + conn.held + output.size + answer


class _Output:
    """The step's output bytes, capped as they arrive (4 bytes per kept character at most)."""

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.max_bytes = 4 * max_chars
        self.chunks: list[bytes] = []
        self.size = 0
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.max_bytes - self.size
        if len(data) > room:
            self.dropped += len(data) - max(room, 0)
            data = data[:max(room, 0)]
        if data:
            self.chunks.append(data)
            self.size += len(data)

    def text(self, worker_dropped: int) -> tuple[str, bool]:
        text = clean_output(b"".join(self.chunks).decode("utf-8", "replace"))
        truncated = bool(worker_dropped or self.dropped or len(text) > self.max_chars)
        if truncated:
            text = text[:self.max_chars] + (f"\n[output truncated: only the first {self.max_chars} "
                                            f"characters are shown]")
        return text, truncated


class _Slot:
    """The executor's current worker (``None`` after a loss, until the next run spawns one)."""

    def __init__(self, worker: WorkerHandle | None):
        self.worker = worker
        self.lost = False  # the worker died between runs; the next result must say so
        self.failure: tuple[str, str, str] | None = None  # a fork that failed: its first result


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
                 tools: Mapping[str, Callable[..., Any]] | None = None):
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
        sandbox = Sandbox(self.config, sorted(self.tools))
        try:
            worker = sandbox.spawn()
        except ExecutorError:
            sandbox.close()
            raise
        self._attach(sandbox, worker)

    @classmethod
    def _adopt(cls, parent: Executor, worker: WorkerHandle | None) -> Executor:
        child = cls.__new__(cls)
        child.config, child.tools = parent.config, parent.tools
        child._attach(parent._sandbox, worker)
        child._slot.lost = parent._slot.lost
        return child

    def _attach(self, sandbox: Sandbox, worker: WorkerHandle) -> None:
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
            if self._slot.failure is not None:  # a fork that failed: this candidate's result
                (outcome, error_type, message), self._slot.failure = self._slot.failure, None
                self._slot.lost = False
                return ExecutionResult(ok=False, error_type=error_type, error_message=message, outcome=outcome,
                                       state_lost=True, isolation=self.isolation)
            worker = self._ensure_worker()
            lost_before, self._slot.lost = self._slot.lost, False
            try:
                if worker.cpu_s > self.config.cpu_time_s / 2:
                    worker = self._refresh(worker)
                result = self._run(worker, code, timeout)
            except (ProtocolError, EOFError, TimeoutError, OSError) as exc:
                # whatever the state did to the protocol, it is this candidate's failure
                violation = isinstance(exc, ProtocolError)
                logger.warning("sandbox %s: %s", "protocol violation" if violation else "failure", log_safe(exc))
                self._drop_worker(worker, wait=False)
                outcome, error_type, message = _failure("violation" if violation else "lost", None, timeout)
                result = ExecutionResult(ok=False, error_type=error_type, error_message=message, outcome=outcome,
                                         state_lost=True, isolation=self.isolation)
            result.state_lost = result.state_lost or lost_before
            return result

    def fork(self) -> Executor:
        """An independent executor holding a copy of the current state (nothing is re-executed).

        The copy is its own principal (its own uid, scratch and memory budget when the host is
        root). If the state cannot be copied within ``FORK_TIMEOUT_S`` (1 s) because of the code
        (its worker does not answer, answers with something that is not a frame, or the copy does
        not start), the new executor is a failed candidate: its first ``run`` returns
        ``worker_lost`` or ``sandbox_violation`` with ``state_lost=True`` without running
        anything, and later runs start from a fresh state. A worker that answered with garbage or
        not at all is killed (this executor's next result then has ``state_lost=True``).

        Raises:
            ExecutorError: the executor is closed, or the sandbox cannot start a worker at all.
        """
        with self._lock:
            self._check_open()
            worker = self._ensure_worker()
            try:
                return Executor._adopt(self, self._sandbox.fork_worker(worker))
            except ForkFailed as exc:
                logger.warning("fork failed: %s", log_safe(exc, 300))
                if exc.parent_lost:
                    self._drop_worker(worker, wait=False)
                    self._slot.lost = True
                child = Executor._adopt(self, None)
                if exc.kind == "violation":
                    failure = ("sandbox_violation", "ProtocolError",
                               f"ProtocolError: the state this step was forked from broke the sandbox protocol "
                               f"({log_safe(exc, 200)}); nothing ran.")
                else:
                    failure = ("worker_lost", "WorkerLost",
                               f"WorkerLost: the state this step was forked from could not be copied "
                               f"({log_safe(exc, 200)}); nothing ran.")
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
            try:
                self._slot.worker = self._sandbox.spawn()
            except ExecutorError:
                self._slot.worker = self._sandbox.spawn()  # the family restarts once if its root died
        return self._slot.worker

    def _refresh(self, worker: WorkerHandle) -> WorkerHandle:
        """Swap the worker for a fork of itself: same state, CPU-time counters back at zero."""
        try:
            fresh = self._sandbox.fork_worker(worker)
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

    def _run(self, worker: WorkerHandle, code: str, timeout: float) -> ExecutionResult:
        cfg = self.config
        start = time.monotonic()
        deadline, kill_at = start + timeout, start + timeout + cfg.grace_s
        read_available(worker.output_fd)  # output of background processes between runs: dropped
        output = _Output(cfg.max_output_chars)
        conn = worker.conn
        step = _Step(conn, cfg)
        calls, ended = step.calls, step.ended
        done: dict | None = None
        failure: str | None = None
        self._sandbox.begin(worker)  # the root resumes the worker (it is stopped between runs)
        conn.queue({"op": "run", "code": code, "timeout": timeout, "reap": worker.reap, "nonce": step.nonce})
        worker.nonces.append(step.nonce)
        worker.reap = False
        poller = select.poll()
        output_open = True
        poller.register(worker.output_fd, POLL_IN)
        while done is None and failure is None:
            poller.register(conn.fileno(), POLL_IN | (select.POLLOUT if conn.pending_output else 0))
            remaining = kill_at - time.monotonic()
            if remaining <= 0:
                failure = "timeout"
                break
            for fd, events in poller.poll(remaining * 1000):
                if fd == worker.output_fd:
                    data = read_available(worker.output_fd)
                    if data is None:
                        poller.unregister(fd)
                        output_open = False
                    else:
                        output.add(data)
                    continue
                try:
                    if events & select.POLLOUT:
                        conn.flush()
                    if events & POLL_IN:
                        conn.read()
                    while conn.frames and done is None and failure is None:
                        done = self._handle(conn.frames.popleft(), conn, step, worker, deadline, output)
                        if step.held(conn, output) > step.max_bytes:
                            failure = "budget"
                    if done is None and failure is None and conn.eof:
                        failure = "lost"
                except EOFError:
                    failure = "lost"
                except ProtocolError as exc:
                    logger.warning("sandbox protocol violation: %s", log_safe(exc))
                    failure = "violation"
                if failure:
                    break
        if output_open:
            output.add(read_available(worker.output_fd) or b"")
        if done is not None:
            return self._finish_result(worker, done, output, step, start, timeout)
        status = self._drop_worker(worker)
        output.add(read_available(worker.output_fd) or b"")
        outcome, error_type, message = _failure(failure, status, timeout)
        if failure == "budget":
            outcome, error_type = "resource_limit", "StepLimit"
            message = (f"StepLimit: the step made the host hold more than {step.max_bytes >> 20} MiB (what it "
                       f"sent, and what it left unread); it was stopped.")
        elif step.limit and failure != "violation":
            outcome, error_type, message = "resource_limit", "ToolLimit", f"ToolLimit: {step.limit}"
        stdout, truncated = output.text(0)
        return ExecutionResult(ok=False, stdout=stdout, error_type=error_type,
                               error_message=message, outcome=outcome,
                               output_truncated=truncated, state_lost=True, tool_calls=calls,
                               final_answer=ended.get("answer"), give_up_reason=ended.get("reason"),
                               duration_s=round(time.monotonic() - start, 6), isolation=self.isolation)

    def _handle(self, frame: dict, conn, step: _Step, worker: WorkerHandle, deadline: float,
                output: _Output) -> dict | None:
        """Act on one frame of a running step; returns the frame when it is ``done``.

        A frame of an earlier run of this worker (its nonce) is dropped, as is a late reply of the
        fork protocol; a frame with an unknown nonce or out of sequence was not sent by the
        worker's own bookkeeping and stops the step (``ProtocolError``). Past ``max_tool_calls``,
        tool calls are refused and the step fails; a tool answer that would take the host past
        the step's byte budget is a tool error."""
        op = frame["op"]
        call = frame.get("call")
        if op == "tool" and (isinstance(call, bool) or not isinstance(call, int)):
            raise ProtocolError("a tool call without a numeric id")
        if frame.get("nonce") != step.nonce:
            if op in HOST_FRAMES and "nonce" not in frame:
                return None
            if frame.get("nonce") in worker.nonces:  # late, from an earlier run: not this step's
                if op == "tool":
                    conn.queue({"op": "tool_result", "call": call, "status": "step_ended",
                                "error": "the step that made this call has ended"})
                return None
            raise ProtocolError(f"a {op!r} frame that does not belong to this run")
        step.seq += 1
        if frame.get("seq") != step.seq:
            raise ProtocolError(f"a {op!r} frame out of sequence")
        if op == "done":
            return frame
        if op == "tool":
            name, args, kwargs = frame.get("name"), frame.get("args"), frame.get("kwargs")
            if not isinstance(name, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ProtocolError("malformed tool call")
            step.requested += 1
            if step.requested > step.max_calls and not step.limit:
                step.limit = f"the step made more than {step.max_calls} tool calls"
            if step.limit:
                conn.queue({"op": "tool_result", "call": call, "status": "step_limit", "error": step.limit})
                conn.flush()
                return None
            func = self.tools.get(name)
            shown = name if func is not None else log_safe(name, 100)
            remaining = deadline - time.monotonic()
            record, reply = perform_tool_call(shown, func, args, kwargs,
                                              min(self.config.tool_timeout_s, remaining))
            if record.status == "timeout" and remaining < self.config.tool_timeout_s:
                step.out_of_time = True
            room = step.max_bytes - step.held(conn, output) - 4096
            if len(reply.get("content") or "") > room:
                reply = {"status": "error", "content": "",
                         "error": f"{shown} answered {len(reply['content'])} characters, more than this step "
                                  f"may still receive ({max(room, 0)}); ask for less"}
                record.status, record.error, record.response = "error", reply["error"], ""
            step.calls.append(record)
            conn.queue({"op": "tool_result", "call": call, **reply})
            conn.flush()
        elif op in ("finish", "give_up"):
            if not step.ended:  # the first finish/give_up wins, whatever the code does afterwards
                key = "answer" if op == "finish" else "reason"
                value = frame.get(key)
                step.ended[key] = clean_output(clean_text(value if isinstance(value, str) else "", MAX_ANSWER_CHARS))
        else:
            raise ProtocolError(f"unexpected frame {op!r}")
        return None

    def _finish_result(self, worker: WorkerHandle, done: dict, output: _Output, step: _Step,
                       start: float, timeout: float) -> ExecutionResult:
        calls, ended = step.calls, step.ended
        outcome = done.get("outcome")
        if outcome not in OUTCOMES or outcome in ("worker_lost", NO_CODE, HOST_ERROR):
            outcome = "sandbox_violation"
        worker.cpu_s = _number(done.get("cpu_s"), 0.0, 1e9)
        dropped = int(_number(done.get("output_dropped"), 0, 1 << 53))
        # The root stops the worker and kills every other process of its principal (whatever
        # the step left running, detached or not), so nothing of this step outlives the result.
        ended_info = self._sandbox.end(worker)
        worker.reap = True
        stdout, truncated = output.text(dropped)
        error_type, message = done.get("error_type"), done.get("error_message")
        elapsed = time.monotonic() - start
        if outcome != "timeout" and (step.out_of_time or elapsed > timeout + TIMEOUT_SLACK_S):  # decided here
            outcome, error_type = "timeout", "Timeout"
            message = f"Timeout: the step ran longer than {timeout:g} s and was stopped"
        if ended_info.get("oom"):
            outcome, error_type = "resource_limit", "MemoryLimit"
            message = (f"MemoryLimit: the step's processes used more than {self._sandbox.memory_bytes >> 20} MiB "
                       f"together; the kernel killed {ended_info['oom']} of them.")
        if step.limit:  # decided here: the code cannot report its way out of its budget
            outcome, error_type, message = "resource_limit", "ToolLimit", f"ToolLimit: {step.limit}"
        ok = outcome == "ok"
        return ExecutionResult(ok=ok, stdout=stdout,
                               error_type=None if ok else clean_text(error_type if isinstance(error_type, str)
                                                                     else "Error", 100),
                               error_message=None if ok else clean_output(clean_text(
                                   message if isinstance(message, str) else "", MAX_MESSAGE_CHARS)),
                               outcome=outcome, output_truncated=truncated, state_lost=False,
                               tool_calls=calls, final_answer=ended.get("answer"),
                               give_up_reason=ended.get("reason"),
                               duration_s=round(time.monotonic() - start, 6), isolation=self.isolation)


def _number(value, low: float, high: float) -> float:
    """A numeric field of a frame, clamped to ``[low, high]`` (``low`` when not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return low
    value = float(value)
    return min(max(value, low), high) if math.isfinite(value) else low


def _failure(kind: str | None, status: dict | None, timeout: float) -> tuple[str, str, str]:
    """``(outcome, error_type, message)`` for a run whose worker had to be killed or died."""
    if kind == "timeout":
        return ("timeout", "Timeout", f"Timeout: the step ran longer than {timeout:g} s and did not stop "
                                      f"when interrupted, so it was killed.")
    if kind == "violation":
        return ("sandbox_violation", "ProtocolError",
                "ProtocolError: the sandbox sent malformed data to the host and was stopped.")
    status = status or {}
    sig = status.get("signal")
    if status.get("reason") == "memory" or status.get("oom"):
        return ("resource_limit", "MemoryLimit",
                "MemoryLimit: the step's processes and files used more memory than allowed, so it was killed.")
    if sig == signal.SIGXCPU:
        return "resource_limit", "CPULimit", "CPULimit: the step used more CPU time than allowed."
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (a resource limit, or the process killed itself)" if sig == signal.SIGKILL else ""
        return "worker_lost", "WorkerLost", f"WorkerLost: the sandbox process died from {name}{hint}."
    if "exit" in status:
        return ("worker_lost", "WorkerLost",
                f"WorkerLost: the sandbox process exited with code {status['exit']} (os._exit or a crash).")
    return "worker_lost", "WorkerLost", "WorkerLost: the sandbox process died."
