"""Search strategies at equal generated tokens: accuracy-against-tokens curves with bootstrap intervals.

Runs every entry of a recipe's ``runs:`` (``configs/search/compare-*.yaml``) on each benchmark with
``codetool run``'s machinery (the policy and the PRM loaded once), then scores every query and
draws one curve per strategy (Snell et al. 2024 / search-and-learn's equal-compute comparison):

- **accuracy**: StableToolBench, a *grounded answer* (finished with a non-empty answer after a
  successful tool call: a judge-free proxy of the pass rate, no judge on CPU); RestBench-TMDB, the
  query's *path fraction* (share of the gold API path called in order, ``codetool.eval.restbench``);
  a 95% percentile bootstrap interval over queries (``codetool.eval.metrics.bootstrap_mean``);
- **tokens**: generated tokens per query (every candidate, episode, beam, rollout and difficulty
  probe), the x axis; a row's *tier* is its candidates per step (k x N, B or paths), the compute
  a recipe matches across strategies.
- **voting at no extra cost**: best-of-N, beam and DVTS record every finished trajectory
  (``strategy["finished"]``), so each is also scored with ``search.vote`` majority and
  prm_weighted; best-of-N's first n of N independent episodes give its points at n = 1, 2, 4, ...
  (search-and-learn's subsampling).
- **compute_optimal** runs take ``budget_from: <run>`` and ``budget_times: x``: their
  ``search.budget`` is x times that run's measured tokens per query on the benchmark.

Writes ``results.json``, ``table.md`` and ``accuracy_vs_tokens.png`` into ``--out``; trajectories
go to ``--out/<run>/<benchmark>.jsonl`` (rerun the command to resume). The load of the machine
and the CPU time are recorded (a quiet machine's wall time is about the CPU time at one thread).

    # CPU, the embedded model and the PRM that `make demo` trains (<= 20 min on 2 quiet cores):
    python benchmarks/compare_strategies.py --config configs/search/compare-cpu.yaml \\
        --prm runs/quickstart/train/prm --threads 1
    # GPU at paper scale (vLLM policy, trained PRM; sizes and limits in the recipe or as flags):
    python benchmarks/compare_strategies.py --config configs/search/compare-paper-qwen2.5-7b.yaml \\
        --policy vllm:Qwen/Qwen2.5-Coder-7B-Instruct --prm checkpoints/prm/paper
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import time
from pathlib import Path

import yaml
from _result import emit  # benchmarks/_result.py

from codetool.assemble import make_policy, make_scorer
from codetool.commands.run import execute_run
from codetool.config import from_dict
from codetool.eval.metrics import bootstrap_mean
from codetool.eval.plots import accuracy_curves
from codetool.eval.restbench import path_metrics
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.jobs.queries import RunConfig
from codetool.jsonl import read_jsonl
from codetool.rewards import grounded_success
from codetool.search.compute_optimal import candidates_per_step
from codetool.search.config import SearchConfig
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.vote import vote

VOTED = ("best_of_n", "beam", "dvts")  # strategies that record their finished trajectories
METRIC = {"stabletoolbench": "grounded answers (%)", "restbench-tmdb": "gold path fraction (%)"}


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def accuracy(traj: Trajectory) -> float:
    """The per-query accuracy of the module docstring, in [0, 1]."""
    if traj.benchmark.startswith("restbench"):
        return path_metrics([traj]).path_fraction_score
    answer = traj.final_answer if traj.finish_type == "finish" else None
    return float(grounded_success(answer, traj.executed_calls(), None, query=traj.query))


def light(traj: Trajectory, record: dict) -> Trajectory:
    """A finished trajectory rebuilt from its ``strategy["finished"]`` record (answer, end, calls),
    enough to vote over and to score."""
    result = ExecutionResult(ok=True, tool_calls=[ToolCall.from_dict(call) for call in record["calls"]])
    step = Step(0, [Candidate(0, "", "pass", result=result, chosen=True)])
    return Trajectory(traj.query_id, traj.query, benchmark=traj.benchmark, group=traj.group, steps=[step],
                      final_answer=record["answer"], finish_type=record["finish_type"],
                      available_tools=traj.available_tools, extra=traj.extra)


def picks(name: str, spec: dict, traj: Trajectory) -> list[dict]:
    """Every (series, tier, tokens, accuracy) this run's trajectory gives for one query."""
    cfg = SearchConfig(**{k: v for k, v in spec.items() if k in SearchConfig.__dataclass_fields__})
    strategy = cfg.strategy
    record = traj.strategy or {}
    full = {"run": name, "tokens": traj.generated_tokens, "prm_tokens": traj.prm_scored_tokens,
            "forks": traj.executor_forks, "tool_calls": traj.tool_calls, "seconds": traj.wall_time_s}
    size = {"best_of_n": cfg.n, "beam": cfg.beam_width, "dvts": cfg.n}.get(strategy, cfg.k)
    tier = spec.get("tier") or candidates_per_step(strategy, size, cfg)
    finished = record.get("finished")
    if strategy not in VOTED or not finished:
        return [{**full, "series": spec.get("series", strategy), "tier": tier, "accuracy": accuracy(traj)}]
    trajs = [light(traj, r) for r in finished]
    scores = [float("-inf") if r["score"] is None else r["score"] for r in finished]
    prefixes = [2 ** i for i in range(len(finished).bit_length()) if 2 ** i < len(finished)] + [len(finished)] \
        if strategy == "best_of_n" else [len(finished)]
    out = []
    for n in prefixes:
        part = {} if n == len(finished) else {"run": f"{name}[:{n}]", "tokens": sum(record["episode_tokens"][:n]),
                                              "prm_tokens": None, "forks": None, "tool_calls": None, "seconds": None}
        for mode in ("none", "majority", "prm_weighted"):
            if mode != "none" and n == 1:
                continue
            # the run's own pick is the trajectory itself; other picks are rebuilt from the record
            as_run = n == len(finished) and mode == cfg.vote
            chosen = traj if as_run else trajs[vote(trajs[:n], scores[:n], mode).chosen]
            out.append({**full, **part, "series": strategy + ("" if mode == "none" else f"+{mode}"),
                        "tier": tier * n // len(finished), "accuracy": accuracy(chosen)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/search/compare-cpu.yaml")
    parser.add_argument("--out", default="runs/compare-strategies")
    parser.add_argument("--policy", default="", help="policy for every run (model id, folder, server URL, vllm:...)")
    parser.add_argument("--prm", default="", help="PRM for every run (checkpoint folder or serve-prm URL)")
    parser.add_argument("--limit", type=int, default=0, help="queries per benchmark (0: the recipe's)")
    parser.add_argument("--only", nargs="*", help="only these runs of the recipe")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--figure", default="", help="also copy the plot here (e.g. docs/figures/...png)")
    args = parser.parse_args()
    recipe = yaml.safe_load(Path(args.config).read_text())
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    base = recipe["run"]
    base.update({k: v for k, v in (("policy", args.policy), ("prm", args.prm)) if v})
    benches = [dict(b, **({"limit": args.limit} if args.limit else {})) for b in recipe["benchmarks"]]
    out, started, load_start = Path(args.out), time.perf_counter(), os.getloadavg()
    probe = from_dict(RunConfig, merge(base, benches[0]))
    policy, scorer = make_policy(probe.policy_spec), make_scorer(probe.prm_spec)  # loaded once for every run
    rows: list[dict] = []
    measured: dict[tuple[str, str], float] = {}  # (run, benchmark) -> generated tokens per query
    run_cpu: dict[str, float] = {}  # this process's CPU seconds per run and benchmark (0 when resumed)
    for name, spec in recipe["runs"].items():
        if args.only and name not in args.only:
            continue
        for bench in benches:
            tag = bench["benchmark"] + (f"-{bench['group']}" if bench.get("group") else "")
            search = {k: v for k, v in spec.items() if k not in ("budget_from", "budget_times", "series", "tier")}
            if "budget_from" in spec:
                search["budget"] = max(1, round(spec["budget_times"] * measured[(spec["budget_from"], tag)]))
            data = merge(merge(base, bench), {"search": {**search, "seed": recipe.get("seed", 0), "method": name}})
            data["output"] = str(out / name / f"{tag}.jsonl")
            t0, cpu0 = time.perf_counter(), time.process_time()
            path = execute_run(from_dict(RunConfig, data), policy=policy, scorer=scorer, show_summary=False)
            run_cpu[f"{name}/{tag}"] = round(time.process_time() - cpu0, 1)
            trajs = [Trajectory.from_dict(r) for r in read_jsonl(path)]
            measured[(name, tag)] = statistics.mean(t.generated_tokens for t in trajs)
            for traj in trajs:
                rows += [dict(p, benchmark=traj.benchmark, query=traj.query_id) for p in picks(name, {**search, **{
                    k: spec[k] for k in ("series", "tier") if k in spec}}, traj)]
            print(f"{name} on {tag}: {measured[(name, tag)]:.0f} tokens/query, {time.perf_counter() - t0:.0f} s, "
                  f"CPU {run_cpu[f'{name}/{tag}']:.0f} s", flush=True)
    wall = time.perf_counter() - started
    usage = {who: resource.getrusage(getattr(resource, f"RUSAGE_{who.upper()}")) for who in ("self", "children")}
    cpu = {who: round(u.ru_utime + u.ru_stime, 1) for who, u in usage.items()}
    points = summarise(rows, args.samples)
    machine = {"wall_s": round(wall, 1), "cpu_s": cpu, "load_start": [round(x, 2) for x in load_start],
               "load_end": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
               "torch_threads": args.threads or "default", "run_cpu_s": run_cpu}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": args.config, "recipe": recipe, "machine": machine,
                                                   "points": points, "rows": rows}, indent=1, default=float))
    table = markdown(points, machine, args.config)
    (out / "table.md").write_text(table)
    print(table)
    panels = {bench: {} for bench in dict.fromkeys(p["benchmark"] for p in points)}
    for p in points:
        panels[p["benchmark"]].setdefault(p["series"], []).append(
            (p["tokens"], 100 * p["accuracy"], 100 * p["low"], 100 * p["high"]))
    plot = accuracy_curves(panels, out / "accuracy_vs_tokens.png", ylabels=METRIC, title=(
        f"Search strategies at equal generated tokens ({Path(args.config).stem}; 95% bootstrap intervals over queries)"))
    if args.figure:
        Path(args.figure).write_bytes(plot.read_bytes())
    print(f"plot: {plot}; wall {wall / 60:.1f} min, CPU {cpu}, load {machine['load_start']} -> {machine['load_end']}")
    emit(bench="compare_strategies", minutes=round(wall / 60, 2), cpu_s=cpu["self"] + cpu["children"],
         **{f"{p['benchmark']}:{p['series']}@{p['tier']}": round(100 * p["accuracy"], 1) for p in points})


