"""Benchmark: PRM training throughput, our trainer vs plain TRL SFTTrainer (issue 7, perf. (b)).

    .venv/bin/python benchmarks/bench_prm_training.py [--model default] [--steps 6] [--warmup 2]
        [--batch-size 2] [--threads 0]

Both train the default model (SmolLM2-135M-Instruct, float32, CPU) with LoRA r=8 on all linear
layers, on the same quickstart-format rows (synthetic PRM examples rendered by
``codetool.prm.format``, ~400 tokens each), with the same batch size and length-grouped batches:

- ``SFTTrainer`` (baseline): prompt/completion rows, the completion being the label token,
  ``completion_only_loss``; the two new label tokens must be learnable, so the embedding matrix
  and LM head are trained as ``modules_to_save`` (tied, with ``ensure_weight_tying``); logits over
  the whole vocabulary at every position.
- ``PRMTrainer`` (ours, ``codetool train-prm``): the hidden state of the label position only,
  projected on the two label rows (a trainable (2, hidden) head), cross-entropy over two logits.

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


def _rows(model: str, n_queries: int):
    from transformers import AutoTokenizer

    from codetool.models.loading import resolve_model
    from codetool.prm.format import PRMFormat, PromptEncoder, item_from_row
    from codetool.prm.modeling import add_label_tokens
    from codetool.prm.synthetic import synthetic_rows

    fmt = PRMFormat(max_length=1024, max_suffix_length=256)
    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    add_label_tokens(None, tok, fmt)  # the tokenizer only: no second model in this process
    encoder = PromptEncoder(tok, fmt)
    rows = synthetic_rows(n_queries, steps=2, candidates=2)
    return rows, fmt, encoder, [item_from_row(r) for r in rows]


def run_ours(args, out: Path) -> dict:
    from codetool.config import load_config
    from codetool.jsonl import write_jsonl
    from codetool.prm.train import TrainConfig, build_trainer

    rows, fmt, _, _ = _rows(args.model, args.queries)
    write_jsonl(out / "rows.jsonl", rows)
    cfg = load_config(TrainConfig, None, {
        "model": args.model, "dataset": [str(out / "rows.jsonl")], "output_dir": str(out / "ours"),
        "format.max_length": fmt.max_length, "format.max_suffix_length": fmt.max_suffix_length,
        "eval_fraction": 0.0, "max_steps": args.warmup + args.steps, "batch_size": args.batch_size,
        "save_steps": 10_000, "logging_steps": 1000, "lora_r": 8, "resume": "none", "precision": "fp32"})
    trainer = build_trainer(cfg)
    return _measure(trainer, args)


def run_sft(args, out: Path) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from codetool.models.loading import load_model
    from codetool.prm.modeling import add_label_tokens

    rows, fmt, encoder, items = _rows(args.model, args.queries)
    model, tok = load_model(args.model, dtype="float32", device="cpu", for_training=True)
    add_label_tokens(model, tok, fmt)
    label_text = fmt.label_tokens
    data = Dataset.from_list([{"prompt": encoder.render_text(item), "completion": label_text[1 - r["label"]]}
                              for item, r in zip(items, rows)])
    config = SFTConfig(output_dir=str(out / "sft"), max_steps=args.warmup + args.steps,
                       per_device_train_batch_size=args.batch_size, learning_rate=2e-4, logging_steps=1000,
                       save_strategy="no", report_to="none", max_length=fmt.max_length, completion_only_loss=True,
                       train_sampling_strategy="group_by_length", use_cpu=True, dataloader_pin_memory=False,
                       dataset_num_proc=None)
    peft = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM",
                      modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True)
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tok, peft_config=peft)
    return _measure(trainer, args)


def _measure(trainer, args) -> dict:
    timer = _Timer()
    trainer.add_callback(timer.callback)
    counter = _CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    before_mb = _rss_mb()
    trainer.train()
    measured = timer.steps[args.warmup:]
    tokens_per_step = statistics.mean(counter.tokens)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"tokens_per_s": tokens_per_step / statistics.median(measured), "step_s": statistics.median(measured),
            "tokens_per_step": tokens_per_step, "peak_rss_mb": peak_mb, "train_mb": peak_mb - before_mb,
            "trainable": trainable}


def _rss_mb() -> float:
    """Current resident set of this process, MB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--steps", type=int, default=6, help="measured optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="steps not measured")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--queries", type=int, default=40, help="synthetic queries (4 rows each)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--only", choices=["ours", "sft"], help=argparse.SUPPRESS)  # one child process
    args = parser.parse_args()
    if args.only:
        import torch

        os.environ.setdefault("WANDB_MODE", "disabled")
        if args.threads:
            torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            result = (run_ours if args.only == "ours" else run_sft)(args, Path(tmp))
        print("RESULT " + json.dumps(result))
        return
    results = {}
    for which in ("sft", "ours"):
        command = [sys.executable, __file__, "--only", which] + [
            a for a in sys.argv[1:] if a not in ("--only", which)]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{which} failed:\n{done.stderr[-3000:]}")
        results[which] = json.loads(lines[-1][len("RESULT "):])
    base = results["sft"]["tokens_per_s"]
    print(f"model {args.model}, LoRA r=8, batch {args.batch_size}, {args.steps} measured steps after {args.warmup}")
    print(f"\n{'trainer':<24}{'tokens/s':>9}{'speed-up':>10}{'s/step':>8}{'tokens/step':>12}"
          f"{'trainable':>12}{'peak RSS MB':>12}{'+ in training':>14}")
    for which, name in (("sft", "SFTTrainer (baseline)"), ("ours", "PRMTrainer (ours)")):
        r = results[which]
        print(f"{name:<24}{r['tokens_per_s']:>9.1f}{r['tokens_per_s'] / base:>9.2f}x{r['step_s']:>8.1f}"
              f"{r['tokens_per_step']:>12.0f}{r['trainable']:>12,}{r['peak_rss_mb']:>12.0f}{r['train_mb']:>14.0f}")
    emit(tokens_per_s=results["ours"]["tokens_per_s"], baseline_tokens_per_s=base,
         speedup=results["ours"]["tokens_per_s"] / base, peak_rss_mb=results["ours"]["peak_rss_mb"],
         baseline_peak_rss_mb=results["sft"]["peak_rss_mb"])


if __name__ == "__main__":
    main()
