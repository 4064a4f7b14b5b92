"""How good and how cheap is the decide-first stage with the default model? (codetool.decide.router)

Runs ``codetool eval-decision`` with the embedded default model (SmolLM2-135M-Instruct, CPU) on
``--n_tool`` StableToolBench G1_instruction queries and ``--n_free`` of our tool-free queries, then
prints the decision metrics for each option scoring (raw log-prob sum, per character, and both
calibrated against a content-free request), the routes at the chosen thresholds, and the decision
cost. With ``--run_search`` (needs the code executor) it also runs every fast path and the
always-search baseline and prints the token and latency saving.

    .venv/bin/python benchmarks/bench_decision.py [--n_tool 20] [--n_free 20] [--t_none 0.6] [--t_tool 0.6]
        [--method auto|logprobs|agreement] [--output runs/bench-decision]
    # then the routes for real on the first 4 + 4 queries of that draw, reusing its decisions:
    .venv/bin/python benchmarks/bench_decision.py --n_tool 4 --n_free 4 --run_search \
        --reuse runs/bench-decision/records.jsonl --max_steps 2 --max_new_tokens 128 --output runs/bench-decision-search

Needs ``codetool setup`` and ../shared/data. The report (table, PNG) lands in ``--output``.
Timings on the shared 2-core CPU are noisy.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from codetool.commands.eval_decision import DecisionEvalConfig, eval_decision_command
from codetool.config import load_config

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ROWS = [("decision_accuracy", "decision acc"), ("necessity_accuracy", "necessity acc"),
        ("tool_invocation_accuracy", "tool-invocation"), ("tool_selection_error", "selection error"),
        ("hallucination_rate", "hallucination"), ("deferred_rate", "deferred"),
        ("unnecessary_tool_rate", "unnecessary")]


def pct(x):
    return "  n/a" if x is None else f"{100 * x:5.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n_tool", type=int, default=20)
    parser.add_argument("--n_free", type=int, default=20)
    parser.add_argument("--t_none", type=float, default=0.6)
    parser.add_argument("--t_tool", type=float, default=0.6)
    parser.add_argument("--method", default="auto", choices=["auto", "logprobs", "agreement"])
    parser.add_argument("--answer_max_new_tokens", type=int, default=96)
    parser.add_argument("--run_search", action="store_true")
    parser.add_argument("--reuse", default="", help="records.jsonl of an earlier run: reuse its decisions")
    parser.add_argument("--max_steps", type=int, default=3, help="search steps (run_search)")
    parser.add_argument("--max_new_tokens", type=int, default=192, help="tokens per search step (run_search)")
    parser.add_argument("--concurrency", type=int, default=8, help="search episodes in flight (run_search)")
    parser.add_argument("--output", default="runs/bench-decision")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    cfg = load_config(DecisionEvalConfig, overrides={
        "data": str(DATA), "n_tool": args.n_tool, "n_free": args.n_free, "output": args.output,
        "run_search": args.run_search, "router.method": args.method, "router.t_none": args.t_none,
        "router.t_tool": args.t_tool, "router.answer_max_new_tokens": args.answer_max_new_tokens,
        "reuse": args.reuse, "search.max_steps": args.max_steps, "search.max_new_tokens": args.max_new_tokens,
        "search.method": "spot", "search.latent": "none", "search.w_latent": 0.0,
        "search.concurrency": args.concurrency})
    eval_decision_command(cfg)
    report = json.loads((Path(args.output) / "report.json").read_text())

    print(f"\n{report['counts']['tool']} tool-needing + {report['counts']['free']} tool-free queries, "
          f"method {report['method']}, scoring {report['scoring']}, {report['seconds_total']:.0f} s in all")
    columns = report["decision_by_scoring"] or {"top option": report["decision"]}
    print(f"{'decision (top option), %':26s}" + "".join(f"{k:>11s}" for k in columns))
    for key, label in ROWS:
        print(f"{label:26s}" + "".join(f"{pct(m[key]):>11s}" for m in columns.values()))
    at, base = report["at_threshold"], report["always_search"]
    print(f"\nrouting at t_none={args.t_none}, t_tool={args.t_tool}: routes {at['routes']}, "
          f"fast fallbacks {at['fast_fallbacks']}")
    for key, label in ROWS:
        print(f"{label:26s}{pct(at[key]):>11s}" + (f"{pct(base[key]):>11s}" if base else ""))
    cost = report["decision_cost"]
    print(f"decision: {cost['tokens_per_query']:.0f} tokens, {cost['seconds_per_query']:.2f} s per query")
    if base and at["tokens_per_query"] is not None:
        print(f"router: {at['tokens_per_query']:.0f} tokens, {at['seconds_per_query']:.1f} s per query; always "
              f"search: {base['tokens_per_query']:.0f} tokens, {base['seconds_per_query']:.1f} s; saving "
              f"{100 * report['saving']['tokens']:.1f}% tokens, {100 * report['saving']['seconds']:.1f}% seconds")
    da = report["direct_answers"]
    print(f"direct answers matching the reference (tool-free): {da['correct']}/{da['with_reference']}")


if __name__ == "__main__":
    main()
