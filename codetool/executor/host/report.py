"""What the host makes of the reports a worker's keeper sends on its control socket (fd 3) while a
step runs (``codetool.executor.host.step``): fd 3 is in the step's code's reach, so a report there
is checked against what the host observes itself before it is believed.

- :data:`CHANNEL_FAILURES`: what a step that forged a keeper report or broke its control channel
  is told (both the code's ``sandbox_violation``).
- :func:`after_end_report`: whether an end report (``E``) is the keeper's, from the worker's
  threads as the kernel shows them (``/proc``), or a thread the keeper did not count runs on.
- :func:`quiet`: whether nothing of a worker waits for a CPU (a silent keeper on an idle machine is
  the code's doing, not the machine's).

Nothing here depends on a wall-clock bound of a loaded machine: each answer is a kernel fact
(a thread exists, runs, waits for a CPU), looked at again until it is settled.
"""

from __future__ import annotations

import time

from codetool.executor.kernel.schedstat import runnable, thread_states

CHANNEL_FAILURES = {  # what the step did to its worker's control channel (fd 3): the code's violation
    "forged": "ProtocolError: the step wrote a report of the worker's keeper on its control channel (fd 3); "
              "it was stopped.",
    "channel": "ProtocolError: the step broke or replaced the worker's control channel (fd 3), so the end of "
               "the step could not be reported; it was stopped.",
}
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
