"""The GPU check: PRM scoring, training, checkpoints and generation on one device, one JSON out.

    .venv/bin/python benchmarks/gpu_check.py --out reports/gpu_check     # on a GPU (make gpu-check)
    .venv/bin/python benchmarks/gpu_check.py --device cpu --tiny         # the same paths, CPU, < 1 min

Nothing is downloaded: models are randomly initialised Qwen2.5-shaped ``Qwen2ForCausalLM``s built
from configs (timings are honest, scores meaningless), with the embedded default model's
tokenizer (``make setup``), or a small tokenizer trained here when that is not cached. Sections,
each timed and recorded even when it fails:

1. ``env``: versions, device, a bf16 matmul.
2. ``scoring``: one search step at the paper's scale (CodeTool, Lu et al. 2025; issue 20):
   a 7B-shaped PRM in bf16, 16 candidates of ~100 tokens on a 1,500-token shared prefix;
   packed prefix sharing vs the trie vs one forward per candidate vs all 16 padded in one batch;
   speed-ups, the token-count bound, the largest score difference (bf16), and the same agreement
   in fp32 on the 0.5B shape; then ``LocalPRMScorer`` with ``share_prefix: auto``.
3. ``train_full``: a 0.5B-shaped PRM, full fine-tuning through the real ``codetool train-prm``
   entry point, with ``share_prefix`` packed and none on tree-shaped data (4 rows per query);
   tokens/s of each; the checkpoint is loaded and scores on the device.
4. ``train_lora``: a 7B-shaped PRM, LoRA r=16 with gradient checkpointing, ``share_prefix: auto``,
   through ``train-prm``; saved, loaded (adapter merged) and scored on the device.
5. ``generate``: the transformers backend generates on the device from the 0.5B checkpoint.
5b. ``policy_rl``: one GRPO step of ``codetool train-policy``'s trainer with the PRM as a step reward
   (a 0.5B-shaped policy with LoRA and a 0.5B-shaped PRM, both random, on the device): rollouts
   in the executor with simulated tools, on-the-spot + PRM + outcome rewards, process advantages.
6. ``fsdp`` (on a GPU when 90 s are left, or ``--fsdp yes``): ``accelerate launch`` with FSDP and
   one process, full fine-tuning with ``share_prefix: packed``. Accelerate's FSDP needs an
   accelerator: on CPU it fails ("no available devices"), so the CPU dry run skips it.

``--tiny`` swaps every shape for a 2-layer one (and short prompts). The check stops starting
sections after ``--budget-s`` and writes ``gpu_check.json`` in ``--out``; exit status 1 if a
section failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {  # Qwen2.5 configs (hidden, intermediate, layers, heads, kv heads, tied)
    "7b": (3584, 18944, 28, 28, 4, False),
    "0.5b": (896, 4864, 24, 14, 2, True),
    "tiny": (64, 128, 2, 4, 2, False),
}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str, repeats: int = 3) -> float:
    """Median seconds of ``fn()`` over ``repeats`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tokenizer(work: Path):
    """The default model's tokenizer, or a small byte-level BPE trained here (no download)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from codetool.models.loading import default_model_dir

    if (default_model_dir() / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(default_model_dir())
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from codetool.prm.synthetic import synthetic_rows

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    texts = [json.dumps(r) for r in synthetic_rows(20, steps=2, candidates=2)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                       "<|im_end|>"], show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return fast


def random_lm(shape: str, vocab: int, device: str, dtype):
    """A randomly initialised Qwen2.5-shaped causal LM on ``device`` (built there, no CPU copy)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    hidden, inter, layers, heads, kv, tied = SHAPES[shape]
    config = Qwen2Config(vocab_size=(vocab + 63) // 64 * 64, hidden_size=hidden, intermediate_size=inter,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                         max_position_embeddings=32768, tie_word_embeddings=tied, rope_theta=1e6,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def saved_model(shape: str, tok, work: Path, dtype) -> str:
    """A random model of ``shape`` saved with the tokenizer (what ``train-prm --model`` reads)."""
    out = work / f"base-{shape}"
    if not (out / "config.json").is_file():
        lm = random_lm(shape, len(tok), "cpu", dtype)
        lm.generation_config.pad_token_id = tok.pad_token_id
        lm.save_pretrained(out)
        tok.save_pretrained(out)
        del lm
    return str(out)


def section_env(args, ctx) -> dict:
    import accelerate
    import peft
    import torch
    import transformers
    import trl

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "trl": trl.__version__, "peft": peft.__version__, "accelerate": accelerate.__version__,
           "device": args.device, "cuda": torch.cuda.is_available()}
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    a = torch.randn(256, 256, device=args.device, dtype=torch.bfloat16)
    out["bf16_matmul_ok"] = bool(torch.isfinite(a @ a).all())
    return out


def _candidates(vocab: int, prefix_len: int, n: int, suffix_len: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(10, vocab - 10, (prefix_len,), generator=g).tolist()
    return [prefix + torch.randint(10, vocab - 10, (suffix_len + (i * 7) % 21 - 10,), generator=g).tolist()
            for i in range(n)]


def section_scoring(args, ctx) -> dict:
    import torch

    from codetool.prm.modeling import PRMModel

    device, tok = args.device, ctx["tok"]
    shape = "tiny" if args.tiny else "7b"
    prefix_len, suffix_len = (96, 16) if args.tiny else (1500, 100)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    lm = random_lm(shape, len(tok), device, dtype).eval()
    model = PRMModel(lm, (len(tok) - 2, len(tok) - 1)).to(device).eval()
    rows = _candidates(len(tok), prefix_len, 16, suffix_len)
    out = {"shape": shape, "dtype": str(dtype), "candidates": len(rows), "prefix_tokens": prefix_len,
           "suffix_tokens_mean": statistics.mean(len(r) - prefix_len for r in rows)}
    total = sum(map(len, rows))
    out["token_bound"] = round(total / (prefix_len + total - prefix_len * len(rows)), 2)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    def scores(mode):
        with torch.inference_mode():
            if mode == "per_candidate":
                logits = torch.cat([model.logits_of_rows([r], "none") for r in rows])
            else:
                logits = model.logits_of_rows(rows, "none" if mode == "padded" else mode)
        return torch.softmax(logits, -1)[:, 0]

    ms, got = {}, {}
    for mode in ("packed", "trie", "per_candidate", "padded"):
        ms[mode] = round(_timed(lambda m=mode: scores(m), device, repeats=1 if args.tiny else 3) * 1e3, 1)
        got[mode] = scores(mode)
    out["ms"] = ms
    out["speedup_packed_vs_per_candidate"] = round(ms["per_candidate"] / ms["packed"], 2)
    out["speedup_packed_vs_padded"] = round(ms["padded"] / ms["packed"], 2)
    out["speedup_trie_vs_per_candidate"] = round(ms["per_candidate"] / ms["trie"], 2)
    out["max_score_diff_vs_per_candidate"] = {m: float((got[m] - got["per_candidate"]).abs().max())
                                              for m in ("packed", "trie", "padded")}
    out["auto_picks"] = model.pick_share_mode(*_padded(rows, device))
    if device.startswith("cuda"):
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    model = lm = None  # free the 7B shape before the next
    _free(device)
    small = random_lm("tiny" if args.tiny else "0.5b", len(tok), device, torch.float32).eval()  # fp32 agreement
    model = PRMModel(small, (len(tok) - 2, len(tok) - 1)).to(device).eval()
    with torch.inference_mode():
        exact = torch.cat([model.logits_of_rows([r], "none") for r in rows])
        packed = model.logits_of_rows(rows, "packed")
    out["fp32_max_score_diff_packed"] = float((torch.softmax(packed, -1) - torch.softmax(exact, -1)).abs().max())
    model = small = None
    _free(device)
    return out


def _padded(rows, device):
    import torch

    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)
    return ids, torch.tensor([len(r) - 1 for r in rows], device=device)


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _train(args, ctx, name: str, base: str, extra: list[str]) -> dict:
    """``codetool train-prm`` in this process (the real entry point); returns its summary + tokens/s."""
    from codetool.cli import main

    out = ctx["work"] / name
    command = ["train-prm", "--model", base, "--dataset", str(ctx["data"]), "--output_dir", str(out),
               "--eval_fraction", "0", "--resume", "none", "--save_steps", "100000", "--logging_steps", "1000",
               "--format.max_length", str(ctx["max_length"]), "--format.max_suffix_length", "128",
               "--report_to", "none", "--warmup_steps", "0"] + extra
    status = main(command)
    if status != 0:
        raise RuntimeError(f"train-prm exited {status}")
    summary = json.loads((out / "train_summary.json").read_text())
    rows = int(summary["steps"]) * int(extra[extra.index("--per_device_train_batch_size") + 1])
    summary["tokens_per_s"] = round(rows * ctx["row_tokens"] / summary["seconds"], 1)  # mean row length x rows
    summary["output_dir"] = str(out)
    return summary


def _score_checkpoint(args, ctx, folder: str) -> dict:
    from codetool.prm.format import item_from_row
    from codetool.prm.scorer import LocalPRMScorer

    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    scorer = LocalPRMScorer.from_checkpoint(folder, device=args.device, dtype=dtype)
    scores = scorer.score([item_from_row(r) for r in ctx["rows"][:8]])
    ok = all(0.0 <= s <= 1.0 for s in scores)
    device = str(next(scorer.model.parameters()).device)
    del scorer
    _free(args.device)
    if not ok:
        raise RuntimeError(f"scores out of [0, 1]: {scores}")
    return {"scored_on": device, "scores": [round(s, 4) for s in scores[:4]]}


def section_train_full(args, ctx) -> dict:
    import torch

    base = saved_model("tiny" if args.tiny else "0.5b", ctx["tok"], ctx["work"], torch.float32)
    ctx["base_small"] = base
    steps = "2" if args.tiny else "12"
    out = {}
    for mode in ("packed", "none"):
        out[mode] = _train(args, ctx, f"full-{mode}", base, ["--finetune", "full", "--per_device_train_batch_size", "8",
                                                             "--max_steps", steps, "--share_prefix", mode,
                                                             "--learning_rate", "1e-5"])
    out["speedup_packed_vs_none"] = round(out["packed"]["tokens_per_s"] / out["none"]["tokens_per_s"], 2)
    out["load_and_score"] = _score_checkpoint(args, ctx, out["packed"]["output_dir"])
    ctx["full_dir"] = out["packed"]["output_dir"]
    return out


def section_train_lora(args, ctx) -> dict:
    import torch

    base = saved_model("tiny" if args.tiny else "7b", ctx["tok"], ctx["work"], torch.bfloat16)
    out = _train(args, ctx, "lora", base, ["--finetune", "lora", "--lora_r", "16", "--lora_alpha", "32",
                                           "--per_device_train_batch_size", "4", "--max_steps", "2" if args.tiny else "6",
                                           "--gradient_checkpointing", "true", "--share_prefix", "auto"])
    if args.device.startswith("cuda"):
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    out["load_and_score"] = _score_checkpoint(args, ctx, out["output_dir"])
    return out


def section_generate(args, ctx) -> dict:
    from codetool.models.backends import make_backend
    from codetool.models.spec import ModelSpec

    folder = ctx.get("full_dir") or ctx["base_small"]
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    backend = make_backend(ModelSpec.parse(str(folder), dtype=dtype, device=args.device))
    start = time.perf_counter()
    [completions] = backend.generate([[{"role": "user", "content": "Say hi."}]], n=2, temperature=0.9,
                                     max_new_tokens=16, seed=0)
    return {"completions": len(completions), "tokens": sum(c.completion_tokens for c in completions),
            "seconds": round(time.perf_counter() - start, 2), "device": str(getattr(backend, "device", args.device))}


def section_fsdp(args, ctx) -> dict:
    out = ctx["work"] / "fsdp"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--use_fsdp",
               "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--mixed_precision",
               "bf16" if args.device.startswith("cuda") else "no", "-m", "codetool.cli", "train-prm",
               "--model", ctx.get("base_small") or saved_model("tiny" if args.tiny else "0.5b", ctx["tok"], ctx["work"], _fp32()), "--dataset", str(ctx["data"]), "--output_dir", str(out),
               "--finetune", "full", "--max_steps", "2", "--per_device_train_batch_size", "4", "--eval_fraction", "0",
               "--resume", "none", "--format.max_length", str(ctx["max_length"]), "--format.max_suffix_length", "128",
               "--share_prefix", "packed"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=max(ctx["left"](), 30))
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()][:6]
        raise RuntimeError(f"accelerate launch exited {done.returncode}: " + " | ".join(errors))
    return {"seconds": round(time.perf_counter() - start, 1), "saved": (out / "prm_config.json").is_file()}


def _policy_tasks() -> dict:
    """Two made-up queries with simulated tools (no benchmark files needed)."""
    from codetool.search.search import SearchTask
    from codetool.tools.backends import make_tool_backend
    from codetool.tools.environment import ToolEnvironment
    from codetool.tools.spec import APISpec, Parameter

    backend = make_tool_backend("simulator")
    tasks = {}
    for i, (tool, city) in enumerate([("weather", "Paris"), ("forecast", "Lima")]):
        api = APISpec("Weather", tool, "current", "Current weather of a city.",
                      [Parameter("city", required=True, description="city name")],
                      template_response={"city": "str", "temperature_c": "int"})
        env = ToolEnvironment([api], backend, render_style="brief")
        tasks[f"check/{tool}/{i}"] = SearchTask(query_id=str(i), query=f"What is the weather in {city}?", env=env,
                                                benchmark="check")
    return tasks


def section_policy_rl(args, ctx) -> dict:
    """One GRPO step of ``codetool train-policy``'s trainer with the PRM as a step reward: a random
    Qwen2.5-shaped policy (LoRA) and PRM on the device, rollouts in the executor, process advantages."""
    import torch

    from codetool.config import load_config
    from codetool.policy.config import TrainPolicyConfig
    from codetool.policy.train import train_run
    from codetool.prm.folder import new_prm
    from codetool.prm.format import PRMFormat
    from codetool.prm.scorer import LocalPRMScorer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cuda = args.device.startswith("cuda")
    base = ctx.get("base_small") or saved_model("tiny" if args.tiny else "0.5b", ctx["tok"], ctx["work"], _fp32())
    fmt = PRMFormat(max_length=ctx["max_length"], max_suffix_length=128)
    prm, prm_tok = new_prm(base, fmt, dtype="bfloat16" if cuda else "float32", device=args.device)
    scorer = LocalPRMScorer(prm, prm_tok, fmt)
    cfg = load_config(TrainPolicyConfig, None, {
        "policy": base, "output_dir": str(ctx["work"] / "policy-rl"), "max_steps": 1, "num_generations": 2,
        "per_device_train_batch_size": 2, "save_steps": 10**6, "learning_rate": 1e-4, "prompts": [
            {"benchmark": "restbench-tmdb"}], "evals": [], "never_train_on": [], "prm": "given",
        "settings": [{"name": "outcome+spot+prm", "grounded": 1.0, "on_the_spot": 0.5, "prm": 0.5}],
        "rollout": {"max_steps": 2, "max_new_tokens": 16, "constrain": "line"}, "executor": {"timeout_s": 10}})
    run = cfg.run_config(cfg.run_settings[0], 0, cfg.output_dir)
    start = time.perf_counter()
    summary = train_run(run, _policy_tasks(), scorer=scorer, prm_name="random Qwen2.5-shaped PRM")
    seconds = time.perf_counter() - start
    if summary["steps"] != 1 or not summary["curve"]:
        raise RuntimeError(f"GRPO ran {summary['steps']} steps and logged {len(summary['curve'])} points")
    out = {"seconds": round(seconds, 1), "steps": summary["steps"], "generated_tokens": summary["generated_tokens"],
           "reward": summary["curve"][-1]["reward"], "prm_reward": summary["curve"][-1].get("prm"),
           "timing": summary["timing"], "prm_on": str(next(prm.parameters()).device)}
    if cuda:
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return out


SECTIONS = [("env", section_env), ("scoring", section_scoring), ("train_full", section_train_full),
            ("train_lora", section_train_lora), ("generate", section_generate), ("policy_rl", section_policy_rl),
            ("fsdp", section_fsdp)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="2-layer shapes and short prompts (CI, CPU)")
    parser.add_argument("--out", default="reports/gpu_check", help="folder of gpu_check.json")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no section after this many seconds")
    parser.add_argument("--fsdp", choices=("auto", "yes", "no"), default="auto",
                        help="auto: on a GPU when at least 90 s are left")
    parser.add_argument("--only", nargs="*", help="run only these sections (env always runs)")
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    import torch

    logging.basicConfig(level=logging.WARNING)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; pass --device cpu --tiny for the CPU dry run.")
    start = time.perf_counter()
    report: dict = {"device": args.device, "tiny": args.tiny, "sections": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        from codetool.jsonl import write_jsonl
        from codetool.prm.format import PRMFormat, PromptEncoder, item_from_row
        from codetool.prm.synthetic import synthetic_rows

        work = Path(tmp)
        tok = tokenizer(work)
        rows = synthetic_rows(16 if args.tiny else 64, steps=2, candidates=4, extra_tools=0 if args.tiny else 3)
        max_length = 384 if args.tiny else 2048
        probe = PromptEncoder(_with_labels(tok, work), PRMFormat(max_length=max_length, max_suffix_length=128))
        row_tokens = statistics.mean(len(probe.encode(item_from_row(r)).input_ids) + 1 for r in rows)
        write_jsonl(work / "rows.jsonl", rows)
        ctx = {"tok": tok, "work": work, "rows": rows, "data": work / "rows.jsonl", "max_length": max_length,
               "row_tokens": row_tokens, "left": lambda: args.budget_s - (time.perf_counter() - start)}
        report["data"] = {"rows": len(rows), "rows_per_query": 8, "mean_row_tokens": round(row_tokens, 1)}
        for name, fn in SECTIONS:
            if args.only and name != "env" and name not in args.only:
                continue
            if name == "fsdp" and (args.fsdp == "no" or (args.fsdp == "auto" and (
                    not args.device.startswith("cuda") or ctx["left"]() < 90))):
                report["sections"][name] = {"ok": None, "skipped": "FSDP needs a GPU (accelerate finds no CPU "
                                            "device for it) and 90 s left; --fsdp yes forces it"}
                continue
            if ctx["left"]() <= 0:
                report["sections"][name] = {"ok": None, "skipped": "time budget spent"}
                continue
            t0 = time.perf_counter()
            try:
                result = {"ok": True, **fn(args, ctx)}
            except Exception as e:  # recorded, and the next section still runs
                result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                          "traceback": traceback.format_exc()[-3000:]}
            result["seconds"] = round(time.perf_counter() - t0, 1)
            report["sections"][name] = result
            print(f"[gpu_check] {name}: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s", flush=True)
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["ok"] = all(s.get("ok") is not False for s in report["sections"].values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "sections"}
                     | {"sections": {k: v.get("ok") for k, v in report["sections"].items()}}))
    return 0 if report["ok"] else 1


def _fp32():
    import torch

    return torch.float32


def _with_labels(tok, work: Path):
    """A copy of the tokenizer with the label tokens (for counting prompt tokens only)."""
    from transformers import AutoTokenizer

    from codetool.prm.format import PRMFormat
    from codetool.prm.modeling import add_label_tokens

    tok.save_pretrained(work / "tok-probe")
    probe = AutoTokenizer.from_pretrained(work / "tok-probe")
    add_label_tokens(None, probe, PRMFormat())
    return probe


if __name__ == "__main__":
    raise SystemExit(main())
