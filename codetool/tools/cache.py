""":class:`CacheBackend`: StableToolBench's response cache, replayed and written through.

The layout is StableToolBench's own (``<root>/<Category>/<tool>_for_<Category>/<api>.json``, a
map from ``str(tool_input)`` to ``{"error", "response"}``), so its server can read what we record;
lookups use canonical keys (argument order and scalar spelling do not matter). New answers go to
a journal next to the API's file and are folded in geometrically (see the class docstring).
"""

from __future__ import annotations

import ast
import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from codetool.secrets import redact, redact_obj
from codetool.tools.names import (
    api_key_name,
    canonical_arguments,
    standardize,
    standardize_category,
)
from codetool.tools.spec import APISpec, ToolResponse

logger = logging.getLogger(__name__)


def _parse_cache_key(key: str) -> Any:
    """StableToolBench keys are ``str(dict)`` (Python repr); some writers used JSON."""
    for parse in (ast.literal_eval, json.loads):
        try:
            value = parse(key)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return key


class CacheBackend:
    """Replay (and record) responses in StableToolBench's cache layout.

    Args:
        root (`str` or `Path`): the cache folder (StableToolBench's ``tool_response_cache``).
        write (`bool`, *optional*, defaults to `True`): allow :meth:`record` to add responses.

    A lookup ignores argument order and compares scalars as text (``1`` == ``"1"``).

    Writing through appends: a recorded answer is one line of ``<api>.json.journal`` next to the
    API's JSON file (under an exclusive ``flock``, so processes sharing the cache do not mix
    lines); the journal is folded into the JSON file once it is larger than that file (and at
    least ``COMPACT_BYTES``; the first answer makes the file), so each answer costs its own size, amortised, instead of a rewrite
    of everything cached for the API. Reading takes the JSON file, then the journal (a torn last
    line, from a writer that died mid-line, is skipped). :meth:`compact` folds every journal now
    (StableToolBench's own scripts read the JSON files only).
    """

    COMPACT_BYTES = 1 << 20

    name = "cache"
    real = False

    def __init__(self, root: str | Path, *, write: bool = True):
        self.root = Path(root)
        self.write = write
        self._index: dict[Path, dict[str, dict]] = {}
        self._lock = threading.Lock()

    def path_for(self, api: APISpec) -> Path:
        category = standardize_category(api.category)
        return self.root / category / f"{standardize(api.tool)}_for_{category}" / f"{api_key_name(api)}.json"

    @staticmethod
    def _key(arguments: Any) -> str:
        return canonical_arguments(arguments) if isinstance(arguments, dict) else str(arguments)

    def _entries(self, path: Path) -> dict[str, dict]:
        if path not in self._index:
            index: dict[str, dict] = {}
            for key, entry in _read_cache_file(path).items():
                index[self._key(_parse_cache_key(key))] = entry
            self._index[path] = index
        return self._index[path]

    def lookup(self, api: APISpec, arguments: dict) -> dict | None:
        """The cached ``{"error", "response"}`` entry for this call, or ``None``."""
        with self._lock:
            return self._entries(self.path_for(api)).get(self._key(arguments))

    def record(self, api: APISpec, arguments: dict, content: str, error: str = "") -> None:
        """Add one response (keyed like StableToolBench: ``str(arguments)``), appended to the
        API's journal (see the class docstring)."""
        if not self.write:
            return
        path = self.path_for(api)
        entry = redact_obj({"error": error, "response": content})
        line = json.dumps({"key": redact(str(dict(arguments))), "entry": entry}, ensure_ascii=False) + "\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            journal = _journal(path)
            with open(journal, "a", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    f.write(line)
                    f.flush()
                    size = os.fstat(f.fileno()).st_size
                    main = path.stat().st_size if path.is_file() else 0
                    if main == 0 or size >= max(self.COMPACT_BYTES, main):  # (the first answer makes the file)
                        _fold(path, f)
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
            self._entries(path)[self._key(arguments)] = entry

    def compact(self) -> None:
        """Fold every journal under ``root`` into its JSON file."""
        with self._lock:
            for journal in self.root.rglob("*.json.journal"):
                with open(journal, "a", encoding="utf-8") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    try:
                        _fold(journal.with_name(journal.name[:-len(".journal")]), f)
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        start = time.perf_counter()
        entry = self.lookup(api, arguments)
        if entry is None:
            return ToolResponse("not_found", error=f"no cached response for {api.tool}/{api.api} with these arguments",
                                latency_s=time.perf_counter() - start, source=self.name)
        entry = entry if isinstance(entry, dict) else {"error": "", "response": entry}
        content = entry.get("response", "")
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        error = str(entry.get("error") or "").strip()
        return ToolResponse("api_error" if error else "ok", content=content, error=error[:300] or None,
                            latency_s=time.perf_counter() - start, source=self.name)


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def _read_cache_file(path: Path) -> dict:
    """An API's cache: its JSON file, then the lines of its journal (a torn line is skipped)."""
    raw: dict = {}
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            raw = loaded if isinstance(loaded, dict) else {}
        except (ValueError, OSError) as e:
            logger.warning("unreadable cache file %s (%s); treating it as empty", path, type(e).__name__)
    journal = _journal(path)
    if journal.is_file():
        try:
            lines = journal.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                raw[record["key"]] = record.get("entry")
    return raw


def _fold(path: Path, journal_file) -> None:
    """Rewrite ``path`` with its journal folded in, then empty the journal (whose ``flock`` the
    caller holds)."""
    merged = _read_cache_file(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(merged, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    journal_file.truncate(0)
