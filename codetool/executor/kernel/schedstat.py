"""How long the machine kept the sandbox from running: the facts the executor's deadlines count
with, so that a busy host makes a step or a fork slower, never a failure of the code.

- :func:`task_waits`: seconds each thread of some processes waited on a run queue while runnable
  (``/proc/<pid>/task/<tid>/schedstat``, second field), by thread id. A step's deadline is
  extended by the longest wait of its threads since it began (``codetool.executor.host.step``).
- :func:`total_cpu`: CPU seconds a step's processes received: a step that starves itself (a fork
  bomb) still reaches its deadline, in CPU time.
- :class:`Watch`: the same for a fork or a worker start, whose processes are known only in part
  when it begins: the processes named then (the zygote, the sandbox root), from then on, and every
  child they started since, over its whole life.

Both are read on the host, from the kernel; nothing in the sandbox can change them except by
running (which is what they count). Where a file is missing (no ``CONFIG_SCHED_INFO``), the
readings are 0: deadlines are then plain wall-clock times, extended by nothing.
"""

from __future__ import annotations

import os
import time


def _threads(pids: list[int]):
    """``(pid, tid)`` of every thread of ``pids`` that still exists (``/proc/<pid>/task``)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            yield pid, tid


def task_waits(pids: list[int]) -> dict[int, float]:
    """Run-queue seconds of every thread of ``pids`` (host pids), by thread id."""
    found: dict[int, float] = {}
    for pid, tid in _threads(pids):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                found[int(tid)] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return found


def longest_wait(pids: list[int], baseline: dict[int, float]) -> float:
    """The longest run-queue wait of a thread of ``pids`` since ``baseline`` (threads not in it
    started later and count from zero)."""
    waits = task_waits(pids)
    return max((wait - baseline.get(tid, 0.0) for tid, wait in waits.items()), default=0.0)


def step_usage(worker: int, others: list[int], seen: dict[int, tuple[tuple[int, int], float]] | None = None,
               base: float | None = None) -> tuple[float, float, int]:
    """``(longest run-queue wait, CPU seconds, threads of the worker running the step)`` of a step
    so far: over the threads of process ``worker`` but its main one (the keeper: a step runs in
    threads it starts, from zero) and every thread of ``others`` (the step's processes, which
    started during it).

    The kernel adds a wait to a thread's ``schedstat`` only when the thread next gets a CPU: a
    thread the machine keeps waiting (a low share on a busy CPU) shows none of its current wait.
    With ``seen`` (a dict kept across the calls of one step), a thread that is runnable (state
    ``R``) and whose run and wait counters did not move since an earlier call has waited at least
    since that call, and the wait counts from then: an underestimate, so a step that ran out its
    time is still a timeout.

    With ``base`` (:func:`group_cpu` of ``worker`` when the step began), the CPU is at least the
    worker's whole-process growth since then, which keeps the time of threads that ended and of
    children it reaped (a step that spun in short-lived threads or children read ``ok`` after
    eight times its ``timeout_s`` in CPU; red team, round 5), plus the live threads of ``others``."""
    wait, cpu, tick, running, outside = 0.0, 0.0, os.sysconf("SC_CLK_TCK"), 0, 0.0
    now = time.monotonic()
    for pid in [worker] + others:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            if pid == worker and tid == str(worker):
                continue
            running += pid == worker
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ran, waited = (int(x) for x in f.read().split()[:2])
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, ValueError, IndexError):
                continue
            pending = 0.0
            if seen is not None:
                key = int(tid)
                before = seen.get(key)
                if before is not None and before[0] == (ran, waited) and fields[0] == "R":
                    pending = now - before[1]
                elif before is None or before[0] != (ran, waited):
                    seen[key] = ((ran, waited), now)
            wait = max(wait, waited / 1e9 + pending)
            used = (int(fields[11]) + int(fields[12])) / tick
            cpu += used
            outside += used if pid != worker else 0.0
    if base is not None and (group := group_cpu(worker)) is not None:
        cpu = max(cpu, group - base + outside)
    return wait, cpu, running


def group_cpu(pid: int) -> float | None:
    """CPU seconds of process ``pid`` but its main thread (a worker's keeper): every other thread,
    ended ones included, and the children it reaped (``/proc/<pid>/stat`` utime, stime, cutime,
    cstime less the main thread's own); ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            main = f.read().rsplit(")", 1)[1].split()
        total = sum(int(x) for x in fields[11:15]) - int(main[11]) - int(main[12])
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def thread_states(pid: int) -> dict[int, tuple[str, float]]:
    """``{tid: (state letter, CPU seconds)}`` of the threads of process ``pid`` (``{}`` when gone)."""
    found: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for _, tid in _threads([pid]):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            found[int(tid)] = (fields[0], (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    return found


def runnable(pids: list[int]) -> bool:
    """Whether a thread of ``pids`` waits on the machine (``/proc/<pid>/task/<tid>/stat`` state ``R``:
    running or waiting for a CPU; ``D``: an uninterruptible wait, e.g. on the disk or on memory
    reclaim). None does when all of them sleep or are stopped: waiting on something but the machine."""
    for pid, tid in _threads(pids):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("R", "D"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def exit_status(pid: int, wait: float = 1.0) -> dict:
    """How process ``pid`` ended, read from its zombie (``/proc/<pid>/stat``'s exit code):
    ``{"signal": n}``, ``{"exit": n}``, or ``{}`` when it is gone (reaped) or still not a zombie
    after ``wait`` seconds (a process closes its files, which the host sees, before it is one)."""
    end, pause = time.monotonic() + wait, 0.001
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, code = fields[0], int(fields[49])
        except (OSError, ValueError, IndexError):
            return {}
        if state == "Z":
            return {"signal": code & 0x7F} if code & 0x7F else {"exit": (code >> 8) & 0xFF}
        if time.monotonic() >= end:
            return {}
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def children(pids: list[int]) -> set[int]:
    """The children of ``pids`` (host pids, from ``/proc/<pid>/task/<tid>/children``)."""
    found: set[int] = set()
    for pid, tid in _threads(pids):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return found


class Watch:
    """How long the processes doing some work were kept from running since the work began.

    Args:
        pids (`list[int]`): host pids known at the start (others may join as their children).
    """

    def __init__(self, pids: list[int]):
        self.pids = [pid for pid in pids if pid]
        self.start = time.monotonic()
        self.baseline = task_waits(self.pids)
        self.known = children(self.pids)

    def starved(self) -> float:
        """Seconds since the start that the longest-waiting of these processes (or of the
        children they started since) spent runnable and not running; at most the time elapsed."""
        newborn = list(children(self.pids) - self.known)
        wait = max(longest_wait(self.pids, self.baseline), longest_wait(newborn, {}) if newborn else 0.0)
        return min(wait, time.monotonic() - self.start)


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user and system) process ``pid`` used so far (``/proc/<pid>/stat``), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def total_cpu(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` used so far, together."""
    return sum(process_cpu(pid) or 0.0 for pid in pids)
