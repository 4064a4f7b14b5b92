"""What the host makes of the reports a worker's keeper sends on its control socket (fd 3) while a
step runs (``codetool.executor.host.step``): fd 3 is in the step's code's reach, so a report there
is checked against what the host observes itself before it is believed.

- :data:`CHANNEL_FAILURES`: what a step that forged a keeper report or broke its control channel
  is told (both the code's ``sandbox_violation``).
- :func:`after_end_report`: whether an end report (``E``) is the keeper's, from the worker's
  threads as the kernel shows them (``/proc``), or a thread the keeper did not count runs on.
- :func:`quiet`: whether nothing of a worker waits for a CPU (a silent keeper on an idle machine is
  the code's doing, not the machine's).
- :func:`confirm_channel`: the keeper's second check of fd 3, once the step's other processes are
  killed (one of them may have changed fd 3 after the keeper's first check).
- :func:`asleep_in_receive`: whether a worker's keeper sleeps in its receive with the host's
  request sent (a state that hides requests from it; the machine would have woken it).
- :func:`states_signal`: whether a worker found dead when the host sent it a step died of a signal
  only its state's code arranges (the backstop of the keeper's check of fd 3, ``inside.keeper.intact``).

Nothing here depends on a wall-clock bound of a loaded machine: each answer is a kernel fact
(a thread exists, runs, waits for a CPU), looked at again until it is settled.
"""

from __future__ import annotations

import secrets
import select
import signal
import time

from codetool.executor.host.channel import POLL_IN, read_message, send_message
from codetool.executor.kernel.schedstat import runnable, thread_states

CHANNEL_FAILURES = {  # what the step did to its worker's control channel (fd 3): the code's violation
    "forged": "ProtocolError: the step wrote a report of the worker's keeper on its control channel (fd 3); "
              "it was stopped.",
    "channel": "ProtocolError: the step broke or replaced the worker's control channel (fd 3), so the end of "
               "the step could not be reported; it was stopped.",
    "signal": "ProtocolError: the worker holding the state died of {signal} when the host sent it a request, a "
              "signal that only the state's own code arranges (fd 3's I/O signals); nothing ran.",
    "changed": "ProtocolError: the step changed a descriptor its worker's keeper needs (the control channel, fd 3: "
               "its flags, I/O signals or socket options; or fd 5); it was stopped.",
    "hidden": "ProtocolError: the state this step runs in changed its worker's control channel (fd 3) so that "
              "its keeper never received the step; nothing ran.",
    "late": "ProtocolError: a process of the step changed a descriptor its worker's keeper needs (fd 3 or 5) "
            "after the step's end; it was stopped.",
}
RECEIVE_WAITS = ("wait_for_more_packets", "recv", "read_generic")  # kernel functions a socket receive sleeps in
# Signals that end a process for reasons outside the state's code: the host, the sandbox root, the
# OOM killer and operators (SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT), a fault of the machine or
# the interpreter (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT). A worker that no step runs in and
# that dies of another (SIGIO, or the signal the state chose with F_SETSIG) died of its state's doing.
MACHINE_SIGNALS = frozenset((signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                             signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT))
IDLE_RECHECK_S = 0.05  # how often a deadline is looked at again while no thread of the step runs
END_CPU_S = 0.05  # CPU a step's thread may still use after the keeper's end report (its exit)


