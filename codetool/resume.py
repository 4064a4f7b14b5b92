"""Resumable, isolated long jobs: which units are done, one writer per output, one unit per error.

``run`` and ``build-trees`` write one JSONL record per finished unit (a query's trajectory, a
tree). This module holds what both need to make that safe (issue 19):

- **identity**: a unit is known by ``unit_key(benchmark, group, query_id)``, not by its query id
  alone (ToolBench reuses ids across G1/G2/G3 files);
- **settings guard**: a record written with another config hash is never mixed with new ones:
  ``plan_resume`` refuses and says how to start a new output or force;
- **one writer**: ``OutputLock`` holds an exclusive ``fcntl.flock`` on ``<output>.lock`` while a
  run writes, so a second run on the same ``--output`` stops at once instead of duplicating work;
- **seeds**: ``unit_seed`` derives a sampling seed from (seed, unit identity, step), so a resumed
  run samples what an uninterrupted one did (exactly so when units are not batched together:
  ``search.concurrency 1``; batched units share one seed per generate call);
- **repair**: ``plan_resume`` first cuts a torn last line (a writer killed mid-line) back to the
  last whole line (``codetool.jsonl.repair_jsonl``), logged; the unit it held runs again;
- **unique ids**: ``refuse_duplicates`` stops a job whose input file repeats a query id (two units
  with one identity would overwrite each other's record on resume), naming the ids;
- **isolation**: ``run_isolated`` runs units in batches and, when a batch raises, reruns its
  unfinished units one at a time; a unit that still raises is handed to ``on_error`` (which
  records ``finish_type: error`` with a one-line message) and the job goes on.
  ``--retry_failed`` drops the error records and reruns only those units.

Limits: the lock is advisory and local (``flock`` on NFS may not be shared across machines; use
``--shard`` there). A unit that crashes the interpreter (not an exception) is not isolated.

:class:`OutputGroup` is the output settings both jobs compose (each with its own default path).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.config import option
from codetool.config_groups import Group
from codetool.jsonl import open_fd, read_jsonl, repair_jsonl, write_jsonl
from codetool.text import clean_text

logger = logging.getLogger(__name__)


@dataclass
class OutputGroup(Group):
    """Where a resumable job writes its records, and how a rerun treats what is there
    (:func:`plan_resume`). Each job gives ``output`` its own default (``config_groups.with_defaults``)."""

    output: str = option("runs/output.jsonl", "output file: one JSON line per unit (a query's trajectory for run, "
                         "a query's tree for build-trees), appended and resumable")
    retry_failed: bool = option(False, "rerun the units (queries, trees) recorded as finish_type error (and only those)")
    force_resume: bool = option(False, "resume even though the output was written with other settings")


class FatalError(CodetoolError):
    """An error that must stop the whole job, not one unit (e.g. the output disk is full)."""


def unit_seed(seed: int, units: list) -> int:
    """A sampling seed from the base ``seed`` and the identities and step numbers of the units
    sampled together (e.g. ``[(benchmark, group, query_id, step)]``), so a resumed run draws what
    an uninterrupted one drew for the same units; 31 bits."""
    blob = json.dumps([seed, [list(map(str, u)) for u in units]]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFFFFFF


def unit_key(benchmark: str | None, group: str | None, query_id: Any) -> str:
    """The identity of one unit of a long job: ``benchmark/group/query_id`` (empty parts kept)."""
    return f"{benchmark or ''}/{group or ''}/{query_id}"


def error_message(error: BaseException) -> str:
    """One line for a record: the exception type and its message, no traceback, text cleaned."""
    text = " ".join(str(error).split())[:500]
    return clean_text(f"{type(error).__name__}: {text}" if text else type(error).__name__)


def refuse_duplicates(keys: Iterable[str], source: str) -> None:
    """Raise when a unit identity occurs twice among ``keys`` (the units of one job, e.g. a query
    file's ``benchmark/group/query_id`` keys).

    Raises:
        CodetoolError: naming up to 10 repeated ids and how often each occurs.
    """
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    repeated = [(k, n) for k, n in counts.items() if n > 1]
    if repeated:
        shown = ", ".join(f"{k} ({n}x)" for k, n in repeated[:10]) + (", ..." if len(repeated) > 10 else "")
        raise CodetoolError(f"{source}: {len(repeated)} query ids occur more than once: {shown}. Each query needs "
                            "its own id within a file (records are resumed and merged by id); give the repeats "
                            "new ids or remove them.")


class OutputBusy(CodetoolError):
    """Another process holds the lock of ``output``: its message says to pass a different ``--output``
    (``run``, ``build-trees``); a command that names its outputs otherwise (``pipeline``: ``--name``,
    ``--runs_dir``) catches it and says so."""

    def __init__(self, output: Path, lock: Path):
        super().__init__(f"another run is writing {output} (it holds {lock}); wait for it to finish, or pass a "
                         "different --output.")
        self.output, self.lock = output, lock


class OutputLock:
    """Exclusive lock on ``<path>.lock`` for the duration of a ``with`` block; the lock file is
    removed when the block ends, a SIGTERM included (the CLI turns it into an interrupt); a run
    killed with SIGKILL leaves it behind, harmless: the lock is the ``flock``, not the file, and
    the next run takes it over. The file is opened without following a symbolic link (a link
    planted there is refused: opening it would truncate the file it points at).

    Removing a lock file races with a run that opened it just before: that run may then lock the
    removed file while a third run locks a new one. So a lock counts only when the file it holds
    is still the one at ``<path>.lock``; otherwise it is taken again on the file that is there.

    Raises:
        OutputBusy: another process holds the lock (a second run on the same output).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(str(path) + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        while True:
            fd = open_fd(self.path, os.O_RDWR | os.O_CREAT, "lock")  # a planted link is refused
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputBusy(Path(str(self.path)[:-5]), self.path) from None
            if self._current(fd):
                break
            os.close(fd)  # the run that held it removed it as we opened it: lock the file there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def _current(self, fd: int) -> bool:
        """Whether ``fd`` is the file at ``self.path`` now (not one a finished run removed)."""
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # removed while still locked: see the class docstring
                self.path.unlink()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class UnitRunner:
    """What runs a job's units on one machine, or in one Ray worker (``codetool.distributed``):
    ``run(units, on_record)`` hands one record per unit to ``on_record`` and returns the number of
    error records; the context it opened (a tool backend) stays open until ``close`` (or the end
    of a ``with`` block)."""

    _context: Any = None

    def open(self, context):
        """Enter ``context`` (closed by :meth:`close`) and return what it gives."""
        self._context = context
        return context.__enter__()

    def run(self, units: list, on_record: Callable[[dict], None]) -> int:
        raise NotImplementedError

    def close(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class ResumePlan:
    """What a rerun must do: ``done`` keys are kept; everything else in the job is to run."""

    done: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    dropped: int = 0


def plan_resume(path: str | os.PathLike, keys: Iterable[str], key_of: Callable[[dict], str], config_hash: str, *,
                retry_failed: bool = False, force: bool = False) -> ResumePlan:
    """Read ``path`` and decide which of ``keys`` are finished.

    Args:
        key_of (`Callable`): a record's unit key (see ``unit_key``).
        config_hash (`str`): the hash of the current settings; records of the job's units written
            with another hash make this raise unless ``force``.
        retry_failed (`bool`): rewrite ``path`` without the job's ``finish_type: error`` records, so
            those units run again (and the file holds one record per unit).
        force (`bool`): resume even across changed settings (the file then mixes hashes).

    Raises:
        CodetoolError: the file was written with other settings (and not ``force``).

    A torn last line of ``path`` is cut back to the last whole line first (logged).
    """
    wanted = set(keys)
    repair_jsonl(path)
    records = list(read_jsonl(path))
    mine = [r for r in records if key_of(r) in wanted]
    other = sorted({str(r.get("config_hash")) for r in mine if r.get("config_hash") != config_hash})
    if other and not force:
        raise CodetoolError(
            f"{path} holds records of these units written with other settings (config hash {', '.join(other)}; "
            f"now {config_hash}); resuming would mix them. Pass a new --output to start afresh (Python: "
            "search(output=...)), or --force_resume to keep the old records and run only the missing units "
            "(Python: settings={'force_resume': True}).")
    plan = ResumePlan()
    for r in mine:
        (plan.failed if r.get("finish_type") == "error" else plan.done).add(key_of(r))
    plan.failed -= plan.done
    if retry_failed and plan.failed:
        kept = [r for r in records if not (key_of(r) in plan.failed and r.get("finish_type") == "error")]
        plan.dropped = len(records) - len(kept)
        write_jsonl(path, kept)
        logger.info("retrying %d failed units (their error records were removed from %s)", len(plan.failed), path)
    else:
        plan.done |= plan.failed
    return plan


def run_isolated(units: list, run_batch: Callable[[list, Callable[[Any], None]], None], key: Callable[[Any], str],
                 on_done: Callable[[Any], None], on_error: Callable[[Any, BaseException], None]) -> int:
    """Run ``units`` with ``run_batch(units, on_done)``; isolate a unit whose error stops its batch.

    ``run_batch`` calls its callback with each finished result; ``key`` maps a unit *and* a result to
    the same identity. When a batch raises, its units without a result run again one by one; a unit
    that raises alone goes to ``on_error`` (KeyboardInterrupt and SystemExit are not caught).

    Returns:
        The number of units that failed.
    """
    seen: set[str] = set()

    def done(result) -> None:
        seen.add(key(result))
        on_done(result)

    try:
        run_batch(units, done)
        return 0
    except FatalError:
        raise
    except Exception as e:  # isolated below
        left = [u for u in units if key(u) not in seen]
        if len(units) == 1 or len(left) == 1:
            logger.warning("unit %s failed: %s", key(left[0]) if left else "?", error_message(e))
            logger.debug("traceback", exc_info=True)
            for u in left:
                on_error(u, e)
            return len(left)
        logger.warning("a batch of %d units failed (%s); running its %d unfinished units one by one",
                       len(units), error_message(e), len(left))
    return sum(run_isolated([u], run_batch, key, on_done, on_error) for u in left)
