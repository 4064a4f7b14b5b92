"""``PRMConfig``: the settings of ``codetool train-prm`` and of the pipeline's ``train`` section.

TRL's ``<name>_config.py`` / ``<name>_trainer.py`` pair: this module is the config, the trainer is
:mod:`codetool.prm.trainer`. ``PRMConfig`` *is* a TRL ``SFTConfig``: every ``SFTConfig`` /
``TrainingArguments`` field is a YAML key and a ``--option`` (with its TRL help text), and only the
PRM's own settings are declared, in :class:`codetool.prm.options.PRMOptions` (``model``,
``dataset``, ``format``, LoRA, ``share_prefix``, ...; importable without torch, for ``--help``),
plus the few TRL fields whose default differs for a PRM. The keys 0.2.0 renamed
(:data:`codetool.prm.options.RENAMED`) are refused naming the new key.
:meth:`PRMConfig.stage_settings` gives the settings the pipeline's train stage hashes.

Importing this module imports TRL, ``transformers`` and ``torch`` (seconds): a config that embeds a
``PRMConfig`` declares it with :func:`codetool.config.section`, which imports it only when a config
is built, not for ``--help``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from trl import SFTConfig

from codetool.config import ConfigError
from codetool.config_groups import flat_settings
from codetool.prm.options import RENAMED, PRMOptions

__all__ = ["RENAMED", "PRMConfig"]

logger = logging.getLogger(__name__)


def _cuda_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@dataclass
class PRMConfig(PRMOptions, SFTConfig):
    """Settings of ``codetool train-prm``: every TRL ``SFTConfig`` option plus the PRM's own.

    PRM fields: ``model``, ``dataset``/``eval_dataset``/``eval_fraction``/``split_seed``, ``format``
    (prompt, label tokens, ``max_length``; ``SFTConfig.max_length`` is set from
    ``format.max_length``), ``finetune`` and ``lora_*``, ``train_label_head``, ``share_prefix``,
    ``max_packed_tokens``, ``precision`` (sets ``bf16`` unless given), ``model_dtype``, ``resume``.
    Defaults that differ from ``SFTConfig``: see the fields ``PRMOptions`` redeclares (``seed`` 0,
    ``learning_rate`` 2e-4, no gradient checkpointing, evaluation every 50 steps, ...). ``PRMOptions``
    comes first among the bases, so its defaults win; ``SFTConfig.__post_init__`` is called by name
    (the config groups' chain ends before it).

    Not a field: ``given`` (`dict`), the settings that differ from the defaults, as given (before
    TrainingArguments rewrites them), which :meth:`with_settings` and :meth:`stage_settings` read.

    Raises:
        ConfigError: on a value out of range (the message names the key and the fix).
    """

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
        if deepspeed_on_cpu and (self.bf16 or self.fp16):  # type: ignore[has-type]  # TRL's fields: Any to mypy
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
            if not self.use_cpu and self.ddp_backend is None:  # type: ignore[has-type]  # TRL's field: Any to mypy
                self.ddp_backend = "gloo"  # accelerate names no backend for a GPU-less DeepSpeed job
            self.dataloader_pin_memory = False
        if not self.eval_steps:
            self.eval_strategy, self.eval_steps = "no", None
        self.max_length = self.format.max_length
        self.data_seed = self.seed if self.data_seed is None else self.data_seed  # type: ignore[has-type]  # TRL's
        try:
            with warnings.catch_warnings():
                if "gradient_checkpointing" not in self.given:  # our default, not the user's: nothing to act on
                    warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated",
                                            category=FutureWarning)
                SFTConfig.__post_init__(self)
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
            self.fp16 = self.fp16 or launcher == "fp16"  # type: ignore[has-type]  # TRL's field: Any to mypy
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
        """The settings that decide what training writes, as ``{dotted key: value}``: every setting
        :class:`PRMOptions` declares (``format.max_length``, ...) and every other TRL setting given,
        with values as given (before TrainingArguments rewrites them). TRL's settings left at their
        defaults are left out, so a TRL release that adds a setting does not train a PRM again.
        ``codetool pipeline`` hashes this (``codetool.jobs.pipeline.stage_texts``)."""
        own = {f.name: self.given.get(f.name, _default(f)) for f in dataclasses.fields(PRMOptions)
               if f.init and not f.name.startswith("_")}
        settings = {**own, **self.given}
        if settings["report_to"] is None:  # "none", read as null by the YAML/CLI loader
            settings["report_to"] = "none"
        out: dict[str, Any] = {}
        for key, value in settings.items():
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                out.update(flat_settings(value, f"{key}."))
            else:
                out[key] = value
        return out
