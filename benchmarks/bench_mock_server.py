"""Load test of the mock servers on loopback: requests/s and p50/p99 latency with concurrent clients.

Starts the TMDB mock and the StableToolBench-compatible server (simulator behind it) on
127.0.0.1 with a free port, each behind the same request guard as ``codetool serve-mock``, then
sends ``--requests`` requests per concurrency level (TMDB: the gold paths of RestGPT's tmdb.json
with their ids filled in; StableToolBench: ``POST /virtual`` for the APIs of G1_instruction) from
that many client threads, each with its own keep-alive connection. Bounded in count and in time
(``--max-seconds`` per level); loopback only.

    .venv/bin/python benchmarks/bench_mock_server.py [--requests 400] [--concurrency 1 8 32]

Needs ../shared/data (or CODETOOL_DATA / ./data). Server and clients share this 2-core CPU, so
the numbers are a floor for a real deployment and noisy when other jobs run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import threading
import time

import httpx
from _result import emit  # benchmarks/_result.py

from codetool.commands.serve_mock import ServeMockConfig, build_mock_app
from codetool.serving import serve_in_background
from codetool.tools import load_restbench, load_stabletoolbench
from codetool.tools.names import api_key_name, standardize

PATH_VALUES = {"movie_id": "550", "person_id": "287", "tv_id": "1399", "season_number": "1",
               "episode_number": "1", "collection_id": "10", "company_id": "1", "network_id": "213",
               "credit_id": "52fe4250c3a36847f8014a11", "review_id": "58aa82f09251416f92006a3a",
               "media_type": "movie", "time_window": "day"}


def tmdb_requests() -> list[tuple[str, str, dict | None]]:
    queries = load_restbench(source="restgpt")
    required = {a.path: {p.name: "test" for p in a.required if p.location == "query"} for a in queries[0].apis}
    out = []
    for step in sorted({" ".join(s.split()) for q in queries for s in q.gold_path}):
        path = step.split(" ", 1)[1].replace("/person/{movie_id}/", "/person/{person_id}/")
        query = "&".join(f"{k}={v}" for k, v in required.get(path, {}).items())
        filled = re.sub(r"{([^{}]+)}", lambda m: PATH_VALUES[m.group(1)], path)
        out.append(("GET", filled + (f"?{query}" if query else ""), None))
    return out


def stabletoolbench_requests() -> list[tuple[str, str, dict | None]]:
    out = []
    for query in load_stabletoolbench("G1_instruction"):
        for api in query.apis:
            arguments = {p.name: p.default if p.default not in (None, "") else "x" for p in api.required}
            out.append(("POST", "/virtual", {"category": api.category, "tool_name": standardize(api.tool),
                                             "api_name": api_key_name(api), "tool_input": json.dumps(arguments),
                                             "strip": "truncate", "toolbench_key": ""}))
    return out


def load(url: str, requests: list, total: int, concurrency: int, max_seconds: float) -> dict:
    work = itertools.islice(itertools.cycle(requests), total)
    lock = threading.Lock()
    latencies: list[float] = []
    failures = [0]
    deadline = time.monotonic() + max_seconds

    def client_loop():
        with httpx.Client(base_url=url, timeout=30) as client:
            while time.monotonic() < deadline:
                with lock:
                    item = next(work, None)
                if item is None:
                    return
                method, path, body = item
                t0 = time.perf_counter()
                response = client.request(method, path, json=body)
                elapsed = time.perf_counter() - t0
                with lock:
                    latencies.append(elapsed)
                    failures[0] += response.status_code != 200

    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"requests": len(latencies), "failed": failures[0], "rps": len(latencies) / wall,
            "p50_ms": statistics.median(ordered) * 1e3, "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400, help="requests per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32])
    parser.add_argument("--max-seconds", type=float, default=30.0, help="time cap per level")
    args = parser.parse_args()

    print("| server | clients | requests | failed | req/s | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|---:|")
    rps: dict[str, float] = {}
    for kind, requests in (("tmdb", tmdb_requests()), ("stabletoolbench", stabletoolbench_requests())):
        cfg = ServeMockConfig(kind=kind)
        with serve_in_background(build_mock_app(cfg)) as url:
            for concurrency in args.concurrency:
                r = load(url, requests, args.requests, concurrency, args.max_seconds)
                print(f"| {kind} | {concurrency} | {r['requests']} | {r['failed']} | {r['rps']:,.0f} | "
                      f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
                rps[f"{kind}_c{concurrency}"] = r["rps"]
    emit(**{f"{k}_rps": v for k, v in rps.items()})


if __name__ == "__main__":
    main()
