"""The PRM trainer on TRL: ``PRMTrainer`` (an ``SFTTrainer``), configured by ``PRMConfig`` (a TRL ``SFTConfig``).

``codetool train-prm --config configs/train/<recipe>.yaml`` (``codetool.commands.train_prm``) runs
the trainer :func:`build_trainer` builds. The loss
is the cross-entropy over the two label logits at the label position (the numbers the scorer
softmaxes), computed from the hidden state of that one position (``PRMModel``): no logits over
the vocabulary, no loss on EOS, one supervised token per row (``format.interface: reference``:
the answer word's cross-entropy over the whole vocabulary, ``PRMModel.full_vocab``). DDP, DeepSpeed ZeRO-2/3, FSDP,
gradient accumulation, bf16, checkpoints, resume, ``report_to`` and ``push_to_hub`` come from
the Trainer: run it unchanged under ``accelerate launch --config_file configs/accelerate/<x>.yaml``.

Why ``SFTTrainer`` and not TRL's base trainer: the PRM *is* completion-only SFT with one
supervised token (TRL's convention, docs/DESIGN.md §6), ``SFTConfig`` is the option set users know,
and the base trainer is private (``trl.trainer.base_trainer._BaseTrainer``). ``PRMTrainer``
passes its own collator and ``skip_prepare_dataset`` (rows are tokenised by
``codetool.prm.data``), and overrides ``compute_loss``/``prediction_step``/``_save``; the model
card (``README.md``) is TRL's, written next to each checkpoint and the final model. Each
``checkpoint-N`` is marked whole once every process has saved it (``codetool.prm.checkpoints``):
``--resume auto`` takes the newest whole one and removes folders whose save a kill or a full disk
cut short.

The settings, ``PRMConfig``, are in :mod:`codetool.prm.config` (imported here too).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from importlib.util import find_spec
from pathlib import Path

import torch
import torch.nn.functional as F
from trl import SFTTrainer

from codetool import CodetoolError, __version__
from codetool.prm.config import PRMConfig

__all__ = ["PRMConfig", "PRMTrainer", "build_model", "build_trainer", "load_prm_weights"]

logger = logging.getLogger(__name__)

REFERENCE_MAX_SAMPLES = 10_000  # the public CodeTool training command (LLaMA-Factory --max_samples)


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


class PRMTrainer(SFTTrainer):
    """TRL ``SFTTrainer`` with the two-label loss, PRM checkpoints, PRM eval metrics and prefix sharing.

    Args:
        model (`PRMModel`): from :func:`build_model`.
        args (`PRMConfig`): the settings.
        prm_meta (`dict`, *optional*): written to each checkpoint's ``prm_config.json``.
        Other arguments: as ``SFTTrainer`` (``processing_class`` is the tokenizer, saved with the model).

    ``share_prefix`` (from ``args``): ``auto`` decides on the first batch by rule, without
    running it (``PRMModel.pick_share_mode``): the packed forward when it saves positions and the
    attention takes a block mask, else the trie on a CPU, else none. The trie is never used with gradient checkpointing (no KV
    cache) or FSDP (its wrapped layers expect one call per forward).
    """

    _tag_names = ["trl", "codetool", "prm"]
    _name = "PRM"
    loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides by GA steps

    def __init__(self, *args, prm_meta: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.prm_meta = prm_meta or {}
        prm = self.accelerator.unwrap_model(self.model)
        prm.max_packed_tokens = self.args.max_packed_tokens
        prm.no_trie = self.is_fsdp_enabled
        self.share_prefix = self.args.share_prefix
        logger.info("distributed: %s", self.distributed_kind())
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not self.is_fsdp_enabled:
            logger.warning("the accelerate config asks for FSDP, but accelerate %s runs a job without CUDA GPUs as "
                           "plain DDP over gloo (it turns FSDP on for GPU-type devices only): weights are not "
                           "sharded in this run", _version("accelerate"))
        if self.share_prefix == "trie" and (self.is_fsdp_enabled or self.args.gradient_checkpointing):
            logger.info("share_prefix trie needs a KV cache and one call per layer: using packed")
            self.share_prefix = "packed"

    def distributed_kind(self) -> str:
        """What this job runs as, e.g. ``DeepSpeed ZeRO-3 on 2 processes`` (logged at start)."""
        processes = f"{self.args.world_size} process(es), {self.args.device.type}"
        if self.is_deepspeed_enabled:
            return f"DeepSpeed ZeRO-{self.accelerator.state.deepspeed_plugin.zero_stage} on {processes}"
        if self.is_fsdp_enabled:
            return f"FSDP{getattr(self.accelerator.state.fsdp_plugin, 'fsdp_version', '')} on {processes} " \
                   f"(is_fsdp_enabled True)"
        return f"{'DDP' if self.args.world_size > 1 else 'one process'} on {processes}"

    def _get_train_sampler(self, train_dataset=None):
        from codetool.prm.data import PrefixGroupSampler

        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.share_prefix == "none" or "query_group" not in getattr(dataset, "column_names", ()):
            return super()._get_train_sampler(train_dataset)
        return PrefixGroupSampler(dataset["query_group"], [len(ids) for ids in dataset["input_ids"]],
                                  self.args.train_batch_size, seed=self.args.seed)  # one process's batch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(input_ids=inputs["input_ids"], last_index=inputs["last_index"],
                       share_prefix=self.share_prefix)  # (batch, 2)
        target = inputs["target"].to(logits.device)
        if self.args.format.interface == "reference":  # log-probs over the vocabulary: plain SFT on the word
            loss = F.nll_loss(logits, target)
        else:
            loss = F.cross_entropy(logits, target)
        return (loss, logits) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, logits = self.compute_loss(model, inputs, return_outputs=True)
        if prediction_loss_only:
            return loss.detach(), None, None
        columns = [inputs["target"], inputs["group"]] + [inputs.get(k, torch.full_like(inputs["group"], -1))
                                                         for k in ("pair", "ok", "query")]
        return loss.detach(), logits.detach(), torch.stack(columns, dim=1)

    def _save(self, output_dir=None, state_dict=None):
        from codetool.prm.folder import save_prm

        output_dir = output_dir or self.args.output_dir
        if not self.args.should_save:
            return
        model = self.accelerator.unwrap_model(self.model)
        save_prm(output_dir, model, self.processing_class, self.prm_meta, state_dict)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _save_checkpoint(self, model, trial, *args, **kwargs):
        """The Trainer's checkpoint, then its completion marker once every process has saved
        (``codetool.prm.checkpoints``): a save cut short is never resumed from."""
        from codetool.prm.checkpoints import mark_complete

        super()._save_checkpoint(model, trial, *args, **kwargs)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}",
                          self.state.global_step)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if self.is_fsdp_enabled:  # FSDP keeps its own sharded model state
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_prm_weights(self.accelerator.unwrap_model(model or self.model), resume_from_checkpoint)


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


def _load_dtype(cfg: PRMConfig, args) -> str:
    if cfg.model_dtype != "auto":
        return cfg.model_dtype
    if not torch.cuda.is_available():
        return "float32"
    # LoRA keeps frozen weights in bf16; DeepSpeed keeps fp32 masters itself; AMP needs fp32 weights.
    return "bfloat16" if cfg.finetune == "lora" or args.deepspeed_plugin is not None else "float32"


def build_model(cfg: PRMConfig, dtype: str = "float32"):
    """``(PRMModel, tokenizer)`` ready to train: label tokens added, LoRA or full, head trainable."""
    from codetool.models.loading import load_model
    from codetool.prm.modeling import PRMModel, add_label_tokens, is_tied

    lm, tokenizer = load_model(cfg.model, dtype=dtype, device="cpu", for_training=True)
    label_ids = add_label_tokens(lm, tokenizer, cfg.format, seed=cfg.seed)
    if cfg.finetune == "lora":
        from peft import get_peft_model

        lm = get_peft_model(lm, cfg.lora_config())
    else:
        lm.requires_grad_(True)
        # the label head replaces the LM head in training (unused params break DDP), except under the
        # reference interface, whose loss runs over the whole vocabulary
        if not is_tied(lm) and cfg.format.interface != "reference":
            lm.get_output_embeddings().requires_grad_(False)
    model = PRMModel(lm, label_ids)
    model.full_vocab = cfg.format.interface == "reference"
    model.max_packed_tokens = cfg.max_packed_tokens
    model.label_head.requires_grad_(cfg.train_label_head)
    if cfg.gradient_checkpointing:
        model.activation_checkpointing_enable()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("PRM %s on %s: %d trainable of %d parameters; label ids %s", cfg.finetune, cfg.model,
                trainable, total, label_ids)
    return model, tokenizer


def _datasets(cfg: PRMConfig, encoder, rows: list[dict], eval_rows: list[dict] | None):
    from datasets import Dataset

    from codetool.prm.data import split_rows, tokenize_rows

    cap = cfg.max_samples if cfg.max_samples is not None else (
        REFERENCE_MAX_SAMPLES if cfg.format.interface == "reference" else None)
    if cap is not None and len(rows) > cap:  # LLaMA-Factory's max_samples: the first rows of the file
        logger.info("max_samples %d: training on the first %d of %d rows", cap, cap, len(rows))
        rows = rows[:cap]
    if eval_rows is not None:
        train_rows = rows
    else:
        train_rows, eval_rows = split_rows(rows, cfg.eval_fraction, cfg.split_seed)
    if not train_rows:
        raise CodetoolError(f"no training rows left after holding out {cfg.eval_fraction:.0%} of the queries; "
                            "lower eval_fraction or add data.")
    train_tok, stats = tokenize_rows(train_rows, encoder)
    logger.info("train rows %d (%d tokens, %d cut to fit, %d left out as one input under two labels); eval rows %d",
                stats.rows, stats.tokens, stats.truncated, stats.same_input, len(eval_rows))
    eval_ds = Dataset.from_list(tokenize_rows(eval_rows, encoder)[0]) if eval_rows else None
    return Dataset.from_list(train_tok), eval_ds


def _label_rules(rows: list[dict]) -> list[str]:
    """The tree label rules (``trees.label_rule``) the training rows were made with, as the rows say."""
    return sorted({str(r["label_rule"]) for r in rows if r.get("label_rule")})


def _compute_metrics(prediction) -> dict[str, float]:
    import numpy as np

    from codetool.prm.evaluate import pairs_from_ids, prm_metrics

    logits = np.asarray(prediction.predictions, dtype=np.float64)
    labels = np.asarray(prediction.label_ids)  # target, group, pair, ok, query
    scores = 1.0 / (1.0 + np.exp(logits[:, 1] - logits[:, 0]))  # softmax over the two labels
    positive = 1 - labels[:, 0]
    pairs = pairs_from_ids(labels[:, 2].tolist(), positive.tolist(), labels[:, 3].tolist(), labels[:, 4].tolist()) \
        if labels.shape[1] > 4 else []
    metrics = prm_metrics(scores, positive, pairs)  # on labelled pairs, and on those whose steps both ran
    return {k: metrics[k] for k in ("pairwise_accuracy", "pairs", "pairwise_accuracy_both_ran", "pairs_both_ran",
                                    "auc", "accuracy", "ece")}


def build_trainer(cfg: PRMConfig) -> PRMTrainer:
    """The ready-to-train ``PRMTrainer`` for ``cfg`` (a ``PRMConfig``):
    model with label tokens and LoRA (or full), tokenised train/eval datasets, collator, metrics.
    ``codetool train-prm`` runs it; benchmarks and callers that add callbacks use it directly.

    Raises:
        CodetoolError: if ``report_to`` names a tracker that is not installed, or the data is missing.
    """
    for tracker in [cfg.report_to] if isinstance(cfg.report_to, str) else cfg.report_to or []:
        if tracker and tracker not in ("none", "all") and find_spec(tracker) is None:
            raise CodetoolError(f"report_to {tracker}: the package is not installed; "
                                f"pip install {tracker} (or use report_to: none).")
    from transformers import set_seed

    from codetool.prm.data import PRMCollator
    from codetool.prm.format import PromptEncoder

    for path in [*([cfg.dataset] if isinstance(cfg.dataset, str) else cfg.dataset),
                 *([cfg.eval_dataset] if isinstance(cfg.eval_dataset, str) else cfg.eval_dataset or [])]:
        if not Path(path).is_file():  # before minutes of model loading
            raise CodetoolError(f"PRM dataset not found: {path}. Build one with 'codetool build-trees' or pass "
                                "--dataset FILE.jsonl (PRM example rows).")
    from codetool.prm.rows import read_rows
    from codetool.tools.heldout import load_held_out

    rows = read_rows(cfg.dataset)  # before the model loads: a bad row is a one-line error at once
    eval_rows = read_rows(cfg.eval_dataset) if cfg.eval_dataset else None
    held = load_held_out(cfg.never_train_on)  # no test query in the training (or validation) rows
    rows, dropped = held.split_rows(rows)
    if eval_rows is not None:
        eval_rows, dropped_eval = held.split_rows(eval_rows)
        dropped += dropped_eval
    if dropped:
        logger.warning("dropped %d PRM rows of %d test queries (%s)", len(dropped),
                       len({str(r.get("query_id")) for r in dropped}), ", ".join(cfg.never_train_on))
    if not rows:
        raise CodetoolError(f"every row of {cfg.dataset} belongs to a test query of {cfg.never_train_on}; "
                            "build trees on training queries (build-trees leaves the test sets out).")
    set_seed(cfg.seed)
    logger.info("training on %d process(es), device %s", cfg.world_size, cfg.device)
    model, tokenizer = build_model(cfg, _load_dtype(cfg, cfg))  # after the args: ZeRO-3 loads it partitioned
    encoder = PromptEncoder(tokenizer, cfg.format, training=True)
    train_ds, eval_ds = _datasets(cfg, encoder, rows, eval_rows)
    if eval_ds is None and cfg.eval_strategy != "no":
        cfg.eval_strategy = "no"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    meta = {"base_model": cfg.model, "format": dataclasses.asdict(cfg.format), "seed": cfg.seed,
            "label_rules": _label_rules(rows),
            "test_rows_dropped": len(dropped), "test_queries_dropped": len({str(r.get("query_id")) for r in dropped}),
            "test_sets_unchecked": list(held.unchecked),
            "finetune": cfg.finetune, "split": {"eval_fraction": 0.0 if cfg.eval_dataset else cfg.eval_fraction,
                      "seed": cfg.split_seed, "eval_dataset": list(cfg.eval_dataset)},
            "codetool_version": __version__}
    return PRMTrainer(
        model=model, args=cfg, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tokenizer,
        data_collator=PRMCollator(encoder.label_ids, pad_id or 0), compute_metrics=_compute_metrics,
        prm_meta=meta)
