"""The host's side of one step: feed the code to the worker, serve its tool calls, read its
output, and decide the result (``Executor.run`` calls :func:`run_step`).

What the result reports is checked here, not trusted: frames are validated (``channel``), stamped
with the run's nonce and numbered, tool calls and every byte the host holds are budgeted per step
(:class:`StepLedger`), output is capped as it arrives (:class:`StepOutput`), answers capped,
timeouts and limits decided here. Residual risk (see the package docstring): ``outcome``,
``error_*`` and ``final_answer`` come from the interpreter that ran the step.
"""

from __future__ import annotations

import logging
import math
import secrets
import select
import signal
import time
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
from codetool.executor.family import WorkerHandle
from codetool.executor.proxy import perform_tool_call
from codetool.executor.result import HOST_ERROR, NO_CODE, NOT_EXECUTED, OUTCOMES, ExecutionResult, ToolCall
from codetool.executor.sandbox import Sandbox

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000
MAX_ANSWER_CHARS = 100_000  # of a finish answer or give_up reason, enforced here (not only in the sandbox)
TIMEOUT_SLACK_S = 0.05  # a "done" later than the timeout by more than this is a timeout, whatever it says
HOST_FRAMES = ("forked", "fork_failed")  # replies of the fork protocol that may arrive late


class StepLedger:
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

    def held(self, conn, output: StepOutput) -> int:
        """Bytes the host holds for this step: all it received, what it queued for the sandbox
        and that is not read yet, the output kept, the answer."""
        answer = sum(len(v or "") for v in self.ended.values())
        return conn.bytes_in - self.bytes_start + conn.held + output.size + answer


class StepOutput:
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


def run_step(sandbox: Sandbox, worker: WorkerHandle, code: str, timeout: float, *, config: ExecutorConfig,
             tools: Mapping[str, Callable[..., Any]],
             drop: Callable[[WorkerHandle], dict | None]) -> ExecutionResult:
    """Run ``code`` on ``worker`` and decide its result: feed the step, serve its tool calls,
    read its output, and stop it at its deadline (``timeout`` s, killed ``config.grace_s`` later)
    or at its budgets.

    Args:
        sandbox (`Sandbox`): the worker's family (``begin``/``end`` of the step, memory budget).
        worker (`WorkerHandle`): the worker holding the state (it keeps it when the step ends).
        code (`str`): the step's Python source.
        timeout (`float`): wall-clock seconds.
        config (`ExecutorConfig`): limits (output, tool calls, bytes held, tool timeout, grace).
        tools (`Mapping[str, Callable]`): name -> host callable of the executor's tools.
        drop (`Callable[[WorkerHandle], dict | None]`): releases a worker that has to be killed and
            returns how it ended (the executor's ``_drop_worker``).
    Returns:
        An :class:`ExecutionResult` (``state_lost=True`` when the worker had to be dropped).
    Raises:
        ProtocolError, EOFError, TimeoutError, OSError: from the channel outside the frame loop;
            the executor turns them into a failed candidate.
    """
    start = time.monotonic()
    deadline, kill_at = start + timeout, start + timeout + config.grace_s
    read_available(worker.output_fd)  # output of background processes between runs: dropped
    output = StepOutput(config.max_output_chars)
    conn = worker.conn
    step = StepLedger(conn, config)
    calls, ended = step.calls, step.ended
    done: dict | None = None
    failure: str | None = None
    sandbox.begin(worker)  # the root resumes the worker (it is stopped between runs)
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
                    done = _handle(conn.frames.popleft(), conn, step, worker, deadline, output, tools, config)
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
        return _finished(sandbox, worker, done, output, step, start, timeout)
    status = drop(worker)
    output.add(read_available(worker.output_fd) or b"")
    outcome, error_type, message = failure_outcome(failure, status, timeout)
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
                           duration_s=round(time.monotonic() - start, 6), isolation=sandbox.isolation)


def _handle(frame: dict, conn, step: StepLedger, worker: WorkerHandle, deadline: float, output: StepOutput,
            tools: Mapping[str, Callable[..., Any]], config: ExecutorConfig) -> dict | None:
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
        func = tools.get(name)
        shown = name if func is not None else log_safe(name, 100)
        remaining = deadline - time.monotonic()
        record, reply = perform_tool_call(shown, func, args, kwargs,
                                          min(config.tool_timeout_s, remaining))
        if record.status == "timeout" and remaining < config.tool_timeout_s:
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


def _finished(sandbox: Sandbox, worker: WorkerHandle, done: dict, output: StepOutput, step: StepLedger,
              start: float, timeout: float) -> ExecutionResult:
    """The result of a step whose worker answered ``done``: what it reports, overruled where the
    host decides (timeout, memory, tool budget)."""
    calls, ended = step.calls, step.ended
    outcome = done.get("outcome")
    # Outcomes only the host may give: a worker that reports one of them is lying.
    if outcome not in OUTCOMES or outcome in ("worker_lost", NO_CODE, HOST_ERROR, NOT_EXECUTED):
        outcome = "sandbox_violation"
    worker.cpu_s = _number(done.get("cpu_s"), 0.0, 1e9)
    dropped = int(_number(done.get("output_dropped"), 0, 1 << 53))
    # The root stops the worker and kills every other process of its principal (whatever
    # the step left running, detached or not), so nothing of this step outlives the result.
    ended_info = sandbox.end(worker)
    worker.reap = True
    stdout, truncated = output.text(dropped)
    error_type, message = done.get("error_type"), done.get("error_message")
    elapsed = time.monotonic() - start
    if outcome != "timeout" and (step.out_of_time or elapsed > timeout + TIMEOUT_SLACK_S):  # decided here
        outcome, error_type = "timeout", "Timeout"
        message = f"Timeout: the step ran longer than {timeout:g} s and was stopped"
    if ended_info.get("oom"):
        outcome, error_type = "resource_limit", "MemoryLimit"
        message = (f"MemoryLimit: the step's processes used more than {sandbox.memory_bytes >> 20} MiB "
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
                           duration_s=round(time.monotonic() - start, 6), isolation=sandbox.isolation)


def _number(value, low: float, high: float) -> float:
    """A numeric field of a frame, clamped to ``[low, high]`` (``low`` when not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return low
    value = float(value)
    return min(max(value, low), high) if math.isfinite(value) else low


def failure_outcome(kind: str | None, status: dict | None, timeout: float) -> tuple[str, str, str]:
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
