"""``codetool score INPUT --prm PRM``: add a ``score`` field to every row of a JSONL file.

The scorer is :func:`codetool.prm.scorer.load_scorer`'s (a checkpoint folder, a ``serve-prm``
URL or ``vllm:FOLDER``); rows are scored in batches of ``batch_size`` (siblings in one batch
share their prefix) and keep all their fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from codetool import CodetoolError
from codetool.config import option
from codetool.models.spec import ModelSpec

logger = logging.getLogger(__name__)


@dataclass
class ScoreConfig:
    """Settings of ``codetool score``: add a ``score`` field to every row of a JSONL file."""

    input: str = option("data/prm/prm_examples.jsonl", "JSONL file of PRM example rows", positional=True)
    prm: str = option("checkpoints/prm/quickstart", "PRM checkpoint folder, server URL, or vllm:FOLDER")
    output: str = option("", "output JSONL (default: <input stem>.scored.jsonl)")
    batch_size: int = option(64, "rows per scorer call (siblings in one call share their prefix)")
    device: str = option("auto", "auto, cpu or cuda")

    def __post_init__(self):
        if self.batch_size < 1:
            raise CodetoolError(f"batch_size must be >= 1, got {self.batch_size}.")
        self.prm_spec = ModelSpec.parse(self.prm, role="prm")  # parsed once (not a setting)


def score_command(cfg: ScoreConfig) -> int:
    """Score every row of ``cfg.input``; rows keep their fields and gain ``score``."""
    from codetool.commands import progress_bar
    from codetool.jsonl import read_jsonl, write_jsonl
    from codetool.prm.format import item_from_row
    from codetool.prm.scorer import load_scorer

    if not Path(cfg.input).is_file():
        raise CodetoolError(f"input file not found: {cfg.input}.")
    skipped: list[int] = []
    rows = list(read_jsonl(cfg.input, skipped))
    if skipped:  # never write a silently shortened output (issue 19)
        raise CodetoolError(f"{cfg.input}: {len(skipped)} lines are not JSON objects (lines "
                            f"{', '.join(map(str, skipped[:5]))}); fix or delete them, then rerun.")
    if not rows:
        raise CodetoolError(f"{cfg.input} holds no row to score; give PRM example rows (JSON lines with query, "
                            "history, candidate...).")
    items = []
    for number, row in enumerate(rows, 1):  # every row checked before the PRM is loaded
        try:
            items.append(item_from_row(row))
        except CodetoolError as e:
            raise CodetoolError(f"{cfg.input} line {number}: {e}") from None
    scorer = load_scorer(cfg.prm_spec, device=cfg.device)
    if scorer is None:
        raise CodetoolError("codetool score needs a PRM: pass --prm with a checkpoint folder or a server URL.")
    starts = range(0, len(rows), cfg.batch_size)
    with progress_bar("scoring (batches)") as progress:
        tick = progress(len(starts))
        for start in starts:
            chunk = rows[start:start + cfg.batch_size]
            for row, value in zip(chunk, scorer.score(items[start:start + cfg.batch_size])):
                row["score"] = value
            tick(chunk)
    output = cfg.output or str(Path(cfg.input).with_suffix("")) + ".scored.jsonl"
    write_jsonl(output, rows)
    logger.info("scored %d rows with %s; wrote %s", len(rows), cfg.prm, output)
    return 0
