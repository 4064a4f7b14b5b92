"""The host's side of one step: hand the code to the worker's keeper, serve its tool calls, read its
output, and decide the result from what the host observes (``Executor.run`` calls :func:`run_step`).

**The verdict is the host's.** Each step gets two fresh sockets: a *verdict* socket, on which the
keeper's C chain (``inside.keeper``) writes 16 random bytes ``t`` before the step's code is
compiled and writes them again only when the code ran to its end (or to ``finish``/``give_up``),
and a *tool* socket for tool calls and the code's own report of its error. The step is ``ok``
exactly when the second ``t`` arrived; anything else the code writes on the verdict socket makes it
a ``sandbox_violation``. No code of the state can read ``t``, so none can forge the second one.

Everything else is decided here too, from facts the host sees: the deadline (``timeout_s`` of time
the step's threads could run: their run-queue waits on a busy host are given back, up to
``busy_backstop`` times, ``codetool.executor.kernel.schedstat``, and so is the wall time the host
spent performing the step's tool calls, each bounded by ``tool_timeout_s``, up to ``busy_backstop``
times ``timeout_s`` in all; the CPU the step's processes use meanwhile stays its time, checked while
a call runs and after it), the CPU limit (the kernel's SIGXCPU
kills the worker; the host reads the signal from its exit), the memory limit (the cgroup's OOM kills, or the root's poll), the file
size limit (SIGXFSZ), the tool-call and byte budgets (:class:`StepLedger`), the worker's death.
What the code reports about its error (type, message) is only the observation shown to the model;
a type name the host uses for its own verdicts is marked as the code's.

**Not executed.** A step whose code never started (no first ``t``: the step's thread could not be
created, the worker was lost before it ran, the host was too busy) or that the machine never let run
for ``timeout_s`` before the backstop is ``not_executed``: no reward, label or metric counts it,
unless the state lowered its own rlimits (``Sandbox.lowered_limits``): then it is the code's
failure (``resource_limit``, ``LimitLowered``). So is a step that met a tool *outage* (a tool that
gave no answer within ``tool_timeout_s``, or a ``ToolResponse`` marked ``outage``: a connection
that failed, HTTP 502/503/504 after the client's retries) and whose result is the code's own
(``ok`` or the error it raised): what it saw was the machine's failure, so neither the step nor its
state (killed) is counted (``ToolOutage``). A failure the host decides (the deadline on the code's
own time, memory, budgets, the verdict socket) stays the code's.

**The control socket (fd 3) is in the code's reach**, so what arrives there is checked against the
verdict (issue 37, red team): the keeper's "could not start the step's thread" (``N``) is genuine
only before the step's first ``t`` (it is sent when no thread exists), so an ``N`` after it is the
code's (``sandbox_violation``, the state killed), never ``not_executed``; an end report (``E``)
while a thread the keeper did not count runs on is a thread left behind (the verdict stands, the
state is killed with it), and one that comes between steps is the code's violation; the
keeper reports a control socket the step changed (``V``, see ``inside.keeper.intact``); a
step whose thread ended while its keeper stays silent is the code's once the verdict socket holds
bytes that are no token (the keeper's report, sent there through a ``dup2`` onto fd 3), or at the
backstop when nothing of the worker waits on the machine (``schedstat.runnable``).
These checks of the keeper's reports live in :mod:`codetool.executor.host.report`, and so does the
keeper's second check of fd 3 once the step's other processes are killed (``confirm_channel``,
part of the step), and its backstops: a worker that dies of a signal no machine sends (SIGIO) as a
step reaches it, or whose keeper sleeps in its receive with the step sent (at the deadline),
failed by its state's doing (``sandbox_violation``), not the machine's.
"""

from __future__ import annotations

