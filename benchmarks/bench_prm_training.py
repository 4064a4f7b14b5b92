"""Benchmark: PRM training throughput, our trainer vs plain TRL SFTTrainer (issue 7, perf. (b)).

    .venv/bin/python benchmarks/bench_prm_training.py [--model default] [--steps 5] [--warmup 2]
        [--batch-size 4] [--threads 0] [--sft-defaults] [--data PRM_EXAMPLES.jsonl]

Both train the default model (SmolLM2-135M-Instruct, float32, CPU) with LoRA r=8 on all linear
layers, on the same quickstart-format rows (synthetic PRM examples rendered by
``codetool.prm.format``, ~400 tokens each; 4 per query: 2 steps x 2 candidates), with the same
batch size (4 rows):

- ``SFTTrainer`` (baseline): prompt/completion rows, the completion being the label token,
  ``completion_only_loss``; the two new label tokens must be learnable, so the embedding matrix
  and LM head are trained as ``modules_to_save`` (tied, with ``ensure_weight_tying``), with Adam
  state for the whole embedding matrix; TRL's fused LM head (TRL >= 1.x) projects only the labelled
  position onto the full vocabulary. SFTConfig turns on bf16 autocast and gradient
  checkpointing by default; both are turned off here, as in ours, unless ``--sft-defaults``
  (measured here: bf16 autocast on this AVX2 CPU falls back to a reference GEMM, ~170 s a step).
- ``PRMTrainer`` (ours, ``codetool train-prm``): the hidden state of the label position only,
  projected on the two label rows (a trainable (2, hidden) head), cross-entropy over two logits;
  siblings (the candidates of one step) are batched together and run their shared prefix once
  (``share_prefix``: ``auto``, the default, times the modes on the first batch and keeps the
  fastest). Also measured with each mode forced (none, packed, trie), to show what each gives.

Each runs in its own process (so peak memory is its own). Throughput = prompt tokens per second
of optimizer steps after ``--warmup`` steps (median step time); peak memory = the process's
maximum resident set, and how much of it training added on top of the loaded model.
The machine is shared by other jobs, so timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py


class _Timer:
    """Trainer callback: seconds of each optimizer step."""

    def __init__(self):
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                outer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                outer.steps.append(time.perf_counter() - outer.start)
                print(f"step {state.global_step}: {outer.steps[-1]:.1f} s", file=sys.stderr, flush=True)

        self.steps: list[float] = []
        self.callback = Callback()


class _CountingCollator:
    """Wraps a collator and records the real (non-pad) tokens of every batch."""

    def __init__(self, inner):
        self.inner, self.tokens = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        self.tokens.append(sum(len(f["input_ids"]) for f in features))
        return batch


def _rows(model: str, n_queries: int, data: str | None = None):
    from transformers import AutoTokenizer

    from codetool.models.loading import resolve_model
    from codetool.prm.format import PRMFormat, PromptEncoder, item_from_row
    from codetool.prm.modeling import add_label_tokens
    from codetool.prm.synthetic import synthetic_rows

    fmt = PRMFormat(max_length=1024, max_suffix_length=256)
    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    add_label_tokens(None, tok, fmt)  # the tokenizer only: no second model in this process
    encoder = PromptEncoder(tok, fmt)
    if data:
        from codetool.prm.rows import read_rows

        rows = read_rows(data)
    else:
        rows = synthetic_rows(n_queries, steps=2, candidates=2)
    return rows, fmt, encoder, [item_from_row(r) for r in rows]


def run_ours(args, out: Path, share_prefix: str = "auto") -> dict:
    from codetool.config import load_config
    from codetool.jsonl import write_jsonl
    from codetool.prm.trainer import PRMConfig, build_trainer

    rows, fmt, _, _ = _rows(args.model, args.queries, args.data)
    write_jsonl(out / "rows.jsonl", rows)
    cfg = load_config(PRMConfig, None, {
        "model": args.model, "dataset": [str(out / "rows.jsonl")], "output_dir": str(out / "ours"),
        "format.max_length": fmt.max_length, "format.max_suffix_length": fmt.max_suffix_length,
        "eval_fraction": 0.0, "max_steps": _max_steps(args), "num_train_epochs": 1.0, "per_device_train_batch_size": args.batch_size,
        "save_steps": 10_000, "logging_steps": 1000, "lora_r": 8, "resume": "none", "precision": "fp32",
        "share_prefix": share_prefix})
    trainer = build_trainer(cfg)
    result = _measure(trainer, args)
    result["share_mode"] = trainer.model.share_mode or trainer.share_prefix
    return result


def run_sft(args, out: Path) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from codetool.models.loading import load_model
    from codetool.prm.modeling import add_label_tokens

    rows, fmt, encoder, items = _rows(args.model, args.queries, args.data)
    model, tok = load_model(args.model, dtype="float32", device="cpu", for_training=True)
    add_label_tokens(model, tok, fmt)
    label_text = fmt.label_tokens
    data = Dataset.from_list([{"prompt": encoder.render_text(item), "completion": label_text[1 - r["label"]]}
                              for item, r in zip(items, rows)])
    config = SFTConfig(output_dir=str(out / "sft"), max_steps=_max_steps(args), num_train_epochs=1,
                       per_device_train_batch_size=args.batch_size, learning_rate=2e-4, logging_steps=1000,
                       save_strategy="no", report_to="none", max_length=fmt.max_length, completion_only_loss=True,
                       train_sampling_strategy="group_by_length", use_cpu=True, dataloader_pin_memory=False,
                       dataset_num_proc=None,
                       # SFTConfig's defaults are bf16 autocast and gradient checkpointing; ours trains in fp32
                       # without checkpointing, so the baseline does too unless --sft-defaults
                       **({} if args.sft_defaults else {"bf16": False, "gradient_checkpointing": False}))
    peft = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM",
                      modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True)
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tok, peft_config=peft)
    return _measure(trainer, args)


RUNS = {"sft": ("SFTTrainer (baseline)", run_sft),
        "ours-unshared": ("PRMTrainer, no sharing", lambda args, out: run_ours(args, out, share_prefix="none")),
        "ours-packed": ("PRMTrainer, packed", lambda args, out: run_ours(args, out, share_prefix="packed")),
        "ours-trie": ("PRMTrainer, trie", lambda args, out: run_ours(args, out, share_prefix="trie")),
        "ours": ("PRMTrainer (auto)", run_ours)}


def _max_steps(args) -> int:
    return args.warmup + args.steps if args.steps > 0 else -1


def _measure(trainer, args) -> dict:
    timer = _Timer()
    trainer.add_callback(timer.callback)
    counter = _CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    before_mb = _rss_mb()
    trainer.train()
    if args.steps > 0:  # median step after warm-up: robust to a slow outlier
        measured = timer.steps[args.warmup:]
        tokens_per_step = statistics.mean(counter.tokens)
        tokens_per_s = tokens_per_step / statistics.median(measured)
    else:  # one epoch: every batch once, the same rows for every trainer, whatever their order
        measured = timer.steps
        tokens_per_step = statistics.mean(counter.tokens)
        tokens_per_s = sum(counter.tokens) / sum(measured)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens_per_s": tokens_per_s, "step_s": statistics.median(measured),
            "tokens_per_step": tokens_per_step, "peak_rss_mb": peak_mb, "train_mb": peak_mb - before_mb,
            "trainable": trainable}


def _rss_mb() -> float:
    """Current resident set of this process, MB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--steps", type=int, default=5,
                        help="measured optimizer steps; 0: one epoch, all steps timed (for --data)")
    parser.add_argument("--warmup", type=int, default=2, help="steps not measured")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--queries", type=int, default=40, help="synthetic queries (4 rows each)")
    parser.add_argument("--data", help="PRM example JSONL from `codetool build-trees` instead of synthetic rows "
                                       "(e.g. runs/quickstart/trees/prm_dataset/prm_examples.jsonl)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--sft-defaults", action="store_true",
                        help="keep SFTConfig's defaults: bf16 autocast (very slow on CPUs without bf16 "
                             "matmul) and gradient checkpointing")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS),
                        help="which trainers to measure (sft is the baseline and always runs)")
    parser.add_argument("--only", choices=list(RUNS), help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.only:
        import torch

        os.environ.setdefault("WANDB_MODE", "disabled")
        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            result = RUNS[args.only][1](args, Path(tmp))
        print("RESULT " + json.dumps(result))
        return
    results = {}
    runs = ["sft"] + [r for r in args.runs if r != "sft"]
    for which in runs:
        command = [sys.executable, __file__, "--only", which] + [a for a in _without_runs(sys.argv[1:])]
        print(f"running {which} ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)  # its stderr shows the steps
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{which} failed (exit {done.returncode}); its log is above")
        results[which] = json.loads(lines[-1][len("RESULT "):])
    base = results["sft"]["tokens_per_s"]
    print(f"model {args.model}, data {args.data or 'synthetic'}, LoRA r=8, batch {args.batch_size}, {args.steps} measured steps after {args.warmup}; "
          f"SFTTrainer {'with SFTConfig defaults (bf16, checkpointing)' if args.sft_defaults else 'fp32, no checkpointing'}"
          f", ours fp32, no checkpointing")
    print(f"\n{'trainer':<24}{'tokens/s':>9}{'speed-up':>10}{'s/step':>8}{'tokens/step':>12}"
          f"{'trainable':>12}{'peak RSS MB':>12}{'+ in training':>14}")
    for which in runs:
        name, r = RUNS[which][0], results[which]
        name = f"{name} [{r['share_mode']}]" if which == "ours" else name
        print(f"{name:<24}{r['tokens_per_s']:>9.1f}{r['tokens_per_s'] / base:>9.2f}x{r['step_s']:>8.1f}"
              f"{r['tokens_per_step']:>12.0f}{r['trainable']:>12,}{r['peak_rss_mb']:>12.0f}{r['train_mb']:>14.0f}")
    ours = results.get("ours") or results[runs[-1]]
    emit(tokens_per_s=ours["tokens_per_s"], baseline_tokens_per_s=base, speedup=ours["tokens_per_s"] / base,
         peak_rss_mb=ours["peak_rss_mb"], baseline_peak_rss_mb=results["sft"]["peak_rss_mb"])


def _without_runs(argv: list[str]) -> list[str]:
    """The parent's arguments minus ``--runs ...`` (a child measures one trainer)."""
    out, skipping = [], False
    for a in argv:
        if a == "--runs":
            skipping = True
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


if __name__ == "__main__":
    main()
