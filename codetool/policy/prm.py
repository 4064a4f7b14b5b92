"""The PRM a policy run is rewarded by: the one named, the pipeline's, or a small one trained here.

``prm: auto`` takes the PRM that ``make demo`` trains (``runs/quickstart/train/prm``) when it is
there; otherwise it trains a small LoRA PRM on the default model from synthetic rows
(``codetool.prm.synthetic``: made-up queries whose good steps call the offered tool and bad ones
do not) into ``<output_dir>/prm`` and says so in the report. That PRM only knows "a step that
calls an offered function with an argument beats one that does not": a smoke test of the
machinery, not the paper's PRM. Command order for the real one, from a fresh clone:
``make demo`` (trees, PRM, search, eval), then ``codetool train-policy``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from codetool.models.spec import ModelSpec

from .config import TrainPolicyConfig

logger = logging.getLogger(__name__)

PIPELINE_PRM = Path("runs") / "quickstart" / "train" / "prm"


def uses_prm(cfg: TrainPolicyConfig) -> bool:
    """Whether any reward setting of ``cfg`` weights the PRM reward."""
    return any(s.prm for s in cfg.run_settings)


def resolve_prm(cfg: TrainPolicyConfig) -> tuple[ModelSpec | None, str]:
    """``(spec, description)`` of the run's PRM (``(None, ...)`` when no setting uses it): the one
    ``cfg.prm`` names (parsed by the config), or a PRM folder found or trained here.

    Raises:
        CodetoolError: what training the fallback PRM raises (a missing default model).
    """
    if not uses_prm(cfg):
        return None, "not used (no setting weights the PRM reward)"
    if cfg.prm_spec is not None:
        return cfg.prm_spec, f"{cfg.prm} (given)"
    if (PIPELINE_PRM / "prm_config.json").is_file():
        return ModelSpec.folder(PIPELINE_PRM, role="prm"), f"{PIPELINE_PRM}: the PRM the pipeline quickstart trained (make demo)"
    folder = Path(cfg.output_dir) / "prm"
    note = (f"{folder}: a small PRM trained here on synthetic rows ({cfg.prm_fallback_steps} LoRA steps), a smoke "
            "test; run `make demo` first to reward with the pipeline's PRM")
    if not (folder / "prm_config.json").is_file():
        train_synthetic_prm(folder, steps=cfg.prm_fallback_steps, seed=cfg.seeds[0])
    return ModelSpec.folder(folder, role="prm"), note


def train_synthetic_prm(folder: Path, *, steps: int, seed: int = 0, model: str = "default") -> Path:
    """Train a LoRA PRM on synthetic rows into ``folder`` (see the module docstring)."""
    from codetool.config import from_dict
    from codetool.jsonl import write_jsonl
    from codetool.prm.synthetic import synthetic_rows
    from codetool.prm.trainer import PRMConfig, build_trainer

    data = folder.parent / "prm_synthetic.jsonl"
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(data, synthetic_rows(max(steps, 8), steps=2, candidates=2, seed=seed, extra_tools=1))
    logger.info("no PRM given and none from the pipeline: training a small one on synthetic rows (%d steps)", steps)
    cfg = from_dict(PRMConfig, {"model": model, "dataset": [str(data)], "output_dir": str(folder), "max_steps": steps,
                                "eval_fraction": 0.0, "format": {"max_length": 320, "max_suffix_length": 96},
                                "learning_rate": 1e-3, "per_device_train_batch_size": 4, "save_steps": 10**6,
                                "logging_steps": max(steps // 2, 1), "eval_steps": 0, "resume": "none",
                                "warmup_steps": 0, "seed": seed})
    trainer = build_trainer(cfg)
    trainer.train()
    trainer.save_model(str(folder))  # a PRM folder (prm_config.json + weights); no model card for a smoke PRM
    return folder
