"""The reference re-run of a trajectory's chosen steps, run while its episode goes on (issue 39).

:func:`codetool.search.reference.record_reference_steps` re-runs every chosen step of a finished
trajectory as the public CodeTool code runs it (SCEP's statuses). A step's program depends only on
the chosen replies up to it (:func:`~codetool.search.reference.chosen_programs`), so
:class:`StepwiseReference` runs it as soon as the step is chosen, in the background while the
episode waits for its next generation; when the trajectory ends only its last step is left to
run. Before, the re-runs of the trajectories that ended last (five programs each, a burst of them
when a wave of episodes ends together) ran after the search's last reply, on the way of the
job's end.

Guarantees: the same entries as ``record_reference_steps`` gives the finished trajectory: one
runner (:meth:`ReferenceRunner.for_task`, started with the first step, as before at the end), the
programs run in step order, one at a time, so its :class:`~codetool.search.reference.ReferenceTools`
makes the same calls in the same order; a runner that fails leaves the trajectory without
reference steps, with the same warning. If the finished trajectory's chosen replies do not
continue the ones seen (a strategy that revises its path), what ran is dropped and the steps
are re-run from scratch.

Limits: a runner (a sandbox worker, ~3 MiB of memory of its own) is held from an episode's step
to its end, not only at its end, so :class:`StepwiseReferences` gives at most ``workers`` (16)
episodes one at once, as many runners as the re-runs at the end held at once before, and in
``codetool run`` only in place of episodes the job may keep in flight but has no query left for
(its last wave, or a job of fewer queries than that): its peak memory stays what its episodes take.
The others are re-run once they end, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from codetool.search.reference import (
    ReferenceRunner,
    chosen_programs,
    chosen_texts,
    rerun_failed,
    step_entry,
)

Submit = Callable[[Callable[[], None]], Any]
"""Runs a job in the background (e.g. a thread pool's ``submit``)."""


class StepwiseReference:
    """The reference re-run of one trajectory's chosen steps, step by step (module docstring).

    Args:
        task (`SearchTask`): the trajectory's task (its tools answer the programs).
        make_executor (`Callable[[SearchTask], StepExecutor]`): the executor factory
            (:meth:`ReferenceRunner.for_task`).
        submit (`Callable[[Callable[[], None]], Any]`): runs a job in the background; the programs
            of one trajectory run in one job at a time, in order.
    """

    def __init__(self, task, make_executor, submit: Submit):
        self.task, self.make_executor, self.submit = task, make_executor, submit
        self._cond = threading.Condition()
        self._texts: list[str] = []  # the chosen replies seen so far
        self._entries: list[dict[str, Any]] = []  # the entries of the first len(_entries) steps
        self._runner: ReferenceRunner | None = None
        self._error: BaseException | None = None
        self._running = False  # a job drains the steps not run yet
        self._closed = False
        self.done: Callable[[StepwiseReference], None] | None = None  # called by close() (and so by finish())

    def add(self, traj) -> None:
        """Run the programs of the steps of ``traj`` (a trajectory in progress) not run yet, in
        the background; returns at once."""
        with self._cond:
            if self._closed or self._error is not None:
                return
            self._texts = chosen_texts(traj)
            start = not self._running and len(self._entries) < len(self._texts)
            self._running = self._running or start
        if start:
            self._start()

    def _start(self) -> None:
        try:
            self.submit(self._drain)
        except RuntimeError as exc:  # the pool was shut down: the job stops
            with self._cond:
                self._error, self._running = exc, False
                self._cond.notify_all()

    def _drain(self) -> None:
        while True:
            with self._cond:
                if self._closed or self._error is not None or len(self._entries) >= len(self._texts):
                    self._running = False
                    if self._closed:
                        self._close_runner()
                    self._cond.notify_all()
                    return
                step, program = len(self._entries), chosen_programs(self._texts)[len(self._entries)]
            try:
                if self._runner is None:
                    self._runner = ReferenceRunner.for_task(self.task, self.make_executor)
                entry = step_entry(self._runner, program)
            except Exception as exc:  # noqa: BLE001 - kept: the trajectory gets no reference steps
                with self._cond:
                    self._error = exc
                continue
            with self._cond:
                if len(self._entries) == step:
                    self._entries.append(entry)

    def finish(self, traj) -> bool:
        """Store the entries of every step of the finished ``traj`` in
        ``traj.extra["reference_steps"]`` (as ``record_reference_steps`` does), once the steps not
        run yet have run (in the background, as the others), then close the runner; returns
        whether it stored them. Call it once, from a thread that may wait."""
        try:
            if not traj.steps:
                return False
            texts = chosen_texts(traj)
            with self._cond:
                self._cond.wait_for(lambda: not self._running)
                if texts[:len(self._texts)] != self._texts:  # not the path seen: start again
                    self._close_runner()
                    self._entries, self._error = [], None
                self._texts = texts
                start = self._error is None and len(self._entries) < len(texts)
                self._running = start
            if start:
                self._start()
            with self._cond:
                self._cond.wait_for(lambda: not self._running)
                error, entries = self._error, list(self._entries)
            if error is None and len(entries) < len(texts):  # stopped before the end (the job stops)
                error = RuntimeError("the job stopped before the re-run ended")
            if error is not None:
                rerun_failed(traj, error)
                return False
            traj.extra["reference_steps"] = entries
            return True
        finally:
            self.close()

    def close(self, *, stopped: bool = False) -> None:
        """Run no more programs and close the runner, at once or when the job running a program
        ends; ``stopped``: no job will run (their pool was shut down), close it now."""
        with self._cond:
            self._closed = True
            if stopped:
                self._running = False
                self._cond.notify_all()
            if not self._running:
                self._close_runner()
        if self.done is not None:  # its slot is free (the runner closes at once or when its job ends)
            self.done(self)

    def _close_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()


class StepwiseReferences:
    """The :class:`StepwiseReference` of the episodes in flight of one job, at most ``workers`` at
    once (each holds a runner: a sandbox worker, as many as the re-runs at the end of their
    trajectories held at once before), their programs run by a pool of ``workers`` threads. An
    episode that finds every slot taken tries again at its next step (and then runs the programs
    of its earlier steps first); one that never gets a slot is re-run once it ends
    (:meth:`take` gives ``None``). As episodes end, their slots go to the ones still running, so
    the last episodes of a job, whose re-runs its end would wait for, hold them.

    Args:
        make_executor (`Callable[[SearchTask], StepExecutor]`): the executor factory.
        workers (`int`, *optional*, defaults to 16): trajectories re-run step by step, and
            programs run, at once.
        spare (`Callable[[], int]`, *optional*): how many runners may be open now besides
            ``workers`` (e.g. the episodes the job may keep in flight but no longer has: a long
            job's runners then take the place of episodes that ended, in its last wave, and its
            peak memory stays what its episodes take); ``None``: ``workers``.
    """

    def __init__(self, make_executor, workers: int = 16, spare: Callable[[], int] | None = None):
        self.make_executor, self.workers, self.spare = make_executor, max(1, int(workers)), spare
        self._pool: ThreadPoolExecutor | None = None  # started with the first step (again after close)
        self._lock = threading.Lock()
        self._open: dict[int, tuple[Any, StepwiseReference]] = {}  # id(trajectory) -> (it, its re-run)
        self._finishing: set[StepwiseReference] = set()  # taken, their finish() not returned: runners held

    def _submit(self, job: Callable[[], None]) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="codetool-reference")
            pool = self._pool
        return pool.submit(job)

    def on_step(self, task, traj) -> None:
        """``SearchParts.on_step``: start the programs of the steps ``traj`` chose so far."""
        with self._lock:
            _, ref = self._open.get(id(traj), (traj, None))
            if ref is None:
                slots = self.workers if self.spare is None else min(self.workers, self.spare())
                if len(self._open) + len(self._finishing) >= slots:  # every slot taken: again at the next step
                    return
                ref = StepwiseReference(task, self.make_executor, self._submit)
                self._open[id(traj)] = (traj, ref)
        ref.add(traj)

    def take(self, traj) -> StepwiseReference | None:
        """The stepwise re-run of the finished ``traj`` (its caller calls its ``finish``), or
        ``None`` when it had none (no step was chosen in an episode of this job's search)."""
        with self._lock:
            owner, ref = self._open.pop(id(traj), (None, None))
            if ref is None or owner is not traj:
                return None
            self._finishing.add(ref)  # its runner stays open until its finish() returns
        ref.done = self._finished
        return ref

    def _finished(self, ref: StepwiseReference) -> None:
        with self._lock:
            self._finishing.discard(ref)

    def close(self) -> None:
        """Stop every re-run (the job ends or stops) and close their runners; a later step starts
        a new pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            left = [ref for _, ref in self._open.values()] + list(self._finishing)
            self._open = {}
        for ref in left:  # also the ones taken whose last job the shutdown cancelled: their finish() returns
            ref.close(stopped=True)
