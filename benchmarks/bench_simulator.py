"""How much of StableToolBench the loaders see, and how fast the offline simulator answers.

Loads the six StableToolBench test groups (and RestBench-TMDB), counts queries, APIs and APIs with
a ``template_response``, then calls every API of the chosen groups through the simulator (required
arguments filled from their documented examples), directly and through ``ToolEnvironment`` (argument
checks, capping, records), for ``--rounds`` rounds, and prints calls/s with p50/p99 latency.

    .venv/bin/python benchmarks/bench_simulator.py [--groups G1_instruction] [--rounds 3]

Needs ../shared/data (or CODETOOL_DATA / ./data). Single process, one thread; timings on a shared
2-core CPU are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _result import emit  # benchmarks/_result.py

from codetool.tools import (
    STABLETOOLBENCH_GROUPS,
    SimulatorBackend,
    ToolEnvironment,
    load_restbench,
    load_stabletoolbench,
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _arguments(api) -> dict:
    return {p.name: p.default if p.default not in (None, "") else "x" for p in api.required}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", nargs="*", default=["G1_instruction"], help="groups whose APIs are called")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    start = time.perf_counter()
    queries = {g: load_stabletoolbench(g) for g in STABLETOOLBENCH_GROUPS}
    load_s = time.perf_counter() - start
    entries = [a for qs in queries.values() for q in qs for a in q.apis]
    unique = {(a.category, a.tool, a.api): a for a in entries}
    restgpt, codetool = load_restbench(source="restgpt"), load_restbench(source="codetool")
    print(f"loaded in {load_s:.2f} s")
    print("| what | count |\n|---|---:|")
    for g, qs in queries.items():
        print(f"| {g} queries | {len(qs)} |")
    print(f"| StableToolBench queries | {sum(len(qs) for qs in queries.values())} |")
    print(f"| API entries (per query) | {len(entries)} |")
    print(f"| ... with template_response | {sum(a.template_response is not None for a in entries)} |")
    print(f"| unique APIs | {len(unique)} |")
    print(f"| ... with template_response | {sum(a.template_response is not None for a in unique.values())} |")
    print(f"| RestBench queries (RestGPT / CodeTool) | {len(restgpt)} / {len(codetool)} |")
    print(f"| TMDB operations | {len(restgpt[0].apis)} |")

    apis = [a for g in args.groups for q in queries[g] for a in q.apis]
    simulator = SimulatorBackend()
    direct: list[float] = []
    for _ in range(args.rounds):
        for api in apis:
            t0 = time.perf_counter()
            response = simulator.call(api, _arguments(api))
            direct.append(time.perf_counter() - t0)
            assert response.ok, (api.tool, api.api, response.error)
    through_env: list[float] = []
    envs = [ToolEnvironment(q.apis, simulator) for g in args.groups for q in queries[g]]
    for _ in range(args.rounds):
        for env in envs:
            for name, function in env.functions().items():
                kwargs = _arguments(env.api_for(name))
                t0 = time.perf_counter()
                function(**kwargs)
                through_env.append(time.perf_counter() - t0)
    print(f"\nsimulator on {len(apis)} API entries of {', '.join(args.groups)} x {args.rounds} rounds")
    print("| path | calls | calls/s | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|")
    for label, times in (("SimulatorBackend.call", direct), ("ToolEnvironment function", through_env)):
        print(f"| {label} | {len(times)} | {len(times) / sum(times):,.0f} | "
              f"{statistics.median(times) * 1e3:.3f} | {_percentile(times, 0.99) * 1e3:.3f} |")
    emit(calls_per_s=len(direct) / sum(direct), env_calls_per_s=len(through_env) / sum(through_env))


if __name__ == "__main__":
    main()
