"""The judge's verdict cache: one JSONL line per verdict, keyed by a hash of what was asked.

A rerun reads its verdicts back and asks nothing; a run killed mid-line loses only the torn
line (cut off on open, then appended to).
"""

from __future__ import annotations

import logging

from codetool.jsonl import append_jsonl, read_jsonl, repair_jsonl

logger = logging.getLogger(__name__)


class JudgeCache:
    """Verdicts on disk by key: a JSONL file read once, appended to after every batch.

    Args:
        path (`str` or `None`): the JSONL file; ``None`` keeps verdicts in memory only.
    """

    def __init__(self, path: str | None):
        self.path = path
        self.records: dict[str, dict] = {}
        if path:
            repair_jsonl(path)  # a run killed mid-line: cut the torn tail off (logged) before appending
            for record in read_jsonl(path):
                if "key" in record:
                    self.records[record["key"]] = record
            logger.debug("judge cache %s: %d verdicts", path, len(self.records))

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def put(self, record: dict) -> None:
        self.records[record["key"]] = record
        if self.path:
            append_jsonl(self.path, record)
