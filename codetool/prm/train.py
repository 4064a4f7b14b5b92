"""The light PRM training recipe (``TrainConfig``) that the pipeline embeds; the trainer is in
:mod:`codetool.prm.trainer` (``PRMConfig`` extends TRL's ``SFTConfig``; ``codetool train-prm``).

This module imports nothing heavy, so ``codetool pipeline --help`` stays fast. ``TrainConfig``
keeps the recipe keys of ``configs/train/*.yaml``; any other ``SFTConfig`` /
``TrainingArguments`` option goes in ``trainer_options``. ``codetool.commands.train_prm.train_command``
turns it into a ``PRMConfig`` (``codetool.prm.trainer.to_prm_config``) and trains.

The loss is the cross-entropy over the two label logits at the label position (the same two
numbers the scorer softmaxes), computed from the hidden state of that one position only
(``PRMModel``): no logits over the vocabulary, no loss on EOS, exactly one supervised token per
row; under ``format.interface: reference`` (the public CodeTool PRM) it is plain SFT on the answer
word instead: the cross-entropy over the whole vocabulary (``codetool.prm.reference``), with at most
``max_samples`` rows (10,000 there). This is a small ``transformers.Trainer`` subclass, so DDP, DeepSpeed ZeRO-2/3, FSDP,
gradient accumulation, bf16, checkpoints, resume and ``report_to`` come from the Trainer; run it
unchanged under ``accelerate launch --config_file configs/accelerate/<setup>.yaml``.

LoRA (default) trains the adapter plus the (2, hidden) label rows; full fine-tuning trains
everything that the forward pass uses. Each eval step logs pairwise accuracy and AUC on the
held-out queries (``codetool.prm.evaluate``). Every checkpoint folder (``checkpoint-N`` and the
final ``output_dir``) is a PRM loadable by path (``codetool score --prm DIR``, the search's
``--prm DIR``).

``benchmarks/bench_prm_training.py`` compares this path with TRL's ``SFTTrainer`` on
prompt/completion rows; its figures are in the README ("Benchmarks").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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
    share_prefix: str = option("auto", "prefix sharing: auto (measured), packed, trie or none "
                               "(see codetool.prm.trainer.PRMConfig)")
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
    max_samples: int | None = option(None, "train on at most this many rows, the first of the files (LLaMA-Factory's "
                                     "max_samples); none: all (10000 under format.interface reference)")
    trainer_options: dict = option(default_factory=dict, help="any other SFTConfig / TrainingArguments option, "
                                   "e.g. {optim: adamw_torch_fused} (see 'codetool train-prm --help')")

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


def build_trainer(cfg):
    """The ``PRMTrainer`` of ``cfg`` (``TrainConfig`` or ``PRMConfig``); see ``codetool.prm.trainer``."""
    from codetool.prm.trainer import build_trainer as build

    return build(cfg)


def build_model(cfg, dtype: str = "float32"):
    """``(PRMModel, tokenizer)`` ready to train; see ``codetool.prm.trainer.build_model``."""
    from codetool.prm.trainer import build_model as build

    return build(cfg, dtype)
