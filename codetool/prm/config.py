"""``PRMConfig``: the settings of ``codetool train-prm`` and of the pipeline's ``train`` section.

TRL's ``<name>_config.py`` / ``<name>_trainer.py`` pair: this module is the config, the trainer is
:mod:`codetool.prm.trainer`. ``PRMConfig`` *is* a TRL ``SFTConfig``: every ``SFTConfig`` /
``TrainingArguments`` field is a YAML key and a ``--option`` (with its TRL help text), and only the
PRM's own settings are declared here (``model``, ``dataset``, ``format``, LoRA, ``share_prefix``,
...), plus the few TRL fields whose default differs for a PRM.

Old names keep working for one release (:data:`ALIASES`; ``codetool.config`` logs one deprecation
line per old key): the recipe keys of earlier versions (``epochs``, ``batch_size``, ``warmup``, ...)
and the pipeline's former ``TrainConfig`` section with its ``trainer_options`` mapping.
:meth:`PRMConfig.stage_settings` gives the settings under those old names, which the pipeline's
train stage hashes, so a stage finished before the switch is not trained again.

Importing this module imports TRL, ``transformers`` and ``torch`` (seconds): a config that embeds a
``PRMConfig`` declares it with :func:`codetool.config.section`, which imports it only when a config
is built, not for ``--help``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import SFTConfig

from codetool.config import ConfigError, option
from codetool.models.lora import LoRAGroup
from codetool.prm.format import PRMFormat

logger = logging.getLogger(__name__)

# Old names -> PRMConfig fields; "*" spreads a mapping of settings (TrainConfig's trainer_options).
ALIASES = {"epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
           "eval_batch_size": "per_device_eval_batch_size", "lr_scheduler": "lr_scheduler_type",
           "warmup": "warmup_steps", "num_workers": "dataloader_num_workers", "trainer_options": "*"}

# The keys of the pipeline's train section before it was a PRMConfig (TrainConfig), in its order;
# the train stage hash is taken over them (PRMConfig.stage_settings).
LEGACY_KEYS = ("model", "dataset", "eval_dataset", "eval_fraction", "split_seed", "output_dir", "format",
               "finetune", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "train_label_head",
               "epochs", "max_steps", "learning_rate", "lr_scheduler", "warmup", "weight_decay", "max_grad_norm",
               "batch_size", "eval_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
               "share_prefix", "precision", "model_dtype", "logging_steps", "eval_steps", "save_steps",
               "save_total_limit", "report_to", "resume", "seed", "num_workers", "max_samples")
_LEGACY_INTS = ("logging_steps", "eval_steps", "save_steps")  # int there, float in TrainingArguments


def _cuda_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@dataclass
class PRMConfig(SFTConfig, LoRAGroup):
    """Settings of ``codetool train-prm``: every TRL ``SFTConfig`` option plus the PRM's own.

    PRM fields: ``model``, ``dataset``/``eval_dataset``/``eval_fraction``/``split_seed``, ``format``
    (prompt, label tokens, ``max_length``; ``SFTConfig.max_length`` is set from
    ``format.max_length``), ``finetune`` and ``lora_*``, ``train_label_head``, ``share_prefix``,
    ``max_packed_tokens``, ``precision`` (sets ``bf16`` unless given), ``model_dtype``, ``resume``.
    Defaults that differ from ``SFTConfig``: see the fields redeclared below (``seed`` 0,
    ``learning_rate`` 2e-4, no gradient checkpointing, evaluation every 50 steps, ...).

    Not a field: ``given`` (`dict`), the settings that differ from the defaults, as given (before
    TrainingArguments rewrites them), which :meth:`with_settings` and :meth:`stage_settings` read.

    Raises:
        ConfigError: on a value out of range (the message names the key and the fix).
    """

    config_aliases = ALIASES  # not a field: read by codetool.config (YAML keys and --flags)

    # ---- the PRM's own options
    model: str = option("default", "base model: 'default', a local folder or a Hub id")
    dataset: list[str] = option(default_factory=lambda: ["data/prm/prm_examples.jsonl"],
                                help="PRM example JSONL file(s) from 'codetool build-trees'")
    eval_dataset: list[str] = option(default_factory=list, help="held-out JSONL file(s); empty: split by query id")
    eval_fraction: float = option(0.1, "share of queries held out when eval_dataset is empty")
    split_seed: int = option(0, "seed of the query-id split")
    never_train_on: list[str] = option(default_factory=lambda: ["stabletoolbench", "restbench-tmdb"],
                                       help="test sets no training row may come from, by id and by text (rows of "
                                            "those queries are dropped and counted): stabletoolbench[:<group>], "
                                            "restbench-tmdb[:<first>-<last>] (codetool.tools.heldout)")
    format: PRMFormat = field(default_factory=PRMFormat, metadata={"help": "prompt format and label tokens"})
    train_label_head: bool = option(True, "train the two label rows of the output embedding")
    share_prefix: str = option(
        "auto", "prefix sharing in a batch: auto (time each mode on the first batch, keep the fastest), "
        "packed (one forward, block mask), trie (KV-cache trie; not with checkpointing/FSDP), none; "
        "true means auto, false none")
    max_packed_tokens: int = option(4096, "width bound of a packed row (share_prefix packed)")
    precision: str = option("auto", "auto: bf16 on a bf16 GPU, fp32 otherwise (sets bf16 unless given)",
                            choices=("auto", "bf16", "fp32"))
    model_dtype: str = option("auto", "dtype the base weights are loaded in", choices=("auto", "float32", "bfloat16"))
    resume: str = option("auto", "auto (last checkpoint in output_dir), none, or a checkpoint folder")
    max_samples: int | None = option(None, "train on at most this many rows, the first of the dataset files "
                                     "(LLaMA-Factory's max_samples); none: all (10000 under format.interface "
                                     "reference, the public training command's value)")
    # ---- SFTConfig / TrainingArguments fields whose default differs for a PRM
    output_dir: str = option("checkpoints/prm/quickstart", "checkpoints and the final PRM go here")
    learning_rate: float = option(2e-4, "peak learning rate")
    num_train_epochs: float = option(1.0, "passes over the training rows")
    per_device_train_batch_size: int = option(4, "rows per device per step")
    per_device_eval_batch_size: int = option(8, "rows per device per eval step")
    lr_scheduler_type: str = option("cosine", "learning-rate schedule (a transformers SchedulerType)")
    warmup_steps: float = option(0.03, "warm-up: a share of the steps if < 1, else a number of steps")
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory, ~30% slower)")
    bf16: bool | None = option(None, "bf16 mixed precision; unset: from precision")
    logging_steps: float = option(10, "log the loss every N steps")
    eval_strategy: str = option("steps", "when to evaluate (no, steps, epoch); no without eval data")
    eval_steps: float | None = option(50, "evaluate every N steps (0: only at the end)")
    save_steps: float = option(100, "write checkpoint-N every N steps")
    save_total_limit: int | None = option(2, "keep at most this many checkpoint-N folders")
    report_to: str | list[str] | None = option("none", "experiment tracker(s): none, wandb, tensorboard, ...")
    seed: int = option(0, "seed of LoRA init, label rows, shuffling")
    remove_unused_columns: bool = option(False, "keep the PRM columns (target, group) for the collator")
    label_names: list[str] | None = option(default_factory=lambda: ["target", "group"],
                                           help="batch keys the metrics read")
    train_sampling_strategy: str = option("group_by_length", "row order when share_prefix is none")
    ddp_find_unused_parameters: bool | None = option(False, "DDP: every trained weight is used")
    dataset_kwargs: dict | str | None = option(default_factory=lambda: {"skip_prepare_dataset": True},
                                               help="rows are tokenised by codetool.prm.data")

    def __post_init__(self):
        # TrainingArguments' __post_init__ rewrites fields (report_to "none" -> [], enums, derived
        # flags): the settings as given are kept for stage_settings and with_settings.
        self.given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                      if f.init and getattr(self, f.name) != _default(f)}
        if not self.dataset:
            raise ConfigError("dataset: give at least one PRM example JSONL file.")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must lie in [0, 1), got {self.eval_fraction}.")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "lora_r", "logging_steps", "max_packed_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}.")
        mode = str(self.share_prefix).lower()
        self.share_prefix = {"true": "auto", "yes": "auto", "on": "auto", "false": "none", "no": "none",
                             "off": "none"}.get(mode, mode)
        if self.share_prefix not in ("auto", "packed", "trie", "none"):
            raise ConfigError(f"share_prefix: got {mode!r}; choose one of auto, packed, trie, none.")
        if self.report_to is None:  # "none" read as null by the YAML/CLI loader
            self.report_to = "none"
        self._agree_with_launcher()
        deepspeed_on_cpu = not torch.cuda.is_available() and \
            os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        if deepspeed_on_cpu and (self.bf16 or self.fp16):
            raise ConfigError(f"DeepSpeed without CUDA runs on its CPU accelerator, where transformers' Trainer takes no "
                              f"bf16/fp16 (precision {'bf16' if self.bf16 else 'fp16'}, mixed_precision "
                              f"{os.environ.get('ACCELERATE_MIXED_PRECISION', 'unset')}): launch with "
                              f"--mixed_precision no.")
        if self.bf16 is None:
            self.bf16 = self.precision == "bf16" or (self.precision == "auto" and _cuda_bf16())
        if not torch.cuda.is_available():
            # A torchrun/accelerate job on CPU is then gloo DDP; under DeepSpeed its own CPU
            # accelerator (DS_ACCELERATOR=cpu) runs the job, which accelerate skips with use_cpu.
            self.use_cpu = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true"
            if not self.use_cpu and self.ddp_backend is None:
                self.ddp_backend = "gloo"  # accelerate names no backend for a GPU-less DeepSpeed job
            self.dataloader_pin_memory = False
        if not self.eval_steps:
            self.eval_strategy, self.eval_steps = "no", None
        self.max_length = self.format.max_length
        self.data_seed = self.seed if self.data_seed is None else self.data_seed
        try:
            with warnings.catch_warnings():
                if "gradient_checkpointing" not in self.given:  # our default, not the user's: nothing to act on
                    warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated",
                                            category=FutureWarning)
                super().__post_init__()
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"train-prm: {e}") from None

    def _agree_with_launcher(self) -> None:
        """Under ``accelerate launch`` the config's ``mixed_precision`` (``ACCELERATE_MIXED_PRECISION``)
        decides ``precision: auto``; an explicit ``precision``/``bf16`` that disagrees with it is a
        ConfigError naming both (DeepSpeed would otherwise stop on ``bf16.enabled`` mismatching, and
        DDP silently train in another precision than the config says)."""
        launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "").lower()
        if launcher not in ("no", "bf16", "fp16"):
            return
        ours = "bf16" if self.bf16 else ("fp32" if self.bf16 is False else self.precision)
        if ours == "auto":
            self.precision = "bf16" if launcher == "bf16" else "fp32"
            self.bf16 = launcher == "bf16"
            self.fp16 = self.fp16 or launcher == "fp16"
            logger.info("precision %s (from the accelerate config's mixed_precision %s)",
                        "fp16" if self.fp16 else self.precision, launcher)
            return
        if (ours == "bf16") != (launcher == "bf16") or (launcher == "fp16" and not self.fp16):
            raise ConfigError(f"precision {ours} disagrees with the accelerate config's mixed_precision {launcher}: "
                              f"leave precision auto (the launcher decides), or launch with --mixed_precision "
                              f"{'bf16' if ours == 'bf16' else 'no'}.")

    def to_dict(self):
        out = super().to_dict()
        out["format"] = dataclasses.asdict(self.format)
        return out

    def with_settings(self, **changes: Any) -> PRMConfig:
        """A new ``PRMConfig`` of the settings this one was given, with ``changes`` (new names).

        Use it instead of ``dataclasses.replace``, which would hand ``__post_init__`` the fields
        TrainingArguments has already rewritten."""
        return type(self)(**{**self.given, **changes})

    def stage_settings(self) -> dict[str, Any]:
        """The settings that decide what training writes, under the old key names (:data:`LEGACY_KEYS`,
        the pipeline's ``train`` section before it was a ``PRMConfig``), every other setting given
        in ``trainer_options``; values as that section held them (``format`` as a mapping,
        ``logging_steps`` an integer). ``codetool pipeline`` hashes this mapping, so its train stage
        hash did not change when the section became a ``PRMConfig``."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        names = {old: ALIASES.get(old, old) for old in LEGACY_KEYS}
        out: dict[str, Any] = {}
        for old, new in names.items():
            value = self.given.get(new, _default(fields[new]))
            if old in _LEGACY_INTS and isinstance(value, float) and value.is_integer():
                value = int(value)
            out[old] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        if out["report_to"] is None:  # "none", read as null by the YAML/CLI loader
            out["report_to"] = "none"
        out["trainer_options"] = {k: v for k, v in self.given.items() if k not in names.values()}
        return out
