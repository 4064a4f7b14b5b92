"""What constrained step decoding (``search.constrain: call``) changes, on the quickstart queries.

Runs the stepwise search twice on the same queries with the same seed, once with
``search.constrain: off`` and once with ``call``, with the embedded SmolLM2-135M-Instruct policy and
the tool simulator (StableToolBench G1_instruction) or our TMDB mock (RestBench), and prints per run:

- ``cand_form`` / ``chosen_form``: share of candidates / chosen steps whose code contains a call of a
  listed function, ``finish`` or ``give_up`` (the form of the step, whether or not it ran);
- ``cand_call``: share of all candidates whose code called at least one listed function (any status);
- ``chosen_call``: the same over chosen steps;
- ``cand_call_or_end``: share of candidates that called a listed function, ``finish`` or ``give_up``;
- ``scep``: chosen-step SCEP, the share of chosen steps whose code ran (CodeTool §4.1);
- ``ok_calls``: share of chosen steps with at least one successful listed-tool call;
- ``finish``: share of episodes that ended with ``finish``;
- ``grounded``: share of episodes that finished with a non-empty answer and made >= 1 successful
  call of a listed function on the chosen path (issue 14's ``grounded`` success, computed here);
- seconds of generation per episode.

No PRM (``latent: none``): this isolates the policy's step format. Command (repository root):

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_constrained_decoding.py --limit 8 --k 2 --steps 2

Writes trajectories under ``--out`` (``<benchmark>-<mode>.jsonl``), deleted and rewritten each run.
``--trees FILE`` instead counts, in a tree file of ``codetool build-trees`` / the pipeline's trees
stage, the trees with at least one grounded successful leaf (finished with a non-empty answer after
>= 1 successful tool call on its path) and the share of nodes that called a listed function:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_constrained_decoding.py --trees runs/quickstart/trees/trees.jsonl
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py

from codetool.assemble import make_policy
from codetool.commands.run import execute_run
from codetool.executor import ExecutorConfig
from codetool.executor.result import ExecutionResult
from codetool.jobs.queries import RunConfig
from codetool.jsonl import read_jsonl
from codetool.models.spec import ModelSpec
from codetool.search.config import SearchConfig
from codetool.search.records import Trajectory


def calls_by_form(code: str | None, names: set[str]) -> bool:
    """The code contains ``name(`` for a listed function, ``finish`` or ``give_up``."""
    return bool(code) and any(re.search(rf"\b{re.escape(n)}\(", code) for n in names | {"finish", "give_up"})


def listed_calls(result: ExecutionResult, names: set[str], ok_only: bool = False) -> int:
    return sum(1 for c in result.tool_calls if c.name in names and (not ok_only or c.status == "ok"))


def ends(result: ExecutionResult) -> bool:
    return result.finished


def metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """The table's columns over a run's trajectories (module docstring)."""
    cands = chosen = cand_call = cand_end = chosen_call = chosen_ok = chosen_ran = cand_form = chosen_form = 0
    finished = grounded = 0
    gen_s = 0.0
    for t in trajs:
        names = {a["name"] for a in t.available_tools}
        for step in t.steps:
            for c in step.candidates:
                cands += 1
                called = listed_calls(c.result, names) > 0
                cand_call += called
                cand_end += called or ends(c.result)
                cand_form += calls_by_form(c.code, names)
            pick = step.chosen_candidate
            chosen += 1
            chosen_form += calls_by_form(pick.code, names)
            chosen_call += listed_calls(pick.result, names) > 0
            chosen_ok += listed_calls(pick.result, names, ok_only=True) > 0
            chosen_ran += bool(pick.result.ok)
        answered = t.finish_type == "finish" and bool((t.final_answer or "").strip())
        finished += t.finish_type == "finish"
        grounded += answered and any(c.name in names and c.status == "ok" for c in t.executed_calls())
        gen_s += t.phase_seconds.get("generation", 0.0)
    n = max(len(trajs), 1)
    return {"episodes": len(trajs), "candidates": cands, "chosen_steps": chosen,
            "cand_form": cand_form / max(cands, 1), "chosen_form": chosen_form / max(chosen, 1),
            "cand_call": cand_call / max(cands, 1), "cand_call_or_end": cand_end / max(cands, 1),
            "chosen_call": chosen_call / max(chosen, 1), "scep": chosen_ran / max(chosen, 1),
            "ok_calls": chosen_ok / max(chosen, 1), "finish": finished / n, "grounded": grounded / n,
            "grounded_count": grounded, "gen_s_per_episode": gen_s / n}


def tree_counts(path: Path) -> dict[str, float]:
    """Grounded successes and tool calls in a tree JSONL file (see the module docstring)."""
    trees = list(read_jsonl(path))
    grounded_trees = grounded_leaves = leaves = nodes = calling = answered = 0
    for tree in trees:
        by_id = tree["nodes"]
        found = 0
        for node in by_id.values():
            nodes += 1
            calls = node["result"].get("tool_calls", [])
            calling += bool(calls)
            if not node["leaf"]:
                continue
            leaves += 1
            path, nid = [], node["id"]
            while nid:
                path.append(by_id[nid])
                nid = by_id[nid]["parent"]
            finished = node["ended"] == "finish" and bool(str(node["final_answer"] or "").strip())
            answered += finished
            ok_call = any(c.get("status") == "ok" for n in path for c in n["result"].get("tool_calls", []))
            found += finished and ok_call
        grounded_leaves += found
        grounded_trees += found > 0
    return {"trees": len(trees), "trees_with_grounded_leaf": grounded_trees, "grounded_leaves": grounded_leaves,
            "answered_leaves": answered, "leaves": leaves, "nodes": nodes,
            "nodes_calling_a_tool": calling / max(nodes, 1),
            "pairs": sum(t["summary"]["pairs"] for t in trees)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="stabletoolbench", choices=["stabletoolbench", "restbench-tmdb"])
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--tool-doc", default="brief", choices=["full", "compact", "brief"])
    parser.add_argument("--modes", default="off,call,line", help="comma-separated: off, call, line (literal "
                        "arguments), line-free (free arguments)")
    parser.add_argument("--out", default="runs/bench_constrained")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--trees", default=None, help="count grounded successes in this tree JSONL file and exit")
    parser.add_argument("--reuse", action="store_true", help="recompute the table from the files in --out")
    args = parser.parse_args()
    if args.trees:
        counts = tree_counts(Path(args.trees))
        for key, value in counts.items():
            print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
        emit(benchmark="constrained_decoding_trees", **counts)
        return
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policy = None if args.reuse else make_policy(ModelSpec.parse("default", max_batch_size=40))  # the text enters here
    rows = {}
    for mode in args.modes.split(","):
        path = out / f"{args.benchmark}-{mode}.jsonl"
        if args.reuse:
            rows[mode] = {**metrics([Trajectory.from_dict(d) for d in read_jsonl(path)]), "wall_s": float("nan")}
            continue
        path.unlink(missing_ok=True)
        search = SearchConfig(method=f"constrain-{mode}", k=args.k, max_steps=args.steps, temperature=0.9,
                              top_p=0.95, max_new_tokens=args.max_new_tokens, latent="none", w_latent=0.0,
                              concurrency=args.limit, max_observation_chars=400, seed=0,
                              # "line-free": the line shape with free arguments (the issue-16 first cut)
                              constrain=mode.removesuffix("-free"),
                              constrain_arguments="free" if mode.endswith("-free") else "literal")
        cfg = RunConfig(benchmark=args.benchmark, subset="codetool", offset=args.offset, limit=args.limit,
                        output=str(path), tool_doc=args.tool_doc, search=search,
                        executor=ExecutorConfig(timeout_s=20))
        start = time.perf_counter()
        execute_run(cfg, policy=policy, show_summary=False)
        seconds = time.perf_counter() - start
        rows[mode] = {**metrics([Trajectory.from_dict(d) for d in read_jsonl(path)]), "wall_s": seconds}
    cols = ["cand_form", "chosen_form", "cand_call", "chosen_call", "cand_call_or_end", "scep", "ok_calls", "finish", "grounded"]
    print(f"\n{args.benchmark}, {args.limit} queries from {args.offset}, k={args.k}, {args.steps} steps, "
          f"max_new_tokens={args.max_new_tokens}, tool_doc={args.tool_doc}")
    print("| constrain | " + " | ".join(cols) + " | grounded episodes | gen s/episode | wall s |")
    print("|---" * (len(cols) + 4) + "|")
    for mode, r in rows.items():
        print(f"| {mode} | " + " | ".join(f"{r[c]:.2f}" for c in cols)
              + f" | {r['grounded_count']}/{r['episodes']} | {r['gen_s_per_episode']:.1f} | {r['wall_s']:.0f} |")
    emit(benchmark="constrained_decoding", dataset=args.benchmark,
         **{f"{mode}_{k}": v for mode, r in rows.items() for k, v in r.items()})


if __name__ == "__main__":
    main()
