"""Train the generative PRM: ``codetool train-prm --config configs/train/<recipe>.yaml``.

The loss is the cross-entropy over the two label logits at the label position (the same two
numbers the scorer softmaxes), computed from the hidden state of that one position only
(``PRMModel``): no logits over the vocabulary, no loss on EOS, exactly one supervised token per
row. This is a small ``transformers.Trainer`` subclass, so DDP, DeepSpeed ZeRO-2/3, FSDP,
gradient accumulation, bf16, checkpoints, resume and ``report_to`` come from the Trainer; run it
unchanged under ``accelerate launch --config_file configs/accelerate/<setup>.yaml``.

LoRA (default) trains the adapter plus the (2, hidden) label rows; full fine-tuning trains
everything that the forward pass uses. Each eval step logs pairwise accuracy and AUC on the
held-out queries (``codetool.prm.evaluate``). Every checkpoint folder (``checkpoint-N`` and the
final ``output_dir``) is a PRM loadable by path (``codetool score --prm DIR``, the search's
``--prm DIR``).

Measured on the 2-core CPU box (DESIGN.md §7, ``benchmarks/bench_prm_training.py``): this path
trains several times more tokens per second than TRL ``SFTTrainer`` on prompt/completion rows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from codetool import CodetoolError, __version__
from codetool.config import ConfigError, option
from codetool.prm.format import PRMFormat

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Settings of ``codetool train-prm`` (recipes in ``configs/train/``)."""

    model: str = option("default", "base model: 'default', a local folder or a Hub id")
    dataset: list[str] = option(default_factory=lambda: ["data/prm/prm_examples.jsonl"],
                                help="PRM example JSONL file(s) from 'codetool build-trees'")
    eval_dataset: list[str] = option(default_factory=list, help="held-out JSONL file(s); empty: split by query id")
    eval_fraction: float = option(0.1, "share of queries held out when eval_dataset is empty")
    split_seed: int = option(0, "seed of the query-id split")
    output_dir: str = option("checkpoints/prm/quickstart", "checkpoints and the final PRM go here")
    format: PRMFormat = field(default_factory=PRMFormat, metadata={"help": "prompt format and label tokens"})
    finetune: str = option("lora", "LoRA adapter or full fine-tuning", choices=("lora", "full"))
    lora_r: int = option(8, "LoRA rank")
    lora_alpha: int = option(16, "LoRA alpha")
    lora_dropout: float = option(0.0, "LoRA dropout")
    lora_target_modules: list[str] = option(default_factory=lambda: ["all-linear"],
                                            help="modules that get LoRA ('all-linear' or names)")
    train_label_head: bool = option(True, "train the two label rows of the output embedding")
    epochs: float = option(1.0, "passes over the training rows")
    max_steps: int = option(-1, "stop after this many optimizer steps (-1: use epochs)")
    learning_rate: float = option(2e-4, "peak learning rate")
    lr_scheduler: str = option("cosine", "learning-rate schedule", choices=("cosine", "linear", "constant", "constant_with_warmup"))
    warmup: float = option(0.03, "warm-up: a share of the steps if < 1, else a number of steps")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(1.0, "gradient clipping")
    batch_size: int = option(4, "rows per device per step")
    eval_batch_size: int = option(8, "rows per device per eval step")
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step")
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory)")
    share_prefix: bool = option(True, "a query's rows share batches and their common prompt tokens run once "
                                "(off with gradient_checkpointing or FSDP)")
    precision: str = option("auto", "auto: bf16 on GPU, fp32 on CPU", choices=("auto", "bf16", "fp32"))
    model_dtype: str = option("auto", "dtype the base weights are loaded in", choices=("auto", "float32", "bfloat16"))
    logging_steps: int = option(10, "log the loss every N steps")
    eval_steps: int = option(50, "evaluate every N steps (0: only at the end)")
    save_steps: int = option(100, "write checkpoint-N every N steps")
    save_total_limit: int = option(2, "keep at most this many checkpoint-N folders")
    report_to: str = option("none", "experiment tracker", choices=("none", "wandb", "tensorboard"))
    resume: str = option("auto", "auto (last checkpoint in output_dir), none, or a checkpoint folder")
    seed: int = option(0, "seed of LoRA init, label rows, shuffling")
    num_workers: int = option(0, "data loader worker processes")

    def __post_init__(self):
        if not self.dataset:
            raise ConfigError("dataset: give at least one PRM example JSONL file.")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must lie in [0, 1), got {self.eval_fraction}.")
        for name in ("batch_size", "eval_batch_size", "gradient_accumulation_steps", "lora_r", "logging_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}.")