def after_end_report(pid: int, grace: float, until: float) -> str | None:
    """Whether an end report the keeper's control socket gave is the keeper's: it sends one when
    the step's threads are gone, their exit aside, so worker ``pid`` is then down to its keeper
    thread. ``None``: it is. ``"forged"``: a thread the keeper did not count still runs after
    ``grace`` seconds (asleep, or using CPU): the code wrote the report, or left a C thread behind
    (``faulthandler``'s watchdog); either way a thread left behind (the verdict stands, the state is
    killed). ``"busy"``: one still waits for a CPU, without getting any, at ``until`` (the step's
    backstop): the machine holds its exit."""
    start, pause = time.monotonic(), 0.0002
    before = {tid: cpu for tid, (_, cpu) in thread_states(pid).items()}
    while True:
        threads = {tid: got for tid, got in thread_states(pid).items() if tid != pid}
        if not threads:
            return None
        now = time.monotonic()
        if now - start >= max(grace, IDLE_RECHECK_S):
            used = sum(cpu - before.get(tid, 0.0) for tid, (_, cpu) in threads.items())
            if used >= END_CPU_S or not any(state in ("R", "D") for state, _ in threads.values()):
                return "forged"
            if now >= until:
                return "busy"
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def quiet(pids: list[int], span: float = 0.03) -> bool:
    """Whether no thread of ``pids`` waits on the machine (``schedstat.runnable``) over ``span``
    seconds: several looks, so that a keeper the machine starves is caught between its short sleeps
    (at most 5 ms each while it waits for a step's threads to go)."""
    end = time.monotonic() + span
    while True:
        if runnable(pids):
            return False
        if time.monotonic() >= end:
            return True
        time.sleep(0.002)


def states_signal(status: dict) -> str | None:
    """The name of the signal a worker died of (``status``: how it ended, ``{"signal": n}``) when
    no step of it ran and the signal is none the machine sends (:data:`MACHINE_SIGNALS`): its state
    arranged it (``O_ASYNC`` and ``F_SETOWN`` on fd 3 deliver SIGIO when the host's next request
    arrives). ``None`` otherwise: the machine's, or unknown (its step is ``not_executed``)."""
    sig = status.get("signal")
    if not isinstance(sig, int) or isinstance(sig, bool) or sig <= 0 or sig in MACHINE_SIGNALS:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def asleep_in_receive(pid: int, span: float = 0.03) -> bool:
    """Whether worker ``pid`` sleeps in its keeper's receive, every thread of it in state ``S``
    and its keeper (the main thread) in a socket receive (``/proc/<pid>/wchan``), at each of
    several looks over ``span`` seconds. Asked when a request the host sent got no answer: the
    kernel wakes a receiver when a message arrives (it is then ``R`` until it runs, however busy
    the machine), so a keeper still asleep there did not see the request, which only the state's
    changes to fd 3 do (a peek offset, a filter, descriptors cut off: ``inside.keeper.intact``).
    ``False`` when anything is unsure (``/proc`` unreadable, no ``wchan``)."""
    end = time.monotonic() + span
    while True:
        states = thread_states(pid)
        if not states or any(state != "S" for state, _ in states.values()):
            return False
        try:
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
        except OSError:
            return False
        if not any(name in wchan for name in RECEIVE_WAITS):
            return False
        if time.monotonic() >= end:
            return True
        time.sleep(0.002)


def confirm_channel(ctl, pid: int, until: float) -> str:
    """Ask worker ``pid``'s keeper, on its control socket ``ctl``, to check fd 3 again (``C`` and
    16 random bytes it echoes, so that nothing a process of the step wrote earlier reads as its
    answer), once the host killed the step's other processes: none is left to change fd 3 after
    this check. Returns ``"intact"``; ``"changed"`` (the keeper's ``V``); ``"hidden"`` (the keeper
    sleeps in its receive with the request sent, :func:`asleep_in_receive`); ``"lost"`` (the
    worker died, e.g. of the SIGIO the request raised); ``"unsure"``: no answer by ``until`` (the
    step's backstop) while the keeper was not found asleep: the machine's, nothing is concluded."""
    nonce = secrets.token_bytes(16)
    try:
        send_message(ctl, b"C" + nonce)
    except EOFError:
        return "lost"
    poller = select.poll()
    poller.register(ctl.fileno(), POLL_IN)
    while True:
        while (got := read_message(ctl)) is not None:
            if not got[0]:
                return "lost"
            if got[0] == b"c" + nonce:
                return "intact"
            if got[0][:1] == b"V":
                return "changed"
        if time.monotonic() >= until:
            return "unsure"
        if not poller.poll(IDLE_RECHECK_S * 1000) and asleep_in_receive(pid) and not poller.poll(0):
            return "hidden"
