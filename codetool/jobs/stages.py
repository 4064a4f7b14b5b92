"""The record of one stage of ``codetool pipeline`` (``<stage>/stage.json``): the hash of what
determines the stage's output, and whether it is running, done or failed. A stage whose record
matches is skipped; one whose settings changed starts afresh; one that crashed resumes in place.

The hash is taken over a canonical text of the settings the stage reads (:func:`settings_text`):
a version line, then one ``key=value`` line per setting, sorted, each value as JSON, then the
hashes of the stages it reads. Field order, and settings left out of the text, change nothing;
a change of this format changes the version line, so every stage runs once again (0.1 -> 0.2.0:
docs/MIGRATING.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STAGE_TEXT_VERSION = "codetool-stage-v2"  # the first line of every stage text (v1: 0.1's hashed mappings)


def settings_text(settings: Mapping[str, Any], upstream: Mapping[str, str] | None = None) -> str:
    """The canonical text of a stage's settings: :data:`STAGE_TEXT_VERSION`, then ``key=value``
    lines sorted by key (values as JSON with sorted keys; :func:`codetool.config_groups.flat_settings`), then ``upstream.<stage>=<hash>`` for
    each stage it reads.

    Args:
        settings (`Mapping[str, Any]`): dotted key -> a JSON-able value.
        upstream (`Mapping[str, str]`, *optional*): stage name -> the hash of that stage's text.
    """
    lines = [f"{key}={json.dumps(value, sort_keys=True, default=str)}" for key, value in settings.items()]
    lines += [f"upstream.{name}={digest}" for name, digest in (upstream or {}).items()]
    return "\n".join([STAGE_TEXT_VERSION, *sorted(lines)]) + "\n"


def text_hash(text: str) -> str:
    """12 hex characters of the SHA-256 of ``text`` (a stage's record holds them)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Stage:
    """Bookkeeping of one stage folder: its record, whether it is current, and resets."""

    def __init__(self, root: Path, name: str, digest: str):
        self.dir, self.name, self.digest = root / name, name, digest
        self.record_path = self.dir / "stage.json"

    def record(self) -> dict[str, Any]:
        try:
            return json.loads(self.record_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def prepare(self, force: bool) -> bool:
        """True when the stage must run. Clears the folder when its settings changed or ``force``."""
        rec = self.record()
        if rec.get("hash") == self.digest and rec.get("status") == "done" and not force:
            logger.info("stage %s: up to date (hash %s), skipped", self.name, self.digest)
            return False
        if self.dir.exists() and (force or rec.get("hash") != self.digest):
            logger.info("stage %s: %s, starting afresh", self.name, "forced" if force else "settings changed")
            shutil.rmtree(self.dir)
        elif rec.get("status") == "running":
            logger.info("stage %s: resuming an interrupted run", self.name)
        elif rec.get("status") == "failed":
            logger.info("stage %s: running again after it failed (%s)", self.name, rec.get("error", "?"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write({"hash": self.digest, "status": "running", "started": time.time()})
        return True

    def run(self, work: Callable[[], dict | None], *, force: bool) -> bool:
        """Run ``work`` unless the stage is current (:meth:`prepare`) and record how it ended, with
        what ``work`` returns (``{"report": ...}``) and the seconds it took. Returns whether it ran.

        Raises:
            BaseException: what ``work`` raises, once recorded, so the next run says why it starts
                this stage again.
        """
        if not self.prepare(force=force):
            return False
        start = time.perf_counter()
        try:
            info = work()
        except BaseException as e:
            self.failed(e)
            raise
        self.done(time.perf_counter() - start, **(info or {}))
        logger.info("stage %s finished in %.1f s", self.name, time.perf_counter() - start)
        return True

    def failed(self, error: BaseException) -> None:
        from codetool.secrets import redact

        self._write({"hash": self.digest, "status": "failed", "error": redact(f"{type(error).__name__}: {error}")[:500]})

    def done(self, seconds: float, **info) -> None:
        self._write({"hash": self.digest, "status": "done", "seconds": round(seconds, 1), **info})

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        tmp.replace(self.record_path)
