"""Does a busy machine turn into failures of the code? (codetool.executor, issue 37)

A batch of fork + run steps (``--threads`` searches side by side, each forking a candidate from a
kept state, running a small step in it, forking that candidate once more and running again) while
``--hogs`` CPU-bound processes run beside it, for the executor of ``--compare`` (a git ref, default
``main``, extracted to a temporary folder) and for this tree, one after the other in fresh
processes (rounds alternate). Every step's code is correct: any result other than ``ok`` is the
machine's doing. Printed per variant: how many steps came back ``ok``, as a failure of the code
(``worker_lost``, ``timeout``, ...), or ``not_executed``, and (ours) the family's retries.

The hogs run at the benchmark's own ``nice`` level (start it with ``nice -n 10`` on a shared
machine, so that the hogs compete with the executor rather than with everyone else), and the
executor ``--executor-nice`` levels below them (default 9): a host whose CPU the executor gets
little of, made without taking more of the machine from its other users.

    nice -n 10 .venv/bin/python benchmarks/bench_executor_load.py [--hogs 16] [--steps 8] [--threads 4]

No wall-clock figure here is asserted: on a shared machine it says as much about the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter

from _result import emit  # benchmarks/_result.py
from bench_executor import REPO, checkout, modes

BATCH = """
import json, sys, threading, time
from codetool.executor import Executor, ExecutorConfig
mode, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen, lock = [], threading.Lock()
with Executor(ExecutorConfig(isolation=mode, timeout_s=5)) as root:
    root.run("import json\\nkept = {'x': 1}")
    def search(_):
        for _ in range(steps):
            child = root.fork()
            first = child.run("total = sum(range(20000)) + kept['x']\\nprint(total)")
            grandchild = child.fork()
            second = grandchild.run("print(total + 1)")
            with lock:
                for r in (first, second):
                    seen.append([r.outcome, r.error_type or "", getattr(r, "attempts", 1)])
            grandchild.close()
            child.close()
    t0 = time.monotonic()
    pool = [threading.Thread(target=search, args=(i,)) for i in range(threads)]
    [t.start() for t in pool]
    [t.join() for t in pool]
    counts = dict(getattr(root, "infra_counts", {}))
print(json.dumps({"results": seen, "seconds": time.monotonic() - t0, "infra": counts}))
"""

HOG = "while True:\n    pass"


def batch_in(package_root, mode: str, steps: int, threads: int, nice: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run(["nice", "-n", str(nice), sys.executable, "-c", BATCH, mode, str(steps), str(threads)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hogs", type=int, default=16, help="CPU-bound processes beside the executor")
    parser.add_argument("--steps", type=int, default=8, help="fork+run pairs per search thread per round")
    parser.add_argument("--threads", type=int, default=4, help="searches forking side by side")
    parser.add_argument("--executor-nice", type=int, default=9, help="niceness of the executor above the hogs'")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per variant")
    parser.add_argument("--compare", default="main", help="git ref whose executor is measured side by side")
    args = parser.parse_args()
    old_root = checkout(args.compare)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        time.sleep(1.0)
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} with {args.hogs} hogs "
              f"at nice {os.nice(0)}, the executor at nice {min(os.nice(0) + args.executor_nice, 19)}\n")
        totals: dict[str, dict] = {}
        for _ in range(args.rounds):
            for mode in modes():
                for name, root in ((f"{mode} {args.compare}", old_root), (f"{mode} ours", REPO)):
                    got = batch_in(root, mode, args.steps, args.threads, args.executor_nice)
                    total = totals.setdefault(name, {"outcomes": Counter(), "infra": Counter(), "attempts": 0,
                                                     "seconds": 0.0})
                    for outcome, error_type, attempts in got["results"]:
                        total["outcomes"][outcome if outcome in ("ok", "not_executed") else
                                          f"{outcome}:{error_type}"] += 1
                        total["attempts"] += max(int(attempts or 1), 1) - 1
                    total["infra"].update(got["infra"])
                    total["seconds"] += got["seconds"]
        print(f"load average at the end: {os.getloadavg()[0]:.1f}\n")
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    print(f"{'variant':<16} {'steps':>6} {'ok':>6} {'code failure':>13} {'not executed':>13} {'retries':>8} "
          f"{'wall s':>8}  failures recorded as the code's")
    failed = {}
    for name, total in totals.items():
        outcomes = total["outcomes"]
        steps = sum(outcomes.values())
        code_failures = {k: v for k, v in outcomes.items() if k not in ("ok", "not_executed")}
        failed[name] = sum(code_failures.values())
        retries = total["infra"].get("retries", 0)
        print(f"{name:<16} {steps:>6} {outcomes['ok']:>6} {failed[name]:>13} {outcomes['not_executed']:>13} "
              f"{retries:>8} {total['seconds']:>8.1f}  {dict(code_failures) or '-'}")
    mode = modes()[-1]
    emit(mode=mode, hogs=args.hogs, code_failures_ours=failed[f"{mode} ours"],
         code_failures_compared=failed[f"{mode} {args.compare}"],
         not_executed_ours=totals[f"{mode} ours"]["outcomes"]["not_executed"],
         retries_ours=totals[f"{mode} ours"]["infra"].get("retries", 0))


if __name__ == "__main__":
    main()
