"""How a long loop of a part reports progress to the command that runs it (only commands draw).

Two channels, both without ``rich`` (nothing below the commands imports it, ``tests/test_layering.py``):

- **Units** (:data:`ProgressFactory`): a part calls the factory once with the number of units it is
  about to run (queries, trees, judge batches) and calls what that returns (:data:`Tick`) with each
  unit as it finishes (a written record, a batch).
- **Work inside the units** (:func:`note_work`): the sampler (:func:`codetool.search.expand.expand`)
  reports each expansion it finishes (one step of one episode; one node of a tree, expanded into
  its children) to whoever listens (:func:`listening`). Trees grow together and an episode takes
  several steps, so counting finished units alone left a bar at 0% until the end.

:class:`JobProgress` joins the two into what a person reads: units done, work done out of a bound
(a unit that ends early credits the work it did not need, so the fraction reaches 1 exactly at
the end), elapsed time and an ETA; :meth:`JobProgress.line` is one plain log line with the same
counts, and :class:`Heartbeat` logs it every ``interval_s`` seconds even when nothing finished
(under nohup or Slurm, where no bar is drawn). The commands draw a ``rich`` bar on a terminal and
log these lines otherwise (:func:`codetool.commands.job_progress`).

Limits: work is counted per process (a Ray worker's expansions are not seen by the driver, whose
bar then moves by units); the bound of a unit's work is an upper bound (max steps, a full tree),
so the ETA errs long while units finish early, and it is an estimate from the rate so far.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

Tick = Callable[[Any], None]
ProgressFactory = Callable[[int], Tick]

LOG_INTERVAL_S = 30.0  # a plain progress line at least this often when no bar is drawn

_LISTENERS: list[Callable[[int], None]] = []
_LOCK = threading.Lock()


def ticker(progress: ProgressFactory | None, total: int) -> Tick:
    """``progress(total)``, or a tick that does nothing when there is no ``progress``."""
    return progress(total) if progress is not None else _no_tick


def _no_tick(unit: Any = None) -> None:
    return None


def note_work(n: int) -> None:
    """Report ``n`` finished expansions (steps, tree nodes) to every listener; cheap when none."""
    if _LISTENERS:
        for listener in list(_LISTENERS):
            listener(n)


@contextlib.contextmanager
def listening(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(n)`` for every :func:`note_work` of this process inside the block."""
    with _LOCK:
        _LISTENERS.append(callback)
    try:
        yield
    finally:
        with _LOCK:
            _LISTENERS.remove(callback)


def clock_text(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class JobProgress:
    """Counts of a long job: units (queries, trees) and the work inside them (steps, nodes).

    Args:
        what (`str`): the job, e.g. ``"trees"`` or ``"spot+latent on stabletoolbench"``.
        unit (`str`): the plural name of a unit (``trees``, ``queries``).
        work (`str`, *optional*): the plural name of the work counted (``nodes``, ``steps``);
            empty: units only.
        work_per_unit (`float`, *optional*, defaults to `1`): the most work one unit can take, in
            the reported expansions (a tree: its inner nodes; an episode: max steps).
        scale (`int`, *optional*, defaults to `1`): what one expansion shows as (a tree node
            expansion makes ``branching`` nodes).
        used (`Callable[[dict], int]`, *optional*): the expansions a finished unit's record used
            (the rest of its bound is credited when it finishes).
        clock (`Callable[[], float]`, *optional*): monotonic seconds (tests pass a fake one).

    Thread-safe: work is noted from the sampler's threads, units from the writer's.
    """

    def __init__(self, what: str, unit: str, work: str = "", *, work_per_unit: float = 1.0, scale: int = 1,
                 used: Callable[[dict], int] | None = None, clock: Callable[[], float] = time.monotonic):
        self.what, self.unit, self.work_name = what, unit, work
        self.work_per_unit, self.scale, self.used, self.clock = max(work_per_unit, 1.0), scale, used, clock
        self.total_units, self.units = 0, 0
        self.work_done = 0.0  # expansions seen plus the credit of units that ended early
        self.work_seen = 0
        self.started = clock()
        self.lock = threading.Lock()

    # ----------------------------------------------------------------- counting
    def add_units(self, total: int) -> None:
        with self.lock:
            self.total_units += total

    def add_work(self, n: int) -> None:
        with self.lock:
            self.work_done += n
            self.work_seen += n

    def unit_done(self, record: Any = None) -> None:
        with self.lock:
            self.units += 1
            if self.work_name:
                spent = self.used(record) if self.used is not None and isinstance(record, dict) else 0
                self.work_done += max(0.0, self.work_per_unit - spent)

    # ----------------------------------------------------------------- reading
    @property
    def work_total(self) -> float:
        return self.total_units * self.work_per_unit if self.work_name else float(self.total_units)

    def fraction(self) -> float:
        done = self.work_done if self.work_name else self.units
        return min(1.0, done / self.work_total) if self.work_total else 0.0

    def elapsed(self) -> float:
        return self.clock() - self.started

    def eta(self) -> float | None:
        """Seconds left at the rate so far; ``None`` before any work is done."""
        f = self.fraction()
        return self.elapsed() * (1 - f) / f if f > 0 else None

    def counts(self) -> str:
        """``3/10 trees, 90/~620 nodes``: units, and the work seen out of its bound."""
        with self.lock:
            parts = [f"{self.units}/{self.total_units} {self.unit}"]
            if self.work_name:
                parts.append(f"{self.work_seen * self.scale}/~{int(self.work_total * self.scale)} {self.work_name}")
        return ", ".join(parts)

    def line(self) -> str:
        """One plain line with the counts, e.g. ``trees: 3/10 trees, 90/~620 nodes (14%), elapsed
        2:31, ETA ~15:20``."""
        return (f"{self.what}: {self.counts()} ({100 * self.fraction():.0f}%), elapsed {clock_text(self.elapsed())}, "
                f"ETA ~{clock_text(self.eta())}")

    def factory(self, on_change: Callable[[], None] = lambda: None) -> ProgressFactory:
        """The :data:`ProgressFactory` to hand a job: each call adds units, each tick ends one."""

        def start(total: int) -> Tick:
            self.add_units(total)
            on_change()

            def tick(record: Any = None) -> None:
                self.unit_done(record)
                on_change()
            return tick
        return start


class Heartbeat:
    """Log ``line()`` every ``interval_s`` seconds in a daemon thread until stopped (a ``with`` block):
    a job with no terminal says where it is at least that often, even while one step runs long.

    Args:
        line (`Callable[[], str]`): the text of each log line.
        interval_s (`float`, *optional*, defaults to :data:`LOG_INTERVAL_S`).
        log (`Callable[[str], None]`, *optional*): defaults to this module's logger at INFO.
    """

    def __init__(self, line: Callable[[], str], interval_s: float = LOG_INTERVAL_S,
                 log: Callable[[str], None] | None = None):
        self.text, self.interval_s = line, interval_s
        self.log = log or (lambda text: logger.info("%s", text))
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="codetool-progress", daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.log(self.text())

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.log(self.text())  # the last counts, whatever the interval
