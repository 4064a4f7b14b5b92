"""How much memory a long job's client takes, and a cap on the units it keeps in flight (issue 39).

A job against a server keeps many units in flight (``run``: episodes; ``build-trees``: trees),
and each holds memory on the client: its sandbox processes (a worker per executor, forks during
a step; roots shared through :class:`codetool.executor.FamilyPool`), its state and its
requests. :func:`tree_memory` measures this process and all its descendants: the proportional set
size (PSS: each shared page split among the processes that share it, so the sum is what the
processes really take; the sum of resident sizes counts a page shared by 60 forks 60 times) where
``/proc/<pid>/smaps_rollup`` is readable, else the resident size.

:class:`MemoryGate` is the cap: before a new unit starts it measures (at most every
``recheck_s``) what the units in flight added to the memory the process had when the gate was
made, and lets the unit start only while that plus one more unit's share (the mean of those in
flight) stays within ``limit_mb``. A unit always starts when none is in flight, so a job never
stalls; what it holds back starts when a unit ends or the memory falls. :func:`memory_limit_mb`
reads the setting (``max_memory_mb``: none is half the memory available at the start, 0 no cap).

Limits: Linux only (elsewhere nothing is measured and nothing is held back); the measure lags
what a unit is about to allocate, so the cap can be passed by what the units in flight grow
after they started (each sandbox step is bounded by ``executor.memory_mb`` on its own).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from codetool.config import ConfigError, option
from codetool.config_groups import Group

logger = logging.getLogger(__name__)

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class MemoryGroup(Group):
    """The memory cap of a long job's units in flight (``run``'s episodes, ``build-trees``' trees),
    enforced under continuous scheduling (a policy server) by :class:`MemoryGate`."""

    max_memory_mb: int | None = option(None, "MiB the units in flight (episodes, trees: their sandboxes and state, "
                                       "measured as proportional set size) may add to this process's memory: a new "
                                       "unit waits while one more would pass it; none: half the memory available "
                                       "at the start, 0: no cap. About 6 MiB per episode in flight and 13 MiB per "
                                       "tree, measured (docs/SCALE.md)")

    def __post_init__(self):
        super().__post_init__()
        if self.max_memory_mb is not None and self.max_memory_mb < 0:
            raise ConfigError(f"max_memory_mb must be >= 0 MiB (0: no cap; none: half the available memory), got "
                              f"{self.max_memory_mb}.")


@dataclass
class MemoryUse:
    """Memory of a process tree, in MiB.

    Args:
        pss_mb (`float`): proportional set size summed (resident size where PSS is unreadable).
        rss_mb (`float`): resident set size summed (shared pages counted in every process).
        processes (`int`): processes measured.
    """

    pss_mb: float = 0.0
    rss_mb: float = 0.0
    processes: int = 0


def _children() -> dict[int, list[int]]:
    """``{parent pid: [child pids]}`` of every process visible in ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _one(pid: int) -> tuple[float, float] | None:
    """``(pss, rss)`` bytes of one process, or ``None`` when it is gone."""
    rss = None
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1]) * 1024, float(rss)
    except OSError:  # not ours to read (another uid, not dumpable): its resident size stands in
        pass
    return float(rss), float(rss)


def tree_memory(pid: int | None = None) -> MemoryUse:
    """The memory of process ``pid`` (default: this one) and all its descendants (module docstring);
    all zeros where ``/proc`` is missing."""
    pid = os.getpid() if pid is None else int(pid)
    if not os.path.isdir("/proc"):
        return MemoryUse()
    children = _children()
    todo, seen, use = [pid], set(), MemoryUse()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, ()))
        found = _one(p)
        if found is not None:
            use.pss_mb += found[0] / 2**20
            use.rss_mb += found[1] / 2**20
            use.processes += 1
    return use


def available_mb() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in MiB, or ``None``."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit_mb(setting: int | None) -> float | None:
    """The cap that ``max_memory_mb`` sets: ``None`` (the default): half the memory available now;
    0: no cap (``None`` returned); a number: that many MiB."""
    if setting == 0:
        return None
    if setting is not None:
        return float(setting)
    available = available_mb()
    return None if available is None else available / 2


class MemoryGate:
    """Holds back new units while the memory the units in flight added would pass a limit.

    Args:
        limit_mb (`float`): MiB the units in flight may add to what the process had at the start.
        measure (`Callable[[], float]`, *optional*): MiB now (default: this process tree's PSS).
        recheck_s (`float`, *optional*, defaults to 0.5): the measure is taken at most this often;
            also how long a held-back unit waits before the memory is looked at again.
    """

    def __init__(self, limit_mb: float, measure: Callable[[], float] | None = None, recheck_s: float = 0.5):
        self.limit_mb, self.recheck_s = float(limit_mb), float(recheck_s)
        self.measure = measure or (lambda: tree_memory().pss_mb)
        self.base_mb = self.measure()
        self.held = 0  # times a unit was held back
        self.peak_mb = 0.0  # the most the units in flight were seen to add
        self._last = (float("-inf"), 0.0)
        self._lock = threading.Lock()

    def added_mb(self) -> float:
        """What the units in flight add now (measured at most every ``recheck_s``)."""
        with self._lock:
            at, value = self._last
            if time.monotonic() - at >= self.recheck_s:
                value = max(0.0, self.measure() - self.base_mb)
                self._last = (time.monotonic(), value)
                self.peak_mb = max(self.peak_mb, value)
            return value

    def admit(self, running: int) -> bool:
        """Whether one more unit may start beside ``running`` in flight (always when none is)."""
        if running <= 0:
            return True
        added = self.added_mb()
        if added + added / running <= self.limit_mb:
            return True
        with self._lock:
            if self.held == 0:
                logger.warning("memory cap: the %d units in flight add %.0f MiB (about %.1f MiB each); new units "
                               "wait while one more would pass max_memory_mb %.0f", running, added, added / running,
                               self.limit_mb)
            self.held += 1
        return False


    def report(self) -> None:
        """Log what the cap saw: the most the units in flight added, and how often one waited."""
        logger.info("memory cap %.0f MiB: the units in flight added at most %.0f MiB to the %.0f MiB at the start; "
                    "%d times a new unit waited", self.limit_mb, self.peak_mb, self.base_mb, self.held)


def memory_gate(setting: int | None) -> MemoryGate | None:
    """The gate of a ``max_memory_mb`` setting (:func:`memory_limit_mb`), or ``None`` for no cap."""
    limit = memory_limit_mb(setting)
    if limit is None or not os.path.isdir("/proc"):
        return None
    gate = MemoryGate(limit)
    logger.debug("memory cap: units in flight may add %.0f MiB to the %.0f MiB this process has", limit, gate.base_mb)
    return gate