def _make_trainer_class():
    import torch
    import torch.nn.functional as F
    from transformers import Trainer

    from codetool.prm.data import PrefixGroupSampler
    from codetool.prm.modeling import save_prm

    class PRMTrainer(Trainer):
        """``Trainer`` with the two-label loss, PRM checkpoints and PRM eval metrics."""

        def __init__(self, *args, prm_tokenizer=None, prm_meta=None, share_prefix=False, **kwargs):
            super().__init__(*args, **kwargs)
            self.prm_tokenizer, self.prm_meta = prm_tokenizer, prm_meta or {}
            self.loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides by GA steps
            # FSDP's wrapped layers expect one call per forward; the shared prefix calls them twice
            self.share_prefix = share_prefix and not self.is_fsdp_enabled
            if share_prefix and self.is_fsdp_enabled:
                logger.info("share_prefix is off: FSDP's wrapped layers expect one call per forward")

        def _get_train_sampler(self, train_dataset=None):
            dataset = self.train_dataset if train_dataset is None else train_dataset
            if not self.share_prefix or "query_group" not in getattr(dataset, "column_names", ()):
                return super()._get_train_sampler(train_dataset)
            return PrefixGroupSampler(dataset["query_group"], [len(ids) for ids in dataset["input_ids"]],
                                      self.args.train_batch_size, seed=self.args.seed)  # one process's batch

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            logits = model(input_ids=inputs["input_ids"], last_index=inputs["last_index"],
                           share_prefix=self.share_prefix)  # (batch, 2)
            loss = F.cross_entropy(logits, inputs["target"].to(logits.device))
            return (loss, logits) if return_outputs else loss

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            inputs = self._prepare_inputs(inputs)
            with torch.no_grad(), self.compute_loss_context_manager():
                loss, logits = self.compute_loss(model, inputs, return_outputs=True)
            if prediction_loss_only:
                return loss.detach(), None, None
            return loss.detach(), logits.detach(), torch.stack([inputs["target"], inputs["group"]], dim=1)

        def _save(self, output_dir=None, state_dict=None):
            output_dir = output_dir or self.args.output_dir
            if not self.args.should_save:
                return
            model = self.accelerator.unwrap_model(self.model)
            save_prm(output_dir, model, self.prm_tokenizer, self.prm_meta, state_dict)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            if self.is_fsdp_enabled:  # FSDP keeps its own sharded model state
                return super()._load_from_checkpoint(resume_from_checkpoint, model)
            load_prm_weights(self.accelerator.unwrap_model(model or self.model), resume_from_checkpoint)

    return PRMTrainer


