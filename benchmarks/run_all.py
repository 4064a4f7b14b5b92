"""Run the performance benchmarks and print one table of our figures against their baselines.

    .venv/bin/python benchmarks/run_all.py            # what `make bench` runs (about 10 minutes on 2 CPUs)
    .venv/bin/python benchmarks/run_all.py --only prm_scoring prm_training
    .venv/bin/python benchmarks/run_all.py --quick    # fewer repetitions, for a smoke check

Each benchmark runs in its own process (so one's threads and memory do not colour the next), its
full output goes to ``runs/bench/<name>.txt`` and its ``BENCH-RESULT`` line (see ``_result.py``)
into ``runs/bench/results.json``. The machine is usually shared; read ratios, not absolute times.
Needs ``codetool setup`` (the default model) and ../shared/data.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _result import PREFIX

HERE = Path(__file__).resolve().parent

# name -> (script, arguments, quick arguments)
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "executor": ("bench_executor.py", [], ["--iterations", "30", "--rounds", "2"]),
    "simulator": ("bench_simulator.py", [], ["--rounds", "1"]),
    "mock_server": ("bench_mock_server.py", ["--requests", "200"], ["--requests", "50", "--concurrency", "1", "8"]),
    "generation": ("bench_generation.py", [], ["--max-new-tokens", "16"]),
    "prm_scoring": ("bench_prm_scoring.py", ["--skip-padded"], ["--skip-padded", "--repeats", "1"]),
    "prm_training": ("bench_prm_training.py", [], ["--steps", "2", "--warmup", "1"]),
}


def _x(ours: float, base: float) -> str:
    return f"{ours / base:.2f}x" if base else "n/a"


def rows(name: str, r: dict) -> list[tuple[str, str, str, str, str]]:
    """(benchmark, what, ours, baseline, ratio) rows of one result."""
    if name == "executor":
        return [("executor", f"fork + run('pass') + close ({r['mode']})", f"{r['fork_run_close_ms']:.1f} ms",
                 f"{r['compared_ms']:.1f} ms (main)", f"{r['ratio']:.2f}x"),
                ("executor", "5 steps x 2 candidates: tool calls", str(r["tool_calls"]), str(r["baseline_tool_calls"]),
                 _x(r["baseline_tool_calls"], r["tool_calls"]) + " fewer"),
                ("executor", "5 steps x 2 candidates: wall time", f"{r['seconds']:.2f} s",
                 f"{r['baseline_seconds']:.2f} s", _x(r["baseline_seconds"], r["seconds"]))]
    if name == "simulator":
        return [("simulator", "tool calls/s (direct / through functions)",
                 f"{r['calls_per_s']:,.0f} / {r['env_calls_per_s']:,.0f}", "-", "-")]
    if name == "mock_server":
        return [("mock_server", f"{k.removesuffix('_rps').replace('_c', ', clients ')} req/s", f"{v:,.0f}", "-", "-")
                for k, v in r.items()]
    if name == "generation":
        return [("generation", "n=4 samples: one call vs 4 calls (tok/s)", f"{r['n4_tokens_per_s']:.1f}",
                 f"{r['n4_baseline_tokens_per_s']:.1f}", f"{r['n4_speedup']:.2f}x"),
                ("generation", "8 prompts batched vs 8 calls", "-", "-", f"{r['batch_speedup']:.2f}x"),
                ("generation", "shared prefill for n=4", "-", "-", f"{r['prefill_speedup']:.2f}x")]
    if name == "prm_scoring":
        return [("prm_scoring", f"{r['candidates']} candidates, {r['prefix_tokens']}-token prefix "
                 f"(bound {r['token_bound']:.1f}x; max |diff| {r['max_abs_diff']:.1e})",
                 f"{r['seconds']:.2f} s", f"{r['baseline_seconds']:.2f} s", f"{r['speedup']:.2f}x")]
    if name == "prm_training":
        return [("prm_training", "tokens/s vs TRL SFTTrainer", f"{r['tokens_per_s']:.1f}",
                 f"{r['baseline_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x"),
                ("prm_training", "peak RSS", f"{r['peak_rss_mb']:.0f} MB", f"{r['baseline_peak_rss_mb']:.0f} MB", "-")]
    return [(name, k, str(v), "-", "-") for k, v in r.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS), help="run only these")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke check, noisier)")
    parser.add_argument("--out", default="runs/bench", help="folder for outputs and results.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    failed = []
    for name in args.only or list(BENCHMARKS):
        script, full, quick = BENCHMARKS[name]
        command = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        (out / f"{name}.txt").write_text(done.stdout + ("\n--- stderr ---\n" + done.stderr if done.stderr else ""))
        lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
        if done.returncode != 0 or not lines:
            print(f"  failed (exit {done.returncode}); see {out / f'{name}.txt'}", flush=True)
            failed.append(name)
            continue
        results[name] = {**json.loads(lines[-1][len(PREFIX):]), "wall_s": round(time.perf_counter() - start, 1)}
        results_path.write_text(json.dumps(results, indent=2))  # kept after each benchmark
    table = [row for name in BENCHMARKS if name in results for row in rows(name, results[name])]
    print("\n| benchmark | what | ours | baseline | ratio |\n|---|---|---:|---:|---:|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