import logging
import math
import select
import signal
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from codetool.executor.config import ExecutorConfig
from codetool.executor.host.channel import (
    POLL_IN,
    Conn,
    ProtocolError,
    clean_output,
    clean_text,
    log_safe,
    read_available,
    read_message,
    send_message,
)
from codetool.executor.host.family import WorkerHandle
from codetool.executor.host.proxy import perform_tool_call
from codetool.executor.host.report import (
    CHANNEL_FAILURES,
    IDLE_RECHECK_S,
    after_end_report,
    asleep_in_receive,
    confirm_channel,
    quiet,
    states_signal,
)
from codetool.executor.host.sandbox import Sandbox
from codetool.executor.host.verdict import (
    StepLedger,
    StepOutput,
    Verdict,
    code_error,
    failure_outcome,
    number,
    ran,
)
from codetool.executor.kernel.schedstat import exit_status, group_cpu, process_cpu, step_usage
from codetool.executor.result import NOT_EXECUTED, ExecutionResult

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 100_000  # of a finish answer or give_up reason, enforced here (not only in the sandbox)


def run_step(sandbox: Sandbox, worker: WorkerHandle, code: str, timeout: float, *, config: ExecutorConfig,
             tools: Mapping[str, Callable[..., Any]],
             drop: Callable[[WorkerHandle], dict | None]) -> ExecutionResult:
    """Run ``code`` on ``worker`` and decide its result (see the module docstring).

    Args:
        sandbox (`Sandbox`): the worker's family (``begin``/``end`` of the step, memory budget).
        worker (`WorkerHandle`): an idle worker holding the state (it keeps it when the step ends).
        code (`str`): the step's Python source.
        timeout (`float`): seconds the step may run (its run-queue waits not counted).
        config (`ExecutorConfig`): limits (output, tool calls, bytes held, tool timeout, backstop).
        tools (`Mapping[str, Callable]`): name -> host callable of the executor's tools.
        drop (`Callable[[WorkerHandle], dict | None]`): releases a worker that has to be killed and
            returns how it ended (the executor's ``_drop_worker``).
    Returns:
        An :class:`ExecutionResult` (``state_lost=True`` when the worker had to be dropped).
    """
    start = time.monotonic()
    read_available(worker.output_fd)  # output of background processes between runs: dropped
    worker.dead()  # (reads what its keeper sent since the last step: nothing, unless that step forged a report)
    if worker.stray:  # the keeper's real end report came after the step's forged one
        drop(worker)
        return ExecutionResult(ok=False, error_type="ProtocolError", error_message=CHANNEL_FAILURES["forged"],
                               outcome="sandbox_violation", state_lost=True, duration_s=round(time.monotonic() - start, 6),
                               isolation=sandbox.isolation)
    output = StepOutput(config.max_output_chars)
    base = group_cpu(worker.pid)  # the worker's CPU before the step (its keeper's own left out)
    verdict_host, verdict_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tool_host, tool_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sandbox.begin(worker)
    try:
        send_message(worker.ctl, b"R" + code.encode("utf-8", "surrogatepass"),
                     [verdict_worker.fileno(), tool_worker.fileno()])
    except EOFError as exc:
        verdict_host.close()
        tool_host.close()
        drop(worker)
        return _not_executed("StateLost", f"the worker holding the state was gone before the step ran ({exc})",
                             start, sandbox, state_lost=True)
    finally:
        verdict_worker.close()
        tool_worker.close()
    conn = Conn(tool_host)
    verdict_host.setblocking(False)
    step = StepLedger(conn, config)
    step.cpu_base = base
    verdict = Verdict()
    try:
        ended, failure, notes = _serve(sandbox, worker, conn, verdict_host, verdict, step, output, tools, config,
                                       start, timeout)
        _read_verdict(verdict_host, verdict)  # (what the keeper wrote before it was stopped or lost)
    finally:
        verdict_host.close()
    if ended is not None and ended[0] == 0 and failure is None:
        result = _finished(sandbox, worker, conn, verdict, step, output, notes, start, timeout, config, ended, drop)
    else:
        result = _stopped(sandbox, worker, conn, verdict, step, output, notes, start, timeout, failure, drop,
                          threads_left=ended[0] if ended else 0)
    conn.close()
    return result


