"""One module per command (``codetool <command>``), each a config dataclass and a function listed
in ``codetool/cli.py``'s ``COMMANDS``. Commands sit above every other package; only they print
and draw progress (with ``rich`` on a terminal, plain log lines otherwise; the parts report
through :mod:`codetool.progress`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from codetool import progress as _progress
from codetool.progress import Heartbeat, JobProgress, ProgressFactory, listening


@contextlib.contextmanager
def job_progress(job: JobProgress, *, terminal: bool | None = None) -> Iterator[ProgressFactory]:
    """Show ``job`` for the ``with`` block; yields the :data:`~codetool.progress.ProgressFactory` to
    hand a part, and counts the work the sampler reports (:func:`codetool.progress.note_work`).

    On a terminal (``sys.stdout.isatty()``, or ``terminal=True``) a ``rich`` bar moves with the
    work, with the counts, elapsed time and an ETA; otherwise (nohup, Slurm, a pipe) the same counts
    are logged as one line every ``codetool.progress.LOG_INTERVAL_S`` seconds (30), and once at the
    end.
    """
    terminal = sys.stdout.isatty() if terminal is None else terminal
    if not terminal:
        with listening(job.add_work), Heartbeat(job.line, _progress.LOG_INTERVAL_S):
            yield job.factory()
        return
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns) as bar:
        task = bar.add_task(job.what, total=1.0, counts="")

        def refresh() -> None:
            bar.update(task, completed=job.fraction(), counts=job.counts())

        def on_work(n: int) -> None:
            job.add_work(n)
            refresh()

        with listening(on_work):
            yield job.factory(refresh)


@contextlib.contextmanager
def progress_bar(description: str, unit: str = "batches") -> Iterator[ProgressFactory]:
    """Progress counted in units only (scoring batches, judge batches): every call of the factory
    adds its units, each tick finishes one; drawn or logged as :func:`job_progress` does."""
    with job_progress(JobProgress(description, unit)) as factory:
        yield factory