def load_prm_weights(model, folder: str | Path) -> None:
    """Put the trainable weights of a PRM checkpoint folder back into ``model`` (resume)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    head = folder / "label_head.safetensors"
    if not head.is_file():
        raise CodetoolError(f"cannot resume from {folder}: no label_head.safetensors; pass a checkpoint-N "
                            "folder written by 'codetool train-prm', or --resume none.")
    model.label_head.data.copy_(load_file(str(head))["weight"].to(model.label_head.dtype))
    if hasattr(model.lm, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model.lm, load_file(str(folder / "adapter_model.safetensors")))
    else:
        from transformers.trainer_utils import load_sharded_checkpoint

        if (folder / "model.safetensors").is_file():
            model.lm.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
        else:
            load_sharded_checkpoint(model.lm, str(folder), strict=False)


def _resume_path(cfg: TrainConfig) -> str | None:
    if cfg.resume in ("", "none", "None"):
        return None
    if cfg.resume == "auto":
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(cfg.output_dir) if Path(cfg.output_dir).is_dir() else None
        if last:
            logger.info("resuming from %s (pass --resume none to start over)", last)
        return last
    if not Path(cfg.resume).is_dir():
        raise CodetoolError(f"resume: checkpoint folder {cfg.resume} not found; pass auto, none or a checkpoint-N folder.")
    return cfg.resume


def _training_args(cfg: TrainConfig, has_eval: bool):
    import torch
    from transformers import TrainingArguments

    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and torch.cuda.is_available()
                                       and torch.cuda.is_bf16_supported())
    eval_every = has_eval and cfg.eval_steps > 0
    return TrainingArguments(
        output_dir=cfg.output_dir, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size, per_device_eval_batch_size=cfg.eval_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup, weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, bf16=bf16, logging_steps=cfg.logging_steps,
        eval_strategy="steps" if eval_every else "no", eval_steps=cfg.eval_steps if eval_every else None,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        report_to=cfg.report_to, seed=cfg.seed, data_seed=cfg.seed, remove_unused_columns=False,
        label_names=["target", "group"], train_sampling_strategy="group_by_length",
        dataloader_num_workers=cfg.num_workers, dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),  # then a torchrun/accelerate job on CPU is gloo DDP
        ddp_find_unused_parameters=False)


def _load_dtype(cfg: TrainConfig, args) -> str:
    if cfg.model_dtype != "auto":
        return cfg.model_dtype
    import torch

    if not torch.cuda.is_available():
        return "float32"
    # LoRA keeps frozen weights in bf16; DeepSpeed keeps fp32 masters itself; AMP needs fp32 weights.
    return "bfloat16" if cfg.finetune == "lora" or args.deepspeed_plugin is not None else "float32"


def build_model(cfg: TrainConfig, dtype: str = "float32"):
    """``(PRMModel, tokenizer)`` ready to train: label tokens added, LoRA or full, head trainable."""
    from codetool.models.loading import load_model
    from codetool.prm.modeling import PRMModel, add_label_tokens, is_tied

    lm, tokenizer = load_model(cfg.model, dtype=dtype, device="cpu", for_training=True)
    label_ids = add_label_tokens(lm, tokenizer, cfg.format, seed=cfg.seed)
    if cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_target_modules
        lm = get_peft_model(lm, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, task_type="CAUSAL_LM",
            target_modules=targets[0] if targets == ["all-linear"] else targets))
    else:
        lm.requires_grad_(True)
        if not is_tied(lm):  # the label head replaces the LM head in training; unused params break DDP
            lm.get_output_embeddings().requires_grad_(False)
    model = PRMModel(lm, label_ids)
    model.label_head.requires_grad_(cfg.train_label_head)
    if cfg.gradient_checkpointing:
        model.activation_checkpointing_enable()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("PRM %s on %s: %d trainable of %d parameters; label ids %s", cfg.finetune, cfg.model,
                trainable, total, label_ids)
    return model, tokenizer


def _datasets(cfg: TrainConfig, encoder):
    from datasets import Dataset

    from codetool.prm.data import read_rows, split_rows, tokenize_rows

    rows = read_rows(cfg.dataset)
    if cfg.eval_dataset:
        train_rows, eval_rows = rows, read_rows(cfg.eval_dataset)
    else:
        train_rows, eval_rows = split_rows(rows, cfg.eval_fraction, cfg.split_seed)
    if not train_rows:
        raise CodetoolError(f"no training rows left after holding out {cfg.eval_fraction:.0%} of the queries; "
                            "lower eval_fraction or add data.")
    train_tok, stats = tokenize_rows(train_rows, encoder)
    logger.info("train rows %d (%d tokens, %d cut to fit); eval rows %d", stats.rows, stats.tokens,
                stats.truncated, len(eval_rows))
    eval_ds = Dataset.from_list(tokenize_rows(eval_rows, encoder)[0]) if eval_rows else None
    return Dataset.from_list(train_tok), eval_ds


def _compute_metrics(prediction) -> dict[str, float]:
    import numpy as np

    from codetool.prm.evaluate import prm_metrics

    logits = np.asarray(prediction.predictions, dtype=np.float64)
    labels = np.asarray(prediction.label_ids)
    scores = 1.0 / (1.0 + np.exp(logits[:, 1] - logits[:, 0]))  # softmax over the two labels
    metrics = prm_metrics(scores, 1 - labels[:, 0], labels[:, 1])
    return {k: metrics[k] for k in ("pairwise_accuracy", "auc", "accuracy", "ece")}


def build_trainer(cfg: TrainConfig):
    """The ready-to-train ``PRMTrainer`` for ``cfg``: model with label tokens and LoRA (or full),
    tokenised train/eval datasets, collator, metrics. ``train_command`` runs it; benchmarks and
    callers that add callbacks use it directly.

    Raises:
        CodetoolError: if ``report_to`` names a tracker that is not installed, or the data is missing.
    """
    if cfg.report_to != "none" and find_spec(cfg.report_to) is None:
        raise CodetoolError(f"report_to {cfg.report_to}: the package is not installed; "
                            f"pip install {cfg.report_to} (or use report_to: none).")
    from transformers import set_seed

    from codetool.prm.data import PRMCollator
    from codetool.prm.format import PromptEncoder

    set_seed(cfg.seed)
    has_eval = bool(cfg.eval_dataset) or cfg.eval_fraction > 0
    args = _training_args(cfg, has_eval)  # before the model: ZeRO-3 then loads it partitioned
    logger.info("training on %d process(es), device %s", args.world_size, args.device)
    model, tokenizer = build_model(cfg, _load_dtype(cfg, args))
    encoder = PromptEncoder(tokenizer, cfg.format)
    train_ds, eval_ds = _datasets(cfg, encoder)
    if eval_ds is None and args.eval_strategy != "no":
        args.eval_strategy = "no"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    share_prefix = cfg.share_prefix and not cfg.gradient_checkpointing  # checkpointing turns the KV cache off
    if cfg.share_prefix and not share_prefix:
        logger.info("share_prefix is off: gradient_checkpointing recomputes without a KV cache")
    meta = {"base_model": cfg.model, "format": dataclasses.asdict(cfg.format), "seed": cfg.seed,
            "finetune": cfg.finetune, "split": {"eval_fraction": 0.0 if cfg.eval_dataset else cfg.eval_fraction,
                      "seed": cfg.split_seed, "eval_dataset": list(cfg.eval_dataset)},
            "codetool_version": __version__}
    return _make_trainer_class()(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
        data_collator=PRMCollator(encoder.label_ids, pad_id or 0), compute_metrics=_compute_metrics,
        prm_tokenizer=tokenizer, prm_meta=meta, share_prefix=share_prefix)


def train_command(cfg: TrainConfig) -> int:
    """Train a PRM and write it to ``cfg.output_dir`` (resumable; see the module docstring)."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    resume = _resume_path(cfg)
    trainer = build_trainer(cfg)
    start = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(cfg.output_dir)
    summary = {"train_loss": result.training_loss, "steps": result.global_step,
               "seconds": round(time.time() - start, 1)}
    if trainer.eval_dataset is not None:
        summary.update(trainer.evaluate())
    if trainer.args.should_save:
        Path(cfg.output_dir, "train_summary.json").write_text(json.dumps(summary, indent=2, default=float))
        logger.info("PRM written to %s: %s", cfg.output_dir,
                    ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()))
    return 0
