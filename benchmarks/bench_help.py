"""How long ``codetool <command> --help`` takes, with no cache (0.2.0 keeps none).

Runs each command's ``--help`` in a fresh process, interleaved ``--rounds`` times, and prints the
median wall time per command, beside ``train-prm --help-all``: the full parser, built by importing
TRL's ``SFTConfig`` (transformers, torch), which is what 0.1 paid on every ``--help`` its option
cache did not hold. ``train-prm --help`` builds its parser from ``PRMOptions`` (no torch);
``train-policy --help`` still imports TRL's ``GRPOConfig``.

    .venv/bin/python benchmarks/bench_help.py [--rounds 3] [--commands run train-prm train-policy]

The machine is usually shared: read the ratios; the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py

REPO = Path(__file__).resolve().parents[1]


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "codetool.cli", *argv], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "COLUMNS": "100"}, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"codetool {' '.join(argv)} failed: {out.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commands", nargs="+", default=["run", "pipeline", "train-prm", "train-policy"])
    args = parser.parse_args()
    cases = [[name, "--help"] for name in args.commands] + [["train-prm", "--help-all"]]
    times: dict[str, list[float]] = {" ".join(c): [] for c in cases}
    for _ in range(args.rounds):  # interleaved, so a burst of load falls on every case alike
        for case in cases:
            times[" ".join(case)].append(_seconds(case))
    load = os.getloadavg()[0]
    print(f"codetool --help wall time, median of {args.rounds} fresh processes (load average {load:.1f})")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"  codetool {name:<24} {value:6.2f} s   (min {min(times[name]):.2f} s)")
    light, full = medians.get("train-prm --help"), medians["train-prm --help-all"]
    if light:
        print(f"  train-prm --help is {full / light:.1f}x faster than building TRL's parser (--help-all)")
    emit(load=round(load, 1), **{name.replace(" --", "_").replace("-", "_"): round(v, 3)
                                 for name, v in medians.items()})


if __name__ == "__main__":
    main()
