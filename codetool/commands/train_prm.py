"""``codetool train-prm --config configs/train/<recipe>.yaml``: train the process reward model.

The settings are :class:`codetool.prm.config.PRMConfig` (every TRL ``SFTConfig`` option plus the
PRM's own; the pipeline's ``train`` section is one), the trainer is
:func:`codetool.prm.trainer.build_trainer`'s ``PRMTrainer``; under ``accelerate launch`` it runs
unchanged on several processes. ``--resume auto`` continues from the newest whole checkpoint.
Writes the PRM, its model card (``README.md``) and ``train_summary.json`` into ``output_dir``,
and pushes it to the Hub when ``push_to_hub`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from codetool.prm.checkpoints import resume_checkpoint
from codetool.prm.config import PRMConfig
from codetool.prm.trainer import build_trainer

__all__ = ["PRMConfig", "train_command"]

logger = logging.getLogger(__name__)


def train_command(cfg: PRMConfig) -> int:
    """Train a PRM and write it to ``cfg.output_dir`` with a model card (resumable); push it to the
    Hub when ``push_to_hub`` is set."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    empty = [p for p in cfg.eval_dataset if Path(p).is_file() and not Path(p).read_text(encoding="utf-8").strip()]
    if cfg.eval_dataset and len(empty) == len(cfg.eval_dataset):  # a few trees can hold none out (build-trees)
        logger.warning("no held-out rows in %s: training without evaluation (more queries give a validation "
                       "split; `codetool eval-prm` measures the PRM later)", ", ".join(empty))
        cfg = cfg.with_settings(eval_dataset=[])
    resume = resume_checkpoint(cfg.resume, cfg.output_dir)
    trainer = build_trainer(cfg)
    start = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(cfg.output_dir)
    summary = {"train_loss": result.training_loss, "steps": result.global_step,
               "seconds": round(time.time() - start, 1),
               "share_prefix": trainer.accelerator.unwrap_model(trainer.model).share_mode or trainer.share_prefix,
               **{k: trainer.prm_meta.get(k, 0) for k in ("test_queries_dropped", "test_rows_dropped")},
               "test_sets_unchecked": trainer.prm_meta.get("test_sets_unchecked", [])}
    if trainer.eval_dataset is not None:
        summary.update(trainer.evaluate())
    if trainer.args.should_save:
        trainer.create_model_card(model_name=Path(cfg.output_dir).name, dataset_name=", ".join(cfg.dataset))
        Path(cfg.output_dir, "train_summary.json").write_text(json.dumps(summary, indent=2, default=float))
        logger.info("PRM written to %s: %s", cfg.output_dir,
                    ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()))
    if cfg.push_to_hub:
        trainer.push_to_hub(dataset_name=", ".join(cfg.dataset))
    # every process leaves the process group before the interpreter exits: left to the exit, gloo's
    # threads were torn down under a rank now and then ("terminate called without an active
    # exception", SIGABRT), and `accelerate launch` failed a run whose PRM was written (CI, twice)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0
