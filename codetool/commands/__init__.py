"""One module per command (``codetool <command>``), each a config dataclass and a function listed
in ``codetool/cli.py``'s ``COMMANDS``. Commands sit above every other package; only they print
and draw progress (with ``rich``; the parts report through :mod:`codetool.progress`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from codetool.progress import ProgressFactory


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[ProgressFactory]:
    """A ``rich`` bar for the ``with`` block; yields the :data:`~codetool.progress.ProgressFactory`
    to hand a part. Every call of the factory adds its units to the same bar (a judge asked once
    per round counts all its batches), and each tick advances it by one unit."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as bar:
        job = None

        def factory(total: int):
            nonlocal job
            if job is None:
                job = bar.add_task(description, total=total)
            else:
                bar.update(job, total=(bar.tasks[job].total or 0) + total)
            return lambda unit=None: bar.update(job, advance=1)

        yield factory
