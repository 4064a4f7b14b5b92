"""CPU time of the default model's forward passes with torch's OpenMP threads spinning vs sleeping.

``codetool`` sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it (``codetool/cli.py``):
a waiting OpenMP thread then sleeps instead of spinning. On a machine whose cores other processes
share, a spinning thread burns its core while its partner waits to be scheduled, at every parallel
region, and a decoding step of a small model is hundreds of small ones. This script runs the same
forward passes (a decoding step of 16 rows over a ~700-token KV cache, and a 700-token prefill) in
two fresh processes, one with the variable unset (libgomp's default) and one with ``PASSIVE``, and
prints the CPU seconds and wall seconds per pass of each, with the load average. Both processes
compute the same numbers (the check compares their logits).

Measured (docs/TESTBED.md 5.1) on the shared 2-core development machine at load 5-9: 3-4x the CPU
time per decoding step with spinning threads.

Command (from the repository root; ``codetool setup`` first):

    .venv/bin/python benchmarks/bench_openmp_wait.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _result import emit  # benchmarks/_result.py

CHILD = r"""
import json, sys, time
import torch
from codetool.models.kv import cache_kwargs, output_cache
from codetool.models.loading import load_model
model, _ = load_model("default", dtype="float32")
repeats = int(sys.argv[1])
out = {"threads": torch.get_num_threads()}
with torch.inference_mode():
    prompt = torch.randint(0, 1000, (16, 700), generator=torch.Generator().manual_seed(0))
    cache = output_cache(model(input_ids=prompt, use_cache=True, logits_to_keep=1))
    step = torch.randint(0, 1000, (16, 1), generator=torch.Generator().manual_seed(1))
    for name, run in (("decode_16x1", lambda: model(input_ids=step, **cache_kwargs(cache), use_cache=True)),
                      ("prefill_1x700", lambda: model(input_ids=prompt[:1], logits_to_keep=1))):
        logits = run().logits  # warm up
        cache.crop(700 - cache.get_seq_length())
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(repeats):
            run()
            if name.startswith("decode"):
                cache.crop(700 - cache.get_seq_length())  # back to the prompt (a negative count)
        out[name] = {"cpu_s": (time.process_time() - cpu) / repeats, "wall_s": (time.perf_counter() - wall) / repeats,
                     "logits_sum": float(logits.double().sum())}
print(json.dumps(out))
"""


def child(policy: str | None, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", CHILD, str(repeats)], env=env, cwd=root, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"the child process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    spin, sleep = child(None, args.repeats), child("PASSIVE", args.repeats)
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}; torch threads {spin['threads']}")
    print(f"{'pass':<16}{'spinning cpu/wall s':>22}{'sleeping cpu/wall s':>22}{'cpu ratio':>11}")
    for name in ("decode_16x1", "prefill_1x700"):
        a, b = spin[name], sleep[name]
        print(f"{name:<16}{a['cpu_s']:>12.3f}/{a['wall_s']:<9.3f}{b['cpu_s']:>12.3f}/{b['wall_s']:<9.3f}"
              f"{a['cpu_s'] / b['cpu_s']:>11.1f}")
        assert a["logits_sum"] == b["logits_sum"], "the two processes computed different logits"
    emit(load=load, threads=spin["threads"], **{f"{n}_{k}_{w}": r[n][f"{k}_s"] for n in ("decode_16x1", "prefill_1x700")
                                                for w, r in (("spin", spin), ("sleep", sleep)) for k in ("cpu", "wall")})


if __name__ == "__main__":
    main()
