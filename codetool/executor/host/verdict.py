"""What the host decides a step's result from (``codetool.executor.host.step``): the records of one
step kept on the host (:class:`StepLedger`, :class:`StepOutput`), what arrived on its verdict
socket (:class:`Verdict`), and how a failure is named. Nothing here is taken from the sandbox
without a check: the code's own report of its error is an observation that may only tell failures
apart (:func:`code_error`)."""

from __future__ import annotations

import math
import signal

from codetool.executor.config import ExecutorConfig
from codetool.executor.host.channel import clean_output, clean_text
from codetool.executor.result import ToolCall

MAX_MESSAGE_CHARS = 2000
TOKEN_BYTES = 16
# Error types the host writes for its own verdicts; the same name reported by the code is marked.
HOST_ERROR_TYPES = frozenset(("Timeout", "CPULimit", "MemoryLimit", "ToolLimit", "StepLimit", "WorkerLost",
                              "ProtocolError", "NotExecuted", "HostBusy", "StateLost", "WorkerStart",
                              "VerdictTampered", "ToolOutage", "LimitLowered"))


class StepLedger:
    """Host-side bookkeeping of one run: the tool calls, the budgets used, the code's report."""

    def __init__(self, conn, cfg: ExecutorConfig):
        self.calls: list[ToolCall] = []
        self.requested = 0  # tool calls asked for, performed or not
        self.ended: dict[str, str | None] = {}
        self.limit: str | None = None  # why the step is over its budget
        self.tool_s = 0.0  # seconds the host spent performing the step's tool calls (not the step's time)
        self.cpu_base: float | None = None  # the worker's CPU (its keeper's own left out) when the step began
        self.outage: str | None = None  # the first tool call that failed on the tool's side (``proxy``)
        self.raised: dict | None = None  # the code's own description of its error (not trusted)
        self.dropped = 0  # output characters the worker dropped (its report)
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


class Verdict:
    """What arrived on the step's verdict socket: the announced ``t``; its second copy (the code
    returned), or ``t`` and a zero byte (it ended at ``finish``/``give_up``); anything else."""

    def __init__(self):
        self.token: bytes | None = None
        self.committed = False
        self.at_finish = False
        self.tampered = False

    def add(self, data: bytes) -> None:
        if self.token is None and len(data) == TOKEN_BYTES:
            self.token = data
        elif self.token is not None and not self.committed and data in (self.token, self.token + b"\x00"):
            self.committed, self.at_finish = True, data != self.token
        elif data:
            self.tampered = True


def ran(verdict: Verdict, step: StepLedger) -> bool:
    """The step ran to its end: ``t`` came back, and when it ended at the exception of
    ``finish``/``give_up``, one of them was called (else some code raised that class to stop early)."""
    return verdict.committed and not verdict.tampered and (not verdict.at_finish or bool(step.ended))


REPORTED_KINDS = ("runtime_error", "resource_limit", "sandbox_violation")


def code_error(step: StepLedger) -> tuple[str, str, str]:
    """A failure of the code, with its own description (an observation, not trusted). The code's
    report may only tell failures apart (``REPORTED_KINDS``: a resource or a permission error raised
    by the interpreter, which no kernel fact shows the host); it can never make one a success, a
    timeout or a step that did not run."""
    raised = step.raised or {}
    kind = str(raised["kind"]) if raised.get("kind") in REPORTED_KINDS else "runtime_error"
    error_type = clean_text(raised.get("error_type") if isinstance(raised.get("error_type"), str) else "Error", 100)
    if error_type in HOST_ERROR_TYPES:
        error_type = f"{error_type} (raised by the code)"
    message = raised["error_message"] if isinstance(raised.get("error_message"), str) else ""
    if not raised:
        message = "the step did not run to its end (it exited, or stopped early without finish or give_up)"
    return kind, error_type or "Error", clean_output(clean_text(message, MAX_MESSAGE_CHARS))


def number(value, low: float, high: float) -> float:
    """A numeric field of a frame, clamped to ``[low, high]`` (``low`` when not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return low
    value = float(value)
    return min(max(value, low), high) if math.isfinite(value) else low


def failure_outcome(status: dict | None) -> tuple[str, str, str]:
    """``(outcome, error_type, message)`` for a worker that died while its step ran."""
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
