"""Decoding speed of the transformers backend on the default model: one batched call vs many calls.

Measures, with SmolLM2-135M-Instruct (``codetool setup`` first) on the CPU:

1. n=4 samples of one prompt in one ``generate`` call vs 4 calls of n=1 (same prompt, sampling);
2. 8 different prompts in one call vs 8 calls (greedy);
3. n=4 samples of a long (~1,000-token) prompt with the shared prefill on vs off.

Tokens/s counts completion tokens (what ``Completion.completion_tokens`` reports) over wall time.
Timings share the CPU with whatever else runs, so expect noise of 10-20 %. On a busy machine pass
``--threads 1``: with other processes on the cores, torch's two OpenMP threads wait on each other
(measured at load average ~8 on 2 cores: n=4 in one call 0.9 tokens/s with 2 threads, 9.2 with 1).

Command (from the repository root):

    .venv/bin/python benchmarks/bench_generation.py [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from _result import emit  # benchmarks/_result.py

from codetool.models.backends import TransformersBackend

PROMPT = "Write a Python function that checks whether a number is prime, and explain it."
PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Explain what a REST API is in three sentences.",
    "Write Python code that counts the words in a text file.",
    "What is the capital of France? Explain its history briefly.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five uses of the requests library in Python.",
    "Write a Python snippet that sorts a list of dictionaries by a key.",
    "Describe how a hash map works.",
]


def timed(fn):
    start = time.perf_counter()
    results = fn()
    seconds = time.perf_counter() - start
    tokens = sum(c.completion_tokens for row in results for c in row)
    return tokens, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    backend = TransformersBackend("default", max_batch_size=8)
    m = args.max_new_tokens
    backend.generate(["warm up"], max_new_tokens=4)
    sample = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": m}
    long_prompt = "Here are the tools you can use.\n" + "\n".join(
        f"def tool_{i}(query: str, limit: int = 10) -> dict:\n    '''Search service {i} for items matching "
        f"the query and return at most limit results as JSON.'''" for i in range(30)) + "\n\n" + PROMPT

    prompt_len = len(backend.encode(long_prompt))

    def without_sharing():
        backend.share_prefill = False
        try:
            return backend.generate([long_prompt], n=4, seed=0, **sample)
        finally:
            backend.share_prefill = True

    cases = [
        ("n=4 samples, one call", lambda: backend.generate([PROMPT], n=4, seed=0, **sample)),
        ("n=4 samples, 4 calls", lambda: [backend.generate([PROMPT], n=1, seed=i, **sample)[0] for i in range(4)]),
        ("8 prompts, one call", lambda: backend.generate(PROMPTS, max_new_tokens=m)),
        ("8 prompts, 8 calls", lambda: [backend.generate([p], max_new_tokens=m)[0] for p in PROMPTS]),
        (f"n=4, {prompt_len}-token prompt, shared prefill", lambda: backend.generate([long_prompt], n=4, seed=0, **sample)),
        (f"n=4, {prompt_len}-token prompt, prefill x4", without_sharing),
    ]
    print(f"SmolLM2-135M-Instruct, fp32, CPU, {torch.get_num_threads()} threads, max_new_tokens={m}")
    print(f"{'case':<46} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}", flush=True)
    speed = []
    for name, fn in cases:
        tokens, seconds = timed(fn)
        speed.append((tokens / seconds, seconds))
        print(f"{name:<46} {tokens:>7} {seconds:>8.2f} {tokens / seconds:>9.1f}", flush=True)
    print(f"speed-up n=4 one call vs 4 calls: {speed[0][0] / speed[1][0]:.2f}x; 8 prompts batched vs 8 calls: "
          f"{speed[2][0] / speed[3][0]:.2f}x; shared prefill (wall time): {speed[5][1] / speed[4][1]:.2f}x")
    emit(n4_tokens_per_s=speed[0][0], n4_baseline_tokens_per_s=speed[1][0], n4_speedup=speed[0][0] / speed[1][0],
         batch_speedup=speed[2][0] / speed[3][0], prefill_speedup=speed[5][1] / speed[4][1])


if __name__ == "__main__":
    main()
