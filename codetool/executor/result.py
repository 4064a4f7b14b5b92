"""What one ``Executor.run`` returns: :class:`ExecutionResult` and its :class:`ToolCall` records,
and the seam the search, the trees and policy RL hold an executor by, :class:`StepExecutor`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# ExecutionResult.outcome values; only "ok" counts as a successful execution (R_spot = 1).
# NO_CODE: the reply held no code block, so nothing ran; set by the search (no_code_result), never
# by the executor (a worker that reports it is treated as a sandbox violation).
# HOST_ERROR: the executor itself raised instead of reporting (a fault of the host, not of the code);
# set by the search (host_error_result), never by the executor; it ends the episode as an error.
# NOT_EXECUTED: the step's code could not run for a reason outside the code (a fork or worker that did
# not start or was lost, a lost state, a host resource failure, a deadline caused by a busy host), after
# the executor's bounded retries (``attempts``): no information about the code, never its failure.
NO_CODE = "no_code"
HOST_ERROR = "host_error"
NOT_EXECUTED = "not_executed"
OUTCOMES = ("ok", "runtime_error", "sandbox_violation", "timeout", "resource_limit", "worker_lost", NO_CODE,
            HOST_ERROR, NOT_EXECUTED)


@dataclass
class ToolCall:
    """One tool call made by the code, as the host performed it.

    Args:
        name (`str`): the Python function name the code called.
        arguments (`dict`): the arguments by parameter name (positionals mapped to names where the
            host callable has a signature; extra positionals under ``"*args"``); a bounded preview
            (``ARGUMENT_PREVIEW_CHARS``): a value whose JSON is longer is kept as the start of
            that JSON followed by ``...[cut]``.
        arguments_sha256 (`str`): SHA-256 (hex) of the whole arguments' canonical JSON (sorted
            keys), so calls stay comparable when their preview is cut.
        status (`str`): ``ok`` or a failure kind of ``codetool.tools.spec.TOOL_STATUSES``.
        latency_s (`float`): host-side seconds the call took.
        error (`str` or `None`): the short reason given to the code when ``status != "ok"``.
        response (`str`): the start of the content the code received (``RESPONSE_PREVIEW_CHARS``),
            for trajectory records, exports and judges; the code itself got the whole content.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"
    latency_s: float = 0.0
    error: str | None = None
    response: str = ""
    arguments_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, as in a trajectory record's ``tool_calls``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


RESPONSE_PREVIEW_CHARS = 1000
ARGUMENT_PREVIEW_CHARS = 2000  # JSON characters of a call's arguments kept in its record



