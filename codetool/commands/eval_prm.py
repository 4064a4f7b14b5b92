"""``codetool eval-prm``: a PRM's accuracy on what it decides, AUC and calibration, on held-out trees.

Pairwise accuracy is over the labelled sibling pairs, split into pairs decided by executability
and pairs whose steps both ran (the only ones the search asks the PRM about), each with its n and
a bootstrap interval over queries; best-of-k selection among runnable siblings is compared with a
random and the oracle pick (:mod:`codetool.prm.evaluate`).

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
from codetool.prm.evaluate import (
    best_of_k,
    decided_metrics,
    pairs_from_ids,
    plot_calibration,
    prm_metrics,
    row_pair_ids,
)

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
    bootstrap_samples: int = option(1000, "resamples of queries for the 95% intervals (pairwise accuracy, best-of-k)")
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


def _same_input_pairs(scorer, rows: list[dict], labels: list[int], pair_ids: list) -> set | None:
    """The labelled pairs ``train-prm`` leaves out (an input carrying both labels:
    :func:`codetool.prm.data.pairs_with_both_labels`), found with a local scorer's encoder; ``None``
    with a PRM server (its format is not known here: every pair is scored)."""
    encoder = getattr(scorer, "encoder", None)
    if encoder is None:
        return None
    from codetool.prm.data import pairs_with_both_labels
    from codetool.prm.format import item_from_row

    inputs = []
    for row in rows:
        enc = encoder.encode(item_from_row(row))
        inputs.append(enc.prefix_ids + enc.suffix_ids)
    same = pairs_with_both_labels(inputs, labels, [None if pid in (-1, None) else pid for pid in pair_ids])
    if same:
        logger.warning("%d labelled pairs left out: they hold an input this PRM reads under both labels (as train-prm "
                       "leaves them out)", len(same))
    return same


def eval_prm_command(cfg: EvalPRMConfig) -> int:
    """Score the held-out rows with the PRM and write metrics, scores and a calibration plot."""
    from codetool.jsonl import write_jsonl
    from codetool.prm.data import query_key, sibling_key, split_rows
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
    queries = [query_key(r) for r in rows]
    pair_ids, ok = row_pair_ids(rows, groups)
    same = _same_input_pairs(scorer, rows, labels, pair_ids)
    pair_ids = [-1 if pid in (same or ()) else pid for pid in pair_ids]
    pairs = pairs_from_ids(pair_ids, labels, ok, queries)
    metrics: dict[str, Any] = prm_metrics(scores, labels, pairs)
    decided = decided_metrics(scores, pairs, cfg.bootstrap_samples, cfg.bootstrap_seed)
    metrics.update(pairwise_accuracy_ci95=decided["all"]["ci95"], decided=decided,
                   best_of_k=best_of_k(scores, rows, groups, queries, cfg.bootstrap_samples, cfg.bootstrap_seed),
                   bootstrap_samples=cfg.bootstrap_samples, bootstrap_seed=cfg.bootstrap_seed,
                   bootstrap_unit="queries", same_input_pairs=len(same) if same is not None else None)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"prm": cfg.prm, "split": cfg.split,  # NaN (no held-out pairs) -> null: strict JSON
                                                   **{k: None if isinstance(v, float) and v != v else v
                                                      for k, v in metrics.items()}}, indent=2))
    write_jsonl(out / "scores.jsonl", ({"source": r.get("source"), "query_id": r.get("query_id"),
                                        "label": r["label"], "score": s} for r, s in zip(rows, scores)))
    plot_calibration(scores, labels, out / "calibration.png")
    logger.info("eval-prm on %d rows: %d labelled pairs, pairwise accuracy %.3f (%d where both steps ran: %s), "
                "AUC %.3f, ECE %.3f; wrote %s", metrics["rows"], metrics["pairs"], metrics["pairwise_accuracy"],
                metrics["pairs_both_ran"], f"{metrics['pairwise_accuracy_both_ran']:.3f}", metrics["auc"],
                metrics["ece"], out)
    _print(cfg, metrics)
    return 0


def _print(cfg: EvalPRMConfig, metrics: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"PRM on {cfg.split} rows: pairwise accuracy on labelled sibling pairs "
                        f"(95% interval: {cfg.bootstrap_samples} resamples of queries)")
    for column in ("pairs decided by", "pairs", "queries", "accuracy", "95% interval"):
        table.add_column(column)
    for kind, part in metrics["decided"].items():
        ci = part["ci95"]
        table.add_row(kind.replace("_", " "), str(part["pairs"]), str(part["queries"]),
                      "n/a" if part["accuracy"] is None else f"{part['accuracy']:.3f}",
                      "n/a (one query)" if ci and part["queries"] < 2 else f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "n/a")
    console = Console()
    console.print(table)
    best = metrics["best_of_k"]
    if best["groups"]:
        console.print(f"best-of-k among runnable siblings ({best['groups']} groups, {best['informative']} whose steps "
                      f"differ): latent reward of the PRM's pick {best['prm']:.3f}, random {best['random']:.3f}, "
                      f"oracle {best['oracle']:.3f}; PRM picks a best step in {100 * best['prm_best']:.0f}%")
    else:
        console.print("best-of-k: no sibling group with two steps that ran")
    console.print("rows: " + ", ".join(f"{k} {metrics[k]:.4f}" if isinstance(metrics[k], float) else f"{k} {metrics[k]}"
                                       for k in ("rows", "auc", "accuracy", "brier", "ece")))
