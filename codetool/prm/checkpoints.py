"""Whole checkpoints only: which ``checkpoint-N`` folders of a training run may be resumed from.

The Trainer writes a checkpoint file by file (weights, optimizer, scheduler, RNG states, trainer
state), so a kill or a full disk during a save leaves a folder that looks like the newest
checkpoint and cannot be loaded; ``--resume auto`` used to pick it and stop. ``PRMTrainer`` now
writes :data:`COMPLETE` into a checkpoint folder after every process has finished saving it
(:func:`mark_complete`: a small file written to a temporary name and renamed, so it is there whole
or not at all). :func:`last_complete_checkpoint` resumes from the newest marked folder and
removes the unmarked ones (their save was interrupted), with a warning.

Folders written before the marker existed (no folder of the run has one) count as whole when their
``trainer_state.json``, the Trainer's last file, parses. Not guaranteed: that a marked folder
survives a later disk fault (nothing is re-read or checksummed).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from codetool import CodetoolError

logger = logging.getLogger(__name__)

COMPLETE = "checkpoint_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def mark_complete(folder: str | os.PathLike, step: int) -> None:
    """Write :data:`COMPLETE` into ``folder`` (temporary name, fsync, rename).

    Raises:
        CodetoolError: the marker cannot be written (the folder then stays unmarked: not resumed).
    """
    folder = Path(folder)
    tmp = folder / f".{COMPLETE}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"step": step, "files": sorted(p.name for p in folder.iterdir() if p != tmp)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / COMPLETE)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CodetoolError(f"cannot finish checkpoint {folder}: {e.strerror or e} (free space; the run resumes from "
                            "the checkpoint before it).") from None


def is_complete(folder: str | os.PathLike, *, marked: bool = True) -> bool:
    """Whether ``folder`` is a whole checkpoint: it holds :data:`COMPLETE`, or, with ``marked``
    False (a run from before the marker), a ``trainer_state.json`` that parses."""
    folder = Path(folder)
    if (folder / COMPLETE).is_file():
        return True
    if marked:
        return False
    try:
        json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
        return True
    except (OSError, ValueError):
        return False


def _step_of(folder: Path) -> int:
    m = _CHECKPOINT.match(folder.name)
    return int(m.group(1)) if m else -1


def _marked_since(folder: Path, folders: list[Path]) -> bool:
    """Whether ``folder`` was written after the run began to mark its checkpoints: some folder at
    or before its step has the marker. A run begun before the marker existed and resumed since has
    unmarked folders before its first marked one: those count as whole when their trainer state
    parses (they are not removed as saves cut short)."""
    step = _step_of(folder)
    return any((p / COMPLETE).is_file() and _step_of(p) <= step for p in folders)


def checkpoint_folders(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-N`` folders of ``output_dir``, newest (highest N) first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def last_complete_checkpoint(output_dir: str | os.PathLike, *, remove_incomplete: bool = True) -> str | None:
    """The newest whole checkpoint of ``output_dir`` (``None`` when there is none).

    Args:
        remove_incomplete (`bool`, *optional*, defaults to `True`): delete the folders whose save
            was interrupted (each with a warning), so neither resume nor the Trainer's rotation of
            old checkpoints counts them; pass False on every process but the first.
    """
    folders = checkpoint_folders(output_dir)
    chosen = None
    for folder in folders:
        if is_complete(folder, marked=_marked_since(folder, folders)):
            chosen = chosen or folder
            continue
        if remove_incomplete:
            logger.warning("removing %s: its save did not finish (killed or out of space), so it cannot be resumed",
                           folder)
            shutil.rmtree(folder, ignore_errors=True)
        else:
            logger.info("skipping %s: its save did not finish", folder)
    return str(chosen) if chosen else None


def check_resumable(folder: str | os.PathLike) -> None:
    """Refuse an explicit ``--resume FOLDER`` that is not a whole checkpoint (a folder not named
    ``checkpoint-N``, e.g. a finished PRM, is taken as it is).

    Raises:
        CodetoolError: ``folder`` is missing, or its save did not finish.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CodetoolError(f"resume: checkpoint folder {folder} not found; pass auto, none or a checkpoint-N folder.")
    if not _CHECKPOINT.match(folder.name):
        return
    if not is_complete(folder, marked=_marked_since(folder, checkpoint_folders(folder.parent))):
        raise CodetoolError(f"resume: {folder} is not a whole checkpoint (its save did not finish: no {COMPLETE}); "
                            "pass an earlier checkpoint-N folder, or --resume auto to take the newest whole one.")


def resume_checkpoint(resume: str, output_dir: str | os.PathLike) -> str | None:
    """The checkpoint a ``--resume`` value names: ``auto`` takes the newest *whole* one of
    ``output_dir`` (folders whose save was cut short are removed by the first process, rank 0),
    ``none`` (or empty) none, and a folder must be whole.

    Raises:
        CodetoolError: the folder given is not a whole checkpoint (:func:`check_resumable`).
    """
    if resume in ("", "none", "None"):
        return None
    if resume == "auto":
        first = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0
        last = last_complete_checkpoint(output_dir, remove_incomplete=first)
        if last:
            logger.info("resuming from %s (pass --resume none to start over)", last)
        return last
    check_resumable(resume)
    return resume
