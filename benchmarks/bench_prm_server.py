"""Load test of ``codetool serve-prm`` on loopback: requests/s and latency with concurrent clients.

    .venv/bin/python benchmarks/bench_prm_server.py [--prm default|CHECKPOINT|stub] [--clients 8]
        [--requests 64] [--items 2] [--max-seconds 120]

Starts the PRM server in this process on 127.0.0.1 (a free port), then ``--clients`` threads
send ``--requests`` requests in total, each one search step of ``--items`` candidates sharing a
prefix (synthetic rows), through ``HTTPScorer``. Bounded: it stops sending after
``--max-seconds``. ``--prm stub`` scores with a constant (measures the HTTP and batching layer
alone); ``default`` is the untrained default model with label tokens; anything else is a
checkpoint folder. Prints requests/s, items/s, p50/p99 latency and how many requests each
scorer call served (the server's batching). The machine is shared, so numbers are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from codetool.prm.client import HTTPScorer
from codetool.prm.format import PRMFormat, item_from_row
from codetool.prm.server import create_app, serve_in_thread
from codetool.prm.synthetic import synthetic_rows
from codetool.rewards import ConstantScorer


class _Counting:
    """Wraps a scorer and records the number of items of each call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def score(self, items):
        self.calls.append(len(items))
        return self.inner.score(items)


def _scorer(spec: str):
    if spec == "stub":
        return ConstantScorer(0.5)
    from codetool.prm.scorer import LocalPRMScorer, load_scorer

    if spec == "default":
        from codetool.prm.folder import new_prm

        fmt = PRMFormat(max_length=1024, max_suffix_length=256)
        return LocalPRMScorer(*new_prm("default", fmt, dtype="float32", device="cpu"), fmt)
    from codetool.models.spec import ModelSpec

    return load_scorer(ModelSpec.parse(spec, role="prm"), device="cpu")  # the text enters here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prm", default="stub")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--items", type=int, default=2, help="candidates per request (one search step)")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()
    rows = synthetic_rows(max(args.requests, 1), steps=1, candidates=args.items)
    steps = [[item_from_row(r) for r in rows[i * args.items:(i + 1) * args.items]] for i in range(args.requests)]
    scorer = _Counting(_scorer(args.prm))
    latencies: list[float] = []
    lock = threading.Lock()
    next_index = [0]
    deadline = time.monotonic() + args.max_seconds

    def client_loop(url: str) -> None:
        client = HTTPScorer(url, timeout_s=args.max_seconds)
        while time.monotonic() < deadline:
            with lock:
                if next_index[0] >= len(steps):
                    return
                step = steps[next_index[0]]
                next_index[0] += 1
            start = time.perf_counter()
            client.score(step)
            with lock:
                latencies.append(time.perf_counter() - start)
        client.close()

    app = create_app(scorer, max_batch_items=64, batch_wait_ms=5.0)
    with serve_in_thread(app, "127.0.0.1") as url:
        HTTPScorer(url).score(steps[0])  # warm-up (first forward, connection set-up)
        scorer.calls.clear()
        start = time.perf_counter()
        threads = [threading.Thread(target=client_loop, args=(url,)) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    done = len(latencies)
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")
    print(f"PRM {args.prm}, {args.clients} clients, {args.items} items per request, {done}/{args.requests} "
          f"requests in {wall:.1f} s")
    print(f"\n{'requests/s':>11}{'items/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'scorer calls':>14}{'items/call':>12}")
    print(f"{done / wall:>11.1f}{done * args.items / wall:>10.1f}{statistics.median(ordered) * 1000:>9.1f}"
          f"{p99 * 1000:>9.1f}{len(scorer.calls):>14}{statistics.mean(scorer.calls or [0]):>12.1f}")


if __name__ == "__main__":
    main()