def _serve(sandbox, worker, conn, verdict_sock, verdict, step, output, tools, config, start, timeout):
    """The step's loop: until the keeper says the step ended, or it has to be stopped. Returns
    ``(ended, failure, notes)``: the keeper's end report ``(threads left, CPU µs)`` or ``None``; why
    it was stopped (``timeout``, ``busy``, ``budget``, ``violation``, ``lost``, ``not_started``) or
    ``None``; notes (none yet). The CPU limit kills the worker (SIGXCPU): a ``lost`` worker."""
    deadline, backstop = start + timeout, start + timeout * config.busy_backstop
    base_backstop = backstop
    notes: set[str] = set()
    seen: dict = {}  # the step's threads' scheduler counters, for the wait the kernel has not published yet
    base = step.cpu_base

    def over() -> bool:  # asked while a tool call runs: the step's processes used its time in CPU
        return step_usage(worker.pid, sandbox.principal_pids(worker), seen, base)[1] >= timeout

    poller = select.poll()
    watched = {worker.ctl.fileno(), worker.output_fd, conn.fileno()}  # (the verdict socket is read at the end)
    for fd in watched:
        poller.register(fd, POLL_IN)
    while True:
        if conn.fileno() in watched:
            poller.modify(conn.fileno(), POLL_IN | (select.POLLOUT if conn.pending_output else 0))
        now = time.monotonic()
        if now >= deadline:
            # the step had its time when its processes got timeout s of CPU (a fork bomb starves itself),
            # or when timeout s passed that its threads did not spend waiting for a CPU; what already
            # arrived (its end included) is read first, and while no thread of the step runs (not
            # started yet, or ended and the keeper not yet scheduled) the time is the machine's
            ready = poller.poll(0)
            if not ready:
                others = sandbox.principal_pids(worker)
                wait, cpu, running = step_usage(worker.pid, others, seen, base)
                effective = max((now - start) - wait - step.tool_s, cpu)  # (tool calls: the tools' time)
                if not running:  # the step's thread ended (or never started) and the keeper is silent
                    _read_verdict(verdict_sock, verdict)
                    if verdict.tampered:  # (the keeper's end report lands there when fd 3 was replaced)
                        return None, "channel", notes
                    if verdict.token is None and asleep_in_receive(worker.pid):
                        _read_verdict(verdict_sock, verdict)  # (what it sent before it slept counts)
                        if verdict.token is None and not verdict.tampered and not poller.poll(0):
                            return None, "hidden", notes  # it never saw the request
                if now >= backstop:
                    if not running and verdict.token is not None and quiet([worker.pid] + others):
                        return None, "channel", notes  # it started, ended, and nothing waits for a CPU
                    _read_verdict(verdict_sock, verdict)
                    return None, ("busy" if effective < timeout or not running else "timeout"), notes
                if not running:
                    deadline = min(now + IDLE_RECHECK_S, backstop)
                    continue
                if effective >= timeout:
                    _read_verdict(verdict_sock, verdict)
                    return None, ("timeout" if verdict.token is not None else "not_started"), notes
                deadline = min(now + (timeout - effective), backstop)
                continue
        else:
            ready = poller.poll(min(deadline - now, 0.5) * 1000)
        for fd, events in ready:
            if fd == worker.output_fd:
                data = read_available(worker.output_fd)
                if data is None:
                    _unwatch(poller, watched, fd)
                else:
                    output.add(data)
            elif fd == worker.ctl.fileno():
                while (got := read_message(worker.ctl)) is not None:
                    data = got[0]
                    if not data:  # (a keeper whose fd 3 the code replaced reports there, then ends)
                        _read_verdict(verdict_sock, verdict)
                        return None, ("channel" if verdict.tampered else "lost"), notes
                    kind = data[:1]
                    if kind == b"E" and len(data) == 13:
                        _read_verdict(verdict_sock, verdict)
                        left = int.from_bytes(data[1:5], "big")
                        doubt = None if left else after_end_report(worker.pid, config.grace_s, backstop)
                        if doubt == "busy":  # a thread of the step waits for a CPU it never gets: the machine
                            return None, doubt, notes
                        # a thread the keeper did not count runs on (an end report the code wrote, or a
                        # C thread such as faulthandler's watchdog): as threads left behind, the verdict
                        # stands (a step still running has not ended: the code's failure) and the state,
                        # with the thread, is killed (tests/test_executor_verdict.py)
                        return (left or int(doubt == "forged"), int.from_bytes(data[5:13], "big")), None, notes
                    if kind == b"N":  # genuine only before the step's thread existed, so before any token
                        _read_verdict(verdict_sock, verdict)
                        started = verdict.token is not None or verdict.tampered
                        return None, ("forged" if started else "not_started"), notes
                    if kind == b"V":  # the keeper found its control socket (or fd 5) changed after the step
                        return None, "changed", notes
            else:
                try:
                    if events & select.POLLOUT:
                        conn.flush()
                    if events & POLL_IN:
                        conn.read()
                    while conn.frames:
                        spent = step.tool_s
                        _handle(conn.frames.popleft(), conn, step, output, tools, config, over)
                        if step.tool_s > spent:  # the deadline is looked at again; the backstop moves
                            deadline = min(deadline, time.monotonic())
                            backstop = base_backstop + min(step.tool_s, timeout * config.busy_backstop)
                        if step.held(conn, output) > step.max_bytes:
                            return None, "budget", notes
                    if conn.eof:
                        _unwatch(poller, watched, fd)
                except EOFError:
                    _unwatch(poller, watched, fd)
                except ProtocolError as exc:
                    logger.warning("sandbox protocol violation: %s", log_safe(exc))
                    return None, "violation", notes


