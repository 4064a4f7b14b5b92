"""``serve-prm`` with one abusive client among normal ones: do the normal clients still get served?

    .venv/bin/python benchmarks/bench_prm_server_abuse.py [--prm default|CHECKPOINT|stub]
        [--clients 4] [--seconds 20] [--addresses 16] [--compare main]

Starts the PRM server in this process on 127.0.0.1 (the abuser runs in a child process). Phase 1 (undisturbed): ``--clients`` threads
each send search steps (2 candidates sharing a prefix) back to back for ``--seconds``. Phase 2:
the same, while one abusive client loops over the attacks of issue 19: a 0.66 MB body with a
20,000-step history, a 1.2 MB body within every limit (two items of 1,000 long steps: scored in
the heavy lane), an item holding a lone surrogate, a 100,000-deep JSON array, and a
slow-loris volley (sockets that send half a request head, then nothing). With ``--addresses N``
the abuser speaks from N loopback addresses (127.0.0.2 on), one connection per address and
thread: one client that a server keyed by address takes for N (issue 39: x13-21 at 16). Prints
the normal clients' p50/p99 latency in both phases, their ratio, and what the abuser got back;
``--compare REF`` runs the same against REF's ``codetool`` package too (``git archive``) and
prints both. Bounded in time (2 x ``--seconds`` plus start-up, per run). The machine is shared,
so numbers are noisy: read the ratios side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _result import emit  # noqa: E402
from bench_prm_server import _scorer  # noqa: E402  (the same scorers: stub, default, a checkpoint)

from codetool.prm.client import HTTPScorer  # noqa: E402
from codetool.prm.server import create_app  # noqa: E402
from codetool.rewards import PRMItem  # noqa: E402
from codetool.serving import serve_in_background  # noqa: E402


def _step(i: int) -> list[PRMItem]:
    base = dict(query=f"What is the weather in city {i % 7}?", tools="def forecast(city): ...",
                history=[{"code": "x = forecast(city='Paris')", "output": "{'temp': 21}"}])
    return [PRMItem(**base, candidate="print(x['temp'])", candidate_output="21"),
            PRMItem(**base, candidate="print(x)", candidate_output="{'temp': 21}")]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _normal_clients(url: str, n: int, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(k: int) -> None:
        client = HTTPScorer(url, timeout_s=60, retries=0)
        i = k
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                client.score(_step(i))
                with lock:
                    latencies.append(time.perf_counter() - start)
            except Exception:
                with lock:
                    errors[0] += 1
            i += n
        client.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


def _abuser(url: str, stop: threading.Event, outcomes: Counter, addresses: int = 1, source: str = "127.0.0.2") -> None:
    if addresses > 1:  # one thread per address, each with its own connection
        threads = [threading.Thread(target=_abuser, args=(url, stop, outcomes, 1, f"127.0.0.{a}"), daemon=True)
                   for a in range(2, 2 + addresses)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return
    host, port = url[len("http://"):].split(":")
    huge = json.dumps({"items": [{"query": "q", "history": [{"code": "x = 1", "output": "ok"}] * 20_000,
                                  "candidate": "f()"}]}).encode()
    big = json.dumps({"items": [{"query": "q", "history": [{"code": "x = 1", "output": "o" * 600}] * 1000,
                                 "candidate": "f()"}] * 2}).encode()  # 1.2 MB, within every limit
    surrogate = b'{"items": [{"query": "q\\ud800", "candidate": "f(\\ud800)"}]}'
    deep = b"[" * 100_000 + b"]" * 100_000
    with httpx.Client(base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address=source)) as client:
        while not stop.is_set():
            for name, body in (("huge", huge), ("big", big), ("surrogate", surrogate), ("deep", deep)):
                try:
                    r = client.post("/score", content=body, headers={"content-type": "application/json"})
                    outcomes[f"{name}:{r.status_code}"] += 1
                except httpx.HTTPError as e:
                    outcomes[f"{name}:{type(e).__name__}"] += 1
            socks = []
            for _ in range(50):  # slow-loris volley: half a request head, then silence
                try:
                    s = socket.create_connection((host, int(port)), source_address=(source, 0), timeout=5)
                    s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
                    socks.append(s)
                except OSError:
                    outcomes["loris:refused"] += 1
            outcomes["loris:opened"] += len(socks)
            stop.wait(0.5)
            for s in socks:
                s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prm", default="default")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--addresses", type=int, default=1, help="loopback addresses the abuser speaks from")
    parser.add_argument("--compare", metavar="REF", help="a git ref (e.g. main) measured side by side with this tree")
    parser.add_argument("--abuse", metavar="URL", help=argparse.SUPPRESS)  # internal: be the abuser
    args = parser.parse_args()
    if args.abuse:
        stop, outcomes = threading.Event(), Counter()
        threading.Timer(args.seconds, stop.set).start()
        _abuser(args.abuse, stop, outcomes, args.addresses)
        print(json.dumps(outcomes))
        return
    if args.compare:
        from bench_server_abuse import checkout

        runs = {}
        for code, root in ((args.compare, checkout(args.compare)), ("ours", Path(__file__).resolve().parents[1])):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(Path(__file__).resolve().parent)])}
            out = subprocess.run([sys.executable, __file__, "--prm", args.prm, "--clients", str(args.clients),
                                  "--seconds", str(args.seconds), "--addresses", str(args.addresses)],
                                 env=env, capture_output=True, text=True, timeout=1800)
            runs[code] = json.loads(out.stdout.strip().splitlines()[-1].removeprefix("BENCH-RESULT "))
        print(f"PRM {args.prm}, abuser on {args.addresses} addresses; load average {os.getloadavg()[0]:.1f}")
        print(f"{'code':<8}{'calm p99 ms':>12}{'abused p99 ms':>14}{'p99 x':>7}{'failed':>8}")
        for code, r in runs.items():
            print(f"{code:<8}{r['calm_p99_ms']:>12.1f}{r['abused_p99_ms']:>14.1f}{r['p99_ratio']:>7.2f}"
                  f"{r['normal_errors']:>8}")
        emit(bench="prm_server_abuse_compare", addresses=args.addresses, **{f"{c}_p99_ratio": r["p99_ratio"]
                                                                            for c, r in runs.items()})
        return
    scorer = _scorer(args.prm)
    app = create_app(scorer, max_batch_items=64, batch_wait_ms=5.0, request_timeout_s=30.0)
    with serve_in_background(app, name="the PRM server", header_timeout_s=2.0) as url:
        HTTPScorer(url).score(_step(0))  # warm-up
        calm, calm_errors = _normal_clients(url, args.clients, args.seconds)
        # The abuser runs in its own process, so its client-side work does not share our GIL.
        abuser = subprocess.Popen([sys.executable, __file__, "--abuse", url, "--seconds", str(args.seconds + 1),
                                   "--addresses", str(args.addresses)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        abused, abused_errors = _normal_clients(url, args.clients, args.seconds)
        out, _ = abuser.communicate(timeout=120)
        outcomes = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    rows = [("undisturbed", calm, calm_errors), ("with abuser", abused, abused_errors)]
    print(f"PRM {args.prm}, {args.clients} normal clients, {args.seconds:g} s per phase")
    print(f"\n{'phase':<13}{'requests':>9}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}")
    for name, lat, err in rows:
        print(f"{name:<13}{len(lat):>9}{err:>8}{statistics.median(lat) * 1000:>9.1f}{_percentile(lat, 0.99) * 1000:>9.1f}")
    ratio50 = statistics.median(abused) / statistics.median(calm)
    ratio99 = _percentile(abused, 0.99) / _percentile(calm, 0.99)
    print(f"\np50 ratio {ratio50:.2f}, p99 ratio {ratio99:.2f} (target: p99 within 2x)")
    print("abuser got:", dict(sorted(outcomes.items())))
    emit(bench="prm_server_abuse", prm=args.prm, clients=args.clients,
         calm_p50_ms=statistics.median(calm) * 1000, calm_p99_ms=_percentile(calm, 0.99) * 1000,
         abused_p50_ms=statistics.median(abused) * 1000, abused_p99_ms=_percentile(abused, 0.99) * 1000,
         p99_ratio=ratio99, normal_errors=abused_errors, abuser=dict(outcomes))


if __name__ == "__main__":
    main()
