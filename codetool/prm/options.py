"""``PRMOptions``: the settings ``codetool train-prm`` declares itself, without TRL.

:class:`codetool.prm.config.PRMConfig` is TRL's ``SFTConfig`` composed with this class: the PRM's
own settings (``model``, ``dataset``, ``format``, LoRA, ``share_prefix``, ...) and the TRL fields
whose default differs for a PRM are declared here, once. Importing this module imports no torch,
TRL or transformers, so ``codetool train-prm --help`` lists these options in well under a second
(:data:`codetool.cli.LIGHT_HELP`); TRL's other options are listed by ``--help-all``. Checks that
need TRL's fields or torch (precision, the launcher) are ``PRMConfig``'s.

:data:`RENAMED` lists the keys of the pipeline's former ``TrainConfig`` section that 0.2.0 renamed,
only to refuse each with a line naming the new key (docs/MIGRATING.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codetool.config import option
from codetool.models.lora import LoRAGroup
from codetool.prm.format import PRMFormat

# 0.1 name -> the 0.2.0 key (or what replaced it); read only by codetool.config.renamed_error.
RENAMED = {"epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
           "eval_batch_size": "per_device_eval_batch_size", "lr_scheduler": "lr_scheduler_type",
           "warmup": "warmup_steps", "num_workers": "dataloader_num_workers",
           "trainer_options": "give its keys directly in train (optim: sgd, not trainer_options: {optim: sgd})"}


@dataclass
class PRMOptions(LoRAGroup):
    """The PRM's own settings of ``codetool train-prm`` and the TRL settings whose default differs
    for a PRM (see :class:`codetool.prm.config.PRMConfig`, which composes them with ``SFTConfig``)."""

    config_renamed = RENAMED  # not a field: read by codetool.config (YAML keys and --flags)

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