def _unwatch(poller, watched: set, fd: int) -> None:
    if fd in watched:
        watched.discard(fd)
        poller.unregister(fd)


def _read_verdict(sock, verdict: Verdict) -> bool:
    """Take what waits on the verdict socket; returns whether its other end is closed."""
    while True:
        try:
            data = sock.recv(256)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True
        verdict.add(data)


def _handle(frame: dict, conn, step: StepLedger, output: StepOutput,
            tools: Mapping[str, Callable[..., Any]], config: ExecutorConfig,
            over: Callable[[], bool] | None = None) -> None:
    """Act on one frame of the step's tool socket. Past ``max_tool_calls``, tool calls are refused
    and the step fails; a tool answer that would take the host past the step's byte budget is a
    tool error. A call's time goes to ``step.tool_s`` (not the step's), its outage to ``step.outage``;
    ``over`` abandons the call when the step's processes have used the step's time in CPU."""
    op = frame["op"]
    if op == "tool":
        call, name, args, kwargs = frame.get("call"), frame.get("name"), frame.get("args"), frame.get("kwargs")
        if isinstance(call, bool) or not isinstance(call, int):
            raise ProtocolError("a tool call without a numeric id")
        if not isinstance(name, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ProtocolError("malformed tool call")
        step.requested += 1
        if step.requested > step.max_calls and not step.limit:
            step.limit = f"the step made more than {step.max_calls} tool calls"
        if step.limit:
            conn.queue({"op": "tool_result", "call": call, "status": "step_limit", "error": step.limit})
            conn.flush()
            return
        func = tools.get(name)
        shown = name if func is not None else log_safe(name, 100)
        began = time.monotonic()
        record, reply, outage = perform_tool_call(shown, func, args, kwargs, config.tool_timeout_s, over)
        step.tool_s += time.monotonic() - began
        if outage and step.outage is None:
            step.outage = f"{shown} failed on the tool's side ({record.status}: {record.error})"
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
    elif op == "raised":
        if step.raised is None:
            step.raised = {"error_type": frame.get("error_type"), "error_message": frame.get("error_message"),
                           "kind": frame.get("kind")}
        step.dropped = int(number(frame.get("output_dropped"), 0, 1 << 53))
    elif op == "end":
        step.dropped = int(number(frame.get("output_dropped"), 0, 1 << 53))
    else:
        raise ProtocolError(f"unexpected frame {op!r}")


def _drain(conn, step, output, worker, tools, config) -> bool:
    """Frames and output the step sent before its thread ended, still in the sockets. A tool call
    among them is not performed: the thread that asked for it is gone. Returns whether a frame
    broke the protocol."""
    broken = False
    try:
        conn.read()
        while conn.frames:
            frame = conn.frames.popleft()
            if frame.get("op") != "tool":
                _handle(frame, conn, step, output, tools, config)
    except EOFError:
        pass
    except ProtocolError as exc:
        logger.warning("sandbox protocol violation: %s", log_safe(exc))
        broken = True
    output.add(read_available(worker.output_fd) or b"")
    return broken


def _finished(sandbox, worker, conn, verdict, step, output, notes, start, timeout, config, ended,
              drop) -> ExecutionResult:
    """The keeper reported the step's end (no thread left): the verdict, overruled where the host
    decides (deadline, memory, budgets, the verdict socket)."""
    broken = _drain(conn, step, output, worker, {}, config)
    worker.cpu_s = ended[1] / 1e6
    memory = sandbox.end(worker)  # every other process of the principal is killed
    output.add(read_available(worker.output_fd) or b"")
    ok = ran(verdict, step)
    outcome, error_type, message = "ok", None, None
    if verdict.token is None:  # the code never started, yet an end report came: one the last step forged
        worker.stray = True  # (its state goes: the keeper and the host no longer agree on the step)
        outcome, error_type, message = "sandbox_violation", "ProtocolError", CHANNEL_FAILURES["forged"]
    elif broken:
        outcome, error_type = "sandbox_violation", "ProtocolError"
        message = "ProtocolError: the sandbox sent malformed data to the host."
    elif verdict.tampered:
        outcome, error_type = "sandbox_violation", "VerdictTampered"
        message = "VerdictTampered: the step wrote on the channel the host decides its verdict from."
    elif not ok:
        outcome, error_type, message = code_error(step)
    own = not (verdict.token is None or broken or verdict.tampered)  # the code's own result: ran, or raised
    if memory.get("oom") or memory.get("reason") == "memory":
        outcome, error_type, own = "resource_limit", "MemoryLimit", False
        message = (f"MemoryLimit: the step's processes used more than {sandbox.memory_bytes >> 20} MiB together "
                   f"and were killed.")
    lost = worker.stray
    if not lost and not (memory.get("oom") or memory.get("reason") == "memory"):
        channel = confirm_channel(worker.ctl, worker.pid, start + timeout * config.busy_backstop)
        if channel in ("changed", "hidden", "lost"):  # (a process of the step acted after the first check)
            ended_as = exit_status(worker.pid) if channel == "lost" else {}
            status = drop(worker) or {}
            if "signal" not in status and "exit" not in status:
                status.update(ended_as)
            lost, killed_by = True, states_signal(status)
            if channel != "lost" or killed_by:  # (another death, SIGKILL: the verdict stands, the state goes)
                outcome, error_type = "sandbox_violation", "ProtocolError"
                message = (CHANNEL_FAILURES["signal"].format(signal=killed_by) if killed_by
                           else CHANNEL_FAILURES["late"])
    if step.limit:  # decided here: the code cannot report its way out of its budget
        outcome, error_type, message, own = "resource_limit", "ToolLimit", f"ToolLimit: {step.limit}", False
    if own and step.outage:
        drop(worker)
        return _outage(step, start, sandbox, output)
    if worker.stray:
        drop(worker)
    return _result(outcome, error_type, message, output, step, start, sandbox, state_lost=lost)


def _stopped(sandbox, worker, conn, verdict, step, output, notes, start, timeout, failure, drop,
             threads_left=0) -> ExecutionResult:
    """The step was stopped (or its worker died, or left threads running): the worker is killed."""
    _drain(conn, step, output, worker, {}, sandbox.config)
    # a step that could not start because its state lowered its own rlimits is the code's failure
    lowered = sandbox.lowered_limits(worker) if failure in ("not_started", "busy", "lost") else []
    full = failure in ("not_started", "busy") and verdict.token is None and sandbox.address_space_full(worker)
    ended = exit_status(worker.pid) if failure == "lost" else {}  # (a fork copy's zombie waits
    used = process_cpu(worker.pid) if ended else None  # for its zygote to reap it)
    status = drop(worker) or {}
    if "signal" not in status and "exit" not in status:
        status.update(ended)
    if status.get("signal") == signal.SIGKILL and used is not None and used >= math.ceil(sandbox.config.cpu_time_s):
        status["signal"] = signal.SIGXCPU  # the hard CPU limit: SIGXCPU came while it was in the kernel
    output.add(read_available(worker.output_fd) or b"")
    started = verdict.token is not None
    memory = status.get("reason") == "memory" or status.get("oom")
    if failure is None:  # ended, but left threads running: the verdict stands, the state is lost
        if step.outage and not step.limit:
            return _outage(step, start, sandbox, output)
        outcome, error_type, message = ("ok", None, None) if ran(verdict, step) else code_error(step)
        return _result(outcome, error_type, message, output, step, start, sandbox, state_lost=True)
    if (lowered or full) and (failure == "busy" or not started):
        kind, what = ("LimitLowered", f"lowered its own {', '.join(lowered)} limit") if lowered else (
            "MemoryLimit", "holds all the address space it may use")
        return _result("resource_limit", kind, f"{kind}: the state this step runs in {what}, so the step could not "
                       f"start; nothing ran.", output, step, start, sandbox, state_lost=True)
    killed_by = states_signal(status) if failure == "lost" and not started and not memory else None
    if killed_by:  # (the keeper's check of fd 3 after each step is the rule; this, its backstop)
        return _result("sandbox_violation", "ProtocolError", CHANNEL_FAILURES["signal"].format(signal=killed_by),
                       output, step, start, sandbox, state_lost=True)
    if failure == "not_started" or (failure == "lost" and not started and not memory):
        detail = ("the step's thread could not be started" if failure == "not_started"
                  else "the worker holding the state was lost before the step ran")
        return _not_executed("WorkerStart" if failure == "not_started" else "StateLost", detail, start, sandbox,
                             state_lost=failure != "not_started", output=output, step=step)
    if failure == "busy":
        return _not_executed("HostBusy", f"the host was too busy to give the step {timeout:g} s to run", start,
                             sandbox, state_lost=True, output=output, step=step)
    if failure == "timeout":
        outcome, error_type = "timeout", "Timeout"
        message = f"Timeout: the step ran longer than {timeout:g} s and was killed."
    elif failure == "budget":
        outcome, error_type = "resource_limit", "StepLimit"
        message = (f"StepLimit: the step made the host hold more than {step.max_bytes >> 20} MiB (what it "
                   f"sent, and what it left unread); it was stopped.")
    elif failure == "violation":
        outcome, error_type = "sandbox_violation", "ProtocolError"
        message = "ProtocolError: the sandbox sent malformed data to the host and was stopped."
    elif failure in CHANNEL_FAILURES:
        outcome, error_type, message = "sandbox_violation", "ProtocolError", CHANNEL_FAILURES[failure]
    else:
        outcome, error_type, message = failure_outcome(status)
    if step.limit and failure != "violation" and failure not in CHANNEL_FAILURES:
        outcome, error_type, message = "resource_limit", "ToolLimit", f"ToolLimit: {step.limit}"
    return _result(outcome, error_type, message, output, step, start, sandbox, state_lost=True)


def _result(outcome, error_type, message, output, step, start, sandbox, state_lost) -> ExecutionResult:
    stdout, truncated = output.text(step.dropped)
    ok = outcome == "ok"
    return ExecutionResult(ok=ok, stdout=stdout, error_type=None if ok else error_type,
                           error_message=None if ok else message, outcome=outcome, output_truncated=truncated,
                           state_lost=state_lost, tool_calls=step.calls, final_answer=step.ended.get("answer"),
                           give_up_reason=step.ended.get("reason"),
                           duration_s=round(time.monotonic() - start, 6), isolation=sandbox.isolation)


def _outage(step: StepLedger, start: float, sandbox: Sandbox, output: StepOutput) -> ExecutionResult:
    """A step whose own result followed a tool outage (see the module docstring); its state is gone."""
    return _not_executed("ToolOutage", f"a tool call failed on the machine's side: {step.outage}", start, sandbox,
                         state_lost=True, output=output, step=step)


def _not_executed(error_type: str, detail: str, start: float, sandbox: Sandbox, *, state_lost: bool,
                  output: StepOutput | None = None, step: StepLedger | None = None) -> ExecutionResult:
    """A step the machine did not let run (see the module docstring)."""
    stdout, truncated = output.text(step.dropped if step else 0) if output else ("", False)
    return ExecutionResult(ok=False, stdout=stdout, error_type=error_type, output_truncated=truncated,
                           error_message=f"NotExecuted: {detail}; nothing of it is counted.", outcome=NOT_EXECUTED,
                           state_lost=state_lost, tool_calls=step.calls if step else [],
                           duration_s=round(time.monotonic() - start, 6), isolation=sandbox.isolation)


