"""Crash-safe JSON Lines files: append one record at a time, read back what survived.

Long jobs (runs, tree building, judging) write one line per finished unit and flush it to disk,
so ``kill -9`` loses at most the unit in progress. A partially written last line (the process
died mid-write) is skipped on read with a warning, and the next append starts on a new line; a job
that resumes calls :func:`repair_jsonl` first, which cuts such a torn tail back to the last whole
line (and logs what it cut), so the file holds whole records only.
Every record passes through ``codetool.secrets.redact_obj`` and ``codetool.text.clean_obj`` before it is
written: lone surrogates (``"\ud800"``, which models and tools can emit and which UTF-8 cannot
encode) become U+FFFD, so writing never raises ``UnicodeEncodeError``. A full disk or another OS
error is a one-line :class:`codetool.CodetoolError`; the partial line it may leave is terminated
by the next append and skipped (and counted) by readers.

Outputs are opened without following a symbolic link at their last component
(:func:`open_output`; ``O_NOFOLLOW``): a link planted where a job writes (``<output>``, its
``.tmp``, its ``.lock``) is refused with a one-line error instead of truncating or appending to the
file it points at. Links among the parent folders are followed (they are the user's own layout).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.secrets import redact_obj
from codetool.text import clean_obj, clean_text  # noqa: F401  (clean_text: still imported from here)

logger = logging.getLogger(__name__)


def _dumps(record) -> str:
    return json.dumps(clean_obj(redact_obj(record)), ensure_ascii=False, default=str)


def open_fd(path: str | os.PathLike, flags: int, what: str = "write") -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0o644)``, its parent folders created.

    Raises:
        CodetoolError: ``path`` is a symbolic link (refused: it could point at any file this user
            can write), or it cannot be opened (the OS's reason, and what to do).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise CodetoolError(f"{path} is a symbolic link (to {os.readlink(path)!r}); refusing to {what} through "
                                "it. Remove the link, or pass the real path.") from None
        raise CodetoolError(f"cannot {what} {path}: {e.strerror or e} (free space or fix permissions).") from None


def check_output(path: str | os.PathLike, **inputs: str | os.PathLike | None) -> None:
    """Refuse an output path before any work is done: a symbolic link there (dangling or not:
    :func:`open_fd` would refuse it only at the first write, after the work), or the same file as
    one of ``inputs`` (``--queries`` and ``--output`` naming one file: the job would append its
    records to the input and destroy it).

    Args:
        path: the output file.
        **inputs: the command's input files by option name (``queries="q.json"``); ``None`` skipped.

    Raises:
        CodetoolError: one line naming the option and what to pass instead.
    """
    path = Path(path)
    if path.is_symlink():
        raise CodetoolError(f"--output {path} is a symbolic link (to {os.readlink(path)!r}); refusing to write "
                            "through it. Remove the link, or pass the real path.")
    for name, given in inputs.items():
        if given is None:
            continue
        source = Path(given)
        same = (os.path.samefile(path, source) if path.exists() and source.exists()
                else os.path.realpath(path) == os.path.realpath(source))
        if same:
            raise CodetoolError(f"--output {path} is the --{name} file: the job appends its records to its output, "
                                f"which would destroy your {name}. Pass another --output.")


def open_output(path: str | os.PathLike, *, append: bool = False):
    """``path`` opened for binary writing (truncated, or appended to), refusing a symbolic link
    (:func:`open_fd`)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(open_fd(path, flags), "ab" if append else "wb")


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (created with its parent folders), flushed and
    fsynced so the line survives a crash of this process right after the call."""
    path = Path(path)
    data = (_dumps(record) + "\n").encode("utf-8")
    fd = open_fd(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        with os.fdopen(fd, "a+b") as f:
            # If a previous writer died mid-line, terminate that fragment so ours stays parseable.
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            # One write call: the line goes down whole or (full disk, crash) as one fragment.
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise CodetoolError(f"cannot write {path}: {e.strerror or e} (free space or fix permissions, then "
                            "rerun: finished records are kept and the run resumes).") from None


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of ``path``, an input file the user named.

    Raises:
        CodetoolError: ``path`` is missing or a folder, cannot be read, or is not UTF-8 (the byte
            offset is named, and what the file should be: ``what``).
    """
    path = Path(path)
    if path.is_dir():
        raise CodetoolError(f"{path} is a folder; expected {what}.")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CodetoolError(f"{path} not found; expected {what}.") from None
    except OSError as e:
        raise CodetoolError(f"cannot read {path}: {e.strerror or e}.") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CodetoolError(f"{path} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 4]!r}); expected "
                            f"{what}, saved as UTF-8.") from None