def summarise(rows: list[dict], samples: int) -> list[dict]:
    """One point per (benchmark, series, run): means over queries and the accuracy's interval."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["benchmark"], r["series"], r["run"], r["tier"]), []).append(r)
    points = []
    for (bench, series, run, tier), rs in groups.items():
        mean, low, high = bootstrap_mean([r["accuracy"] for r in rs], samples=samples)
        avg = {k: (statistics.mean(r[k] for r in rs) if rs[0][k] is not None else None)
               for k in ("tokens", "prm_tokens", "forks", "tool_calls", "seconds")}
        points.append({"benchmark": bench, "series": series, "run": run, "tier": tier, "queries": len(rs),
                       "accuracy": mean, "low": low, "high": high, **avg})
    return sorted(points, key=lambda p: (p["benchmark"], p["series"], p["tokens"]))


def markdown(points: list[dict], machine: dict, config: str) -> str:
    """Per benchmark: strategies as rows, tiers (candidates per step) as columns, each cell the
    accuracy, its interval and the tokens it took; then every point with its compute."""
    lines = []
    for bench in dict.fromkeys(p["benchmark"] for p in points):
        mine = [p for p in points if p["benchmark"] == bench]
        tiers = sorted({p["tier"] for p in mine})
        n = max(p["queries"] for p in mine)
        lines += [f"### {bench}: {METRIC.get(bench, 'accuracy')} at equal compute ({n} queries)", "",
                  "| strategy | " + " | ".join(f"{t} candidates/step" for t in tiers) + " |",
                  "|---|" + "---|" * len(tiers)]
        for series in dict.fromkeys(p["series"] for p in mine):
            cells = []
            for t in tiers:
                hit = [p for p in mine if p["series"] == series and p["tier"] == t]
                cells.append("; ".join(f"{100 * p['accuracy']:.0f} [{100 * p['low']:.0f}, {100 * p['high']:.0f}] "
                                       f"@ {p['tokens']:.0f} tok" for p in hit) or "")
            lines.append(f"| {series} | " + " | ".join(cells) + " |")
        lines += ["", "| run | series | tokens/query | accuracy % [95% CI] | PRM tokens/query | forks/query | "
                  "tool calls/query | s/query |", "|---|---|---:|---|---:|---:|---:|---:|"]
        for p in sorted(mine, key=lambda p: p["tokens"]):
            lines.append(f"| {p['run']} | {p['series']} | {p['tokens']:,.0f} | {100 * p['accuracy']:.1f} "
                         f"[{100 * p['low']:.1f}, {100 * p['high']:.1f}] | {_num(p, 'prm_tokens', 0)} | "
                         f"{_num(p, 'forks')} | {_num(p, 'tool_calls')} | {_num(p, 'seconds')} |")
        lines.append("")
    cpu = machine["cpu_s"]
    lines.append(f"{config}; wall {machine['wall_s'] / 60:.1f} min, CPU {(cpu['self'] + cpu['children']) / 60:.1f} min "
                 f"(process {cpu['self'] / 60:.1f} + children {cpu['children'] / 60:.1f}), load average "
                 f"{machine['load_start'][0]} at start, {machine['load_end'][0]} at the end, "
                 f"{machine['cores']} cores, torch threads {machine['torch_threads']}.")
    return "\n".join(lines) + "\n"


def _num(point: dict, key: str, digits: int = 1) -> str:
    return "-" if point[key] is None else f"{point[key]:,.{digits}f}"


if __name__ == "__main__":
    main()
