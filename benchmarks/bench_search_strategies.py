"""Search strategies compared at equal compute: greedy, best-of-N, beam and lookahead over code steps.

Runs every strategy of a recipe (``configs/search/*.yaml``) on each benchmark slice and seed with
``codetool run``'s machinery (one policy loaded once), then reports judge-free metrics with their
spread over seeds, and the compute each strategy spent:

- ``grounded``: share of StableToolBench queries that ended with ``finish`` and a non-empty answer
  after at least one successful tool call on the chosen path (a judge-free proxy of pass rate);
- ``path``: RestBench-TMDB path fraction (share of the gold API path matched in order);
- ``scep``: share of chosen steps whose code ran (CodeTool's SCEP), over both benchmarks;
- ``tokens``: generated tokens per query (every candidate, episode, beam and rollout).

Writes ``summary.json``, ``table.md`` and ``metric_vs_tokens.png`` into ``--out``; trajectories go
to ``--out/<strategy>/seed<k>/<benchmark>.jsonl`` (resumable: rerun the command to continue).
Machine: shared CPUs; times are noisy.

    python benchmarks/bench_search_strategies.py --config configs/search/four-strategies-cpu.yaml [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import yaml
from _result import emit  # benchmarks/_result.py

from codetool.assemble import make_policy, make_scorer
from codetool.commands.run import execute_run
from codetool.config import from_dict
from codetool.eval.metrics import run_metrics
from codetool.eval.plots import metric_vs_tokens
from codetool.eval.restbench import path_metrics
from codetool.jobs.queries import RunConfig
from codetool.jsonl import read_jsonl
from codetool.rewards import grounded_success
from codetool.search.records import Trajectory


def grounded(traj: Trajectory) -> bool:
    """Finished with a non-empty answer after at least one successful call of a listed tool (the
    trees' grounded success, :func:`codetool.rewards.grounded_success`)."""
    answer = traj.final_answer if traj.finish_type == "finish" else None
    return grounded_success(answer, traj.executed_calls(), None)


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def measure(trajs: list[Trajectory]) -> dict:
    stb = [t for t in trajs if t.benchmark == "stabletoolbench"]
    rb = [t for t in trajs if t.benchmark.startswith("restbench")]
    scep = run_metrics(trajs).scep
    return {"grounded": 100 * sum(map(grounded, stb)) / len(stb) if stb else None,
            "path": 100 * path_metrics(rb).path_fraction_score if rb else None,
            "scep": None if scep is None else 100 * scep,
            "tokens": statistics.mean(t.generated_tokens for t in trajs),
            "prm_tokens": statistics.mean(t.prm_scored_tokens for t in trajs),
            "forks": statistics.mean(t.executor_forks for t in trajs),
            "tool_calls": statistics.mean(t.tool_calls for t in trajs),
            "seconds": statistics.mean(t.wall_time_s for t in trajs),
            "errors": sum(t.finish_type == "error" for t in trajs), "queries": len(trajs)}


def spread(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{statistics.mean(values):.1f} ± {statistics.pstdev(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/search/four-strategies-cpu.yaml")
    parser.add_argument("--out", default="runs/bench-search")
    parser.add_argument("--strategies", nargs="*", help="only these strategies of the recipe")
    parser.add_argument("--prm", default="", help="latent reward for every strategy (a PRM checkpoint dir, "
                        "e.g. make demo's runs/quickstart/prm, or a serve-prm URL); default: the recipe's run.prm")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    recipe = yaml.safe_load(Path(args.config).read_text())
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    base = recipe["run"]
    if args.prm:
        base["prm"] = args.prm
    probe = from_dict(RunConfig, merge(base, recipe["benchmarks"][0]))
    policy = make_policy(probe.policy_spec)  # parsed once by RunConfig, with its dtype, batch size, server
    scorer = make_scorer(probe.prm_spec)  # None for none/rollout; loaded once for every strategy
    results: dict[str, list[dict]] = {}
    started = time.perf_counter()
    for name, overrides in recipe["strategies"].items():
        if args.strategies and name not in args.strategies:
            continue
        for seed in recipe["seeds"]:
            trajs = []
            t0 = time.perf_counter()
            for bench in recipe["benchmarks"]:
                data = merge(merge(base, bench), {"search": {**overrides, "seed": seed, "method": name}})
                tag = bench["benchmark"] + (f"-{bench['group']}" if bench.get("group") else "")
                data["output"] = str(out / name / f"seed{seed}" / f"{tag}.jsonl")
                path = execute_run(from_dict(RunConfig, data), policy=policy, scorer=scorer, show_summary=False)
                trajs += [Trajectory.from_dict(r) for r in read_jsonl(path)]
            row = measure(trajs) | {"seed": seed, "run_seconds": time.perf_counter() - t0}
            results.setdefault(name, []).append(row)
            print(f"{name} seed {seed}: {json.dumps(row, default=float)}", flush=True)
    total = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"config": args.config, "results": results,
                                                   "seconds": total}, indent=2, default=float))
    lines = ["| strategy | STB grounded answers (%) | RestBench path fraction (%) | SCEP (%) | generated tokens/query "
             "| PRM tokens/query | forks/query | tool calls/query | s/query |", "|---" * 9 + "|"]
    for name, rows in results.items():
        cols = [spread([r[k] for r in rows]) for k in ("grounded", "path", "scep", "tokens", "prm_tokens",
                                                         "forks", "tool_calls", "seconds")]
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    table = "\n".join(lines) + f"\n\nmean ± std over seeds {recipe['seeds']}; total {total / 60:.1f} min\n"
    (out / "table.md").write_text(table)
    print(table)
    points = {name: [(r["tokens"], r["scep"] or 0.0) for r in rows] for name, rows in results.items()}
    plot = metric_vs_tokens(points, out / "metric_vs_tokens.png", metric="SCEP (%)",
                            title=f"Search strategies ({Path(args.config).stem}), one dot per seed")
    print(f"plot: {plot}")
    emit(bench="search_strategies", minutes=round(total / 60, 2),
         **{f"{name}_{k}": statistics.mean(r[k] or 0.0 for r in rows)
            for name, rows in results.items() for k in ("grounded", "path", "scep", "tokens")})


if __name__ == "__main__":
    main()