def read_json(path: str | os.PathLike, what: str = "a JSON file") -> Any:
    """The JSON document in ``path``, an input file the user named.

    Raises:
        CodetoolError: ``path`` is missing, a folder, not UTF-8, empty, not JSON (the parser's
            line and column), or nested too deeply for the parser.
    """
    text = read_text(path, what)
    if not text.strip():
        raise CodetoolError(f"{path} is empty; expected {what}.")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CodetoolError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); expected "
                            f"{what}.") from None
    except RecursionError:
        raise CodetoolError(f"{path} is JSON nested too deeply; expected {what}.") from None


def read_jsonl(path: str | os.PathLike, skipped: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records (JSON objects) of ``path``; lines that do not parse (a torn write) or
    are not objects are skipped with a warning, and their line numbers appended to ``skipped``
    when given (callers that must not drop rows silently count them). A missing file yields
    nothing.

    Raises:
        CodetoolError: ``path`` is a folder or cannot be read.
    """
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        raise CodetoolError(f"{path} is a folder; expected a JSONL file.")
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise CodetoolError(f"cannot read {path}: {e.strerror or e}.") from None
    with f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                record = None
            if isinstance(record, dict):
                yield record
                continue
            logger.warning("%s:%d: skipping a line that is not a JSON object (torn write?)", path, number)
            if skipped is not None:
                skipped.append(number)


def write_jsonl(path: str | os.PathLike, records) -> int:
    """Write ``records`` to ``path`` atomically (temporary file + rename); returns the count.

    Raises:
        CodetoolError: ``path`` or its temporary file is a symbolic link, or cannot be written.
    """
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    if path.is_symlink():
        raise CodetoolError(f"{path} is a symbolic link (to {os.readlink(path)!r}); refusing to replace it. Remove "
                            "the link, or pass the real path.")
    try:
        tmp.unlink(missing_ok=True)  # a crashed run's leftover, or a planted link (removing a link is safe)
    except OSError:
        pass
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(_dumps(record) + "\n")
                count += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CodetoolError(f"cannot write {path}: {e.strerror or e} (free space or fix permissions).") from None
    return count


def repair_jsonl(path: str | os.PathLike) -> int:
    """Cut a torn last line of ``path`` (bytes after the last newline that do not parse as a JSON
    object: a writer died mid-line) back to the last whole line, with a warning naming what was
    cut. A last line that is a whole object but lacks its newline gets the newline instead. A
    missing or empty file is left alone.

    Returns:
        The number of bytes removed (0 when the file ended on a whole line).
    Raises:
        CodetoolError: the file cannot be read or truncated.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    fd = open_fd(path, os.O_RDWR, "repair")
    try:
        with os.fdopen(fd, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            # Walk back in blocks to the last newline; a torn tail is at most one record long.
            end, block = size, 1 << 16
            while end > 0:
                start = max(0, end - block)
                f.seek(start)
                chunk = f.read(end - start)
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    keep = start + cut + 1
                    break
                end = start
            else:
                keep = 0
            if keep == size:
                return 0
            f.seek(keep)
            tail = f.read()
            try:
                whole = isinstance(json.loads(tail.decode("utf-8")), dict)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                whole = False
            if whole:
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
                return 0
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise CodetoolError(f"cannot repair {path}: {e.strerror or e} (check its permissions).") from None
    logger.warning("%s: cut a torn last line (%d bytes: %r) back to the last whole line; the unit it held "
                   "runs again", path, len(tail), tail[:80])
    return len(tail)
