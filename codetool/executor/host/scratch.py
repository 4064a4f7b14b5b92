"""Scratch directories of the fallback sandbox (one per executor family, its workers' cwd, HOME and
TMPDIR).

Every way a family ends removes its directory:

- ``Sandbox.close`` (explicit, on garbage collection of its last executor, or at interpreter
  exit) and every restart or failed start of the family (the host, through :func:`remove`);
- the host dying first (SIGKILL, crash): its root sees the control channel close, or fail while it
  is still starting, kills the family and removes the directory (``inside.root.main``).

Only when both are gone before either cleans (the host killed between creating the directory and
starting the root, the root killed together with the host, or the root's bootstrap cut short) does a
directory stay behind. Its name holds the host's pid and that process's start time
(``codetool-sandbox-<pid>-<start>-<random>``), so the next sandbox started in the same parent
directory (:func:`make`) removes every such directory whose owner is no longer running. This
assumes the parent (``executor.scratch_dir`` or the temp dir) is not shared with hosts in another
pid namespace; give each container its own ``scratch_dir`` otherwise.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from codetool.executor.kernel.procs import owner_alive, start_time

logger = logging.getLogger(__name__)

PREFIX = "codetool-sandbox-"  # inside.root only removes directories named so


def reclaim(parent: str | None) -> list[str]:
    """Remove the scratch directories under ``parent`` (default: the temp dir) whose owner process
    is gone; returns their paths. Directories without an owner in their name are left alone."""
    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        pid, _, rest = name[len(PREFIX):].partition("-")
        start = rest.partition("-")[0]
        if not (pid.isdigit() and start.isdigit()) or owner_alive(int(pid), start):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    if removed:
        logger.info("removed %d scratch directories left by sandbox hosts that died: %s", len(removed), removed)
    return removed


def make(parent: str | None, uid: int | None) -> str:
    """A fresh scratch directory under ``parent`` (default: the temp dir), owned by ``uid`` when
    given (mode 0700), named after this process; stale ones of dead hosts are reclaimed first."""
    reclaim(parent)
    pid = os.getpid()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{start_time(pid) or 0}-", dir=parent)
    if uid is not None:
        try:
            os.chown(path, uid, uid)
        except OSError:
            remove(path)
            raise
    return path


def remove(path: str | None) -> None:
    """Remove a scratch directory and everything in it (nothing happens when it is gone already)."""
    if path:
        shutil.rmtree(path, ignore_errors=True)