@dataclass
class ExecutionResult:
    """The outcome of running one step of code.

    Args:
        ok (`bool`): the code ran to its end (or to ``finish``/``give_up``) without an error.
        stdout (`str`): what the code printed (stdout and stderr interleaved, capped; a truncation
            marker ends it when ``output_truncated``). Undecodable bytes are replaced.
        error_type (`str` or `None`): the exception class name (``NameError``, ``ToolError``,
            ``Timeout``, ``WorkerLost``...), ``None`` when ``ok``.
        error_message (`str` or `None`): a short message for the model: the error and the failing
            line of the step (with the calling line when it failed inside an earlier step's
            function).
        outcome (`str`): one of ``OUTCOMES``: ``ok``, ``runtime_error``, ``sandbox_violation``,
            ``timeout``, ``resource_limit``, ``worker_lost``, ``no_code`` (:func:`no_code_result`),
            ``host_error`` (:func:`host_error_result`) or ``not_executed`` (the code could not run for
            a reason outside it; see :attr:`executed`).
        output_truncated (`bool`): output beyond ``max_output_chars`` was dropped.
        state_lost (`bool`): the worker was replaced during this run (timeout kill, crash,
            ``os._exit``) or had died before it: variables, functions and imports of earlier steps
            are gone from now on. The caller tells the model (``codetool.search.prompt``
            does).
        tool_calls (`list[ToolCall]`): the calls this run made, in order.
        final_answer (`str` or `None`): the argument of the first ``finish`` call.
        give_up_reason (`str` or `None`): the argument of ``give_up``, when the code gave up.
        duration_s (`float`): wall-clock seconds of the run.
        isolation (`str`): the isolation layers that were active, e.g.
            ``bwrap(net,pid,ipc,uts,mount)+uid+rlimits(as,data,cpu,fsize,nofile,nproc,core)``.
        attempts (`int`, *optional*, defaults to 1): how many times the executor tried to run the
            step (more than 1 after a failure of the machine was retried).
    """

    ok: bool
    stdout: str = ""
    error_type: str | None = None
    error_message: str | None = None
    outcome: str = "ok"
    output_truncated: bool = False
    state_lost: bool = False
    tool_calls: list[ToolCall] = field(default_factory=list)
    final_answer: str | None = None
    give_up_reason: str | None = None
    duration_s: float = 0.0
    isolation: str = ""
    attempts: int = 1

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"ExecutionResult.outcome must be one of {OUTCOMES}, got {self.outcome!r}.")

    @property
    def timed_out(self) -> bool:
        """Whether the run hit its wall-clock limit."""
        return self.outcome == "timeout"

    @property
    def executed(self) -> bool:
        """Whether the step's code ran (``False`` only for ``not_executed``): a result that was not
        executed says nothing about the code, and no reward, label or metric counts it."""
        return self.outcome != NOT_EXECUTED

    @property
    def finished(self) -> bool:
        """Whether the code ended the episode (``finish`` or ``give_up``)."""
        return self.final_answer is not None or self.give_up_reason is not None

    @property
    def host_error(self) -> str | None:
        """The executor's own fault (its exception, redacted) when ``outcome == "host_error"``."""
        return self.error_message if self.outcome == HOST_ERROR else None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data for the trajectory record (``Candidate.result`` on disk): the
        fields, ``timed_out``, and ``host_error`` for a host fault."""
        data = dataclasses.asdict(self)
        data["timed_out"] = self.timed_out
        if self.outcome == HOST_ERROR:
            data["host_error"] = self.host_error
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecutionResult:
        """Inverse of :meth:`to_dict` (derived keys, ``timed_out`` and ``host_error``, are ignored).

        Raises:
            ValueError: ``outcome`` is not one of ``OUTCOMES``.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["tool_calls"] = [c if isinstance(c, ToolCall) else ToolCall.from_dict(c)
                                for c in values.get("tool_calls", [])]
        return cls(**values)


def no_code_result(reason: str | None) -> ExecutionResult:
    """The result of a candidate whose reply had no code block: nothing ran, ``R_spot = 0``.

    Args:
        reason (`str` or `None`): why no code was found (``codetool.search.prompt.parse_candidate``).
    """
    return ExecutionResult(ok=False, outcome=NO_CODE, error_type="NoCodeBlock", error_message=reason)


def host_error_result(message: str, error_type: str) -> ExecutionResult:
    """The result of a candidate whose executor raised instead of reporting: ``R_spot = 0``, and
    the search ends the episode (or the tree) as an error.

    Args:
        message (`str`): the exception as text, already redacted and cut.
        error_type (`str`): the exception's class name.
    """
    return ExecutionResult(ok=False, outcome=HOST_ERROR, error_type=error_type, error_message=message)


@runtime_checkable
class StepExecutor(Protocol):
    """A stateful Python session that runs one step at a time (``codetool.executor.Executor``).

    ``run`` never raises for a problem of the code (it comes back in the :class:`ExecutionResult`);
    ``fork`` gives an independent copy of the current state (each candidate step of a search runs
    in its own fork); ``close`` frees the session and is safe to call twice.
    """

    def run(self, code: str, *, timeout_s: float | None = None) -> ExecutionResult:
        """Run one step in the current state; the state it leaves becomes the current state."""
        ...

    def fork(self) -> StepExecutor:
        """A new session holding a copy of this one's state."""
        ...

    def close(self) -> None:
        """Free the session (its worker, its scratch folder)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        ...
