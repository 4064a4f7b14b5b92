"""Crash-safe JSON Lines files: append one record at a time, read back what survived.

Long jobs (runs, tree building, judging) write one line per finished unit and flush it to disk,
so ``kill -9`` loses at most the unit in progress. A partially written last line (the process
died mid-write) is skipped on read with a warning, and the next append starts on a new line.
Every record passes through ``codetool.secrets.redact_obj`` before it is written.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from codetool.secrets import redact_obj

logger = logging.getLogger(__name__)


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (created with its parent folders), flushed and
    fsynced so the line survives a crash of this process right after the call."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(redact_obj(record), ensure_ascii=False, default=str)
    with open(path, "a+b") as f:
        # If a previous writer died mid-line, terminate that fragment so ours stays parseable.
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(line.encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield the records of ``path``; lines that do not parse (a torn write) are skipped with a
    warning. A missing file yields nothing."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: skipping a line that is not valid JSON (torn write?)", path, number)


def write_jsonl(path: str | os.PathLike, records) -> int:
    """Write ``records`` to ``path`` atomically (temporary file + rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(redact_obj(record), ensure_ascii=False, default=str) + "\n")
            count += 1
    os.replace(tmp, path)
    return count


def done_ids(path: str | os.PathLike, key: str = "query_id") -> set[str]:
    """The ``key`` values already present in ``path``, as strings (for resume)."""
    return {str(r[key]) for r in read_jsonl(path) if key in r}
