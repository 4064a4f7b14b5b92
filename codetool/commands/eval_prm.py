"""``codetool eval-prm``: pairwise accuracy, AUC and calibration of a PRM on held-out pairs.

The held-out split is rebuilt from the checkpoint's ``prm_config.json`` (``split``): the same
query ids that ``codetool train-prm`` kept out of training (``--split all`` scores every row).
The metrics are :mod:`codetool.prm.evaluate`'s; this command writes ``metrics.json``,
``scores.jsonl`` and ``calibration.png`` into ``--output_dir`` and prints the table.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.config import option
from codetool.models.spec import ModelSpec
from codetool.prm.evaluate import bootstrap_pairwise, plot_calibration, prm_metrics

logger = logging.getLogger(__name__)


@dataclass
class EvalPRMConfig:
    """Settings of ``codetool eval-prm``."""

    prm: str = option("checkpoints/prm/quickstart", "PRM checkpoint folder or http(s) URL of a PRM server")
    dataset: list[str] = option(default_factory=lambda: ["data/prm/prm_examples.jsonl"],
                                help="PRM example JSONL file(s)")
    split: str = option("heldout", "rows to score: the checkpoint's held-out queries, or all rows",
                        choices=("heldout", "all"))
    eval_fraction: float = option(-1.0, "held-out share of queries; -1 reads it from the checkpoint")
    split_seed: int = option(-1, "split seed; -1 reads it from the checkpoint")
    output_dir: str = option("reports/prm", "where metrics.json, scores.jsonl and calibration.png go")
    batch_size: int = option(64, "rows sent to the scorer at a time")
    bootstrap_samples: int = option(1000, "resamples of sibling groups for the pairwise accuracy's 95% interval")
    bootstrap_seed: int = option(0, "seed of the bootstrap resampling")
    device: str = option("auto", "auto, cpu or cuda")

    def __post_init__(self):
        if self.batch_size < 1:
            raise CodetoolError(f"batch_size must be >= 1, got {self.batch_size}.")
        self.prm_spec = ModelSpec.parse(self.prm, role="prm")  # parsed once (not a setting)


def _split_settings(cfg: EvalPRMConfig) -> tuple[float, int]:
    fraction, seed = cfg.eval_fraction, cfg.split_seed
    if fraction < 0 or seed < 0:
        if cfg.prm_spec.remote:
            raise CodetoolError("with a PRM server, pass --eval_fraction and --split_seed (or --split all).")
        from codetool.prm.folder import read_prm_config

        split = read_prm_config(cfg.prm).get("split", {})
        if split.get("eval_dataset"):
            raise CodetoolError(f"{cfg.prm} was trained with a separate eval set {split['eval_dataset']}; "
                                "pass those files with --dataset and --split all.")
        fraction = split.get("eval_fraction", 0.1) if fraction < 0 else fraction
        seed = split.get("seed", 0) if seed < 0 else seed
    return float(fraction), int(seed)


def eval_prm_command(cfg: EvalPRMConfig) -> int:
    """Score the held-out rows with the PRM and write metrics, scores and a calibration plot."""
    from codetool.jsonl import write_jsonl
    from codetool.prm.data import sibling_key, split_rows
    from codetool.prm.format import item_from_row
    from codetool.prm.rows import read_rows
    from codetool.prm.scorer import load_scorer

    rows = read_rows(cfg.dataset)
    if cfg.split == "heldout":
        fraction, seed = _split_settings(cfg)
        rows = split_rows(rows, fraction, seed)[1]
        if not rows:
            raise CodetoolError(f"no held-out rows in {cfg.dataset} (eval_fraction {fraction}, seed {seed}); "
                                "pass --split all to score every row.")
    scorer = load_scorer(cfg.prm_spec, device=cfg.device)
    if scorer is None:
        raise CodetoolError("eval-prm needs a PRM: pass --prm with a checkpoint folder or a server URL.")
    from codetool.commands import progress_bar

    scores: list[float] = []
    starts = range(0, len(rows), cfg.batch_size)
    with progress_bar("scoring (batches)") as progress:
        tick = progress(len(starts))
        for start in starts:
            scores += scorer.score([item_from_row(r) for r in rows[start:start + cfg.batch_size]])
            tick(start)
    labels = [r["label"] for r in rows]
    groups = [sibling_key(r) for r in rows]
    metrics: dict[str, Any] = prm_metrics(scores, labels, groups)
    ci = bootstrap_pairwise(scores, labels, groups, cfg.bootstrap_samples, cfg.bootstrap_seed)
    metrics.update(pairwise_accuracy_ci95=list(ci) if ci else None, bootstrap_samples=cfg.bootstrap_samples,
                   bootstrap_seed=cfg.bootstrap_seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"prm": cfg.prm, "split": cfg.split,  # NaN (no held-out pairs) -> null: strict JSON
                                                   **{k: None if isinstance(v, float) and v != v else v
                                                      for k, v in metrics.items()}}, indent=2))
    write_jsonl(out / "scores.jsonl", ({"source": r.get("source"), "query_id": r.get("query_id"),
                                        "label": r["label"], "score": s} for r, s in zip(rows, scores)))
    plot_calibration(scores, labels, out / "calibration.png")
    logger.info("eval-prm on %d rows (%d pairs): pairwise accuracy %.3f, AUC %.3f, ECE %.3f; wrote %s",
                metrics["rows"], metrics["pairs"], metrics["pairwise_accuracy"], metrics["auc"],
                metrics["ece"], out)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"PRM on {cfg.split} rows")
    for key in ("rows", "pairs", "pairwise_accuracy", "auc", "accuracy", "brier", "ece"):
        table.add_column(key)
    table.add_row(*[f"{metrics[k]:.4f}" if isinstance(metrics[k], float) else str(metrics[k])
                    for k in ("rows", "pairs", "pairwise_accuracy", "auc", "accuracy", "brier", "ece")])
    Console().print(table)
    return 0
