"""Benchmark: held-out pairwise accuracy of the PRM with the candidate's output shown vs hidden
(issue 14, ``format.candidate_output``), on the same trees and the same split.

    .venv/bin/python benchmarks/bench_prm_candidate_output.py --trees runs/trees/trees.jsonl \
        [--folds 5] [--work runs/bench-candidate-output] [--train-config configs/train/quickstart.yaml]
        [--epochs 1] [--bootstrap 2000] [--max-folds N] [--max-length 1024 --max-suffix-length 256]

The trees (``codetool build-trees`` records) are relabelled under the current defaults
(``success: grounded``, ``label_rule: ours``) and exported as a PRM dataset. The queries are
split into ``--folds`` groups; for each fold and each of ``show``/``hide`` the PRM is trained
with ``codetool train-prm`` on the other folds' rows and scored with ``codetool eval-prm`` on the
fold's rows, so every held-out pair is scored by a PRM that never saw its query (``--max-folds``
runs only the first folds, to save time). Pairwise
accuracy counts a tie as half. The 95% interval is a bootstrap over held-out queries (pairs of
one query move together); the paired difference uses the same resamples for both inputs.
The machine is shared, so the time it took is only a rough guide.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _result import emit  # noqa: E402


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "codetool.cli", *args], cwd=REPO, check=True)


def pair_outcomes(scores_path: Path, rows_by_source: dict) -> list[tuple[str, float]]:
    """``(query_id, 1 / 0.5 / 0)`` per held-out (positive, negative) sibling pair."""
    from codetool.prm.data import sibling_key

    groups: dict = defaultdict(lambda: ([], []))
    for line in scores_path.read_text().splitlines():
        s = json.loads(line)
        row = rows_by_source[(s["source"], s["label"])]
        groups[sibling_key(row)][0 if s["label"] == 1 else 1].append((s["query_id"], s["score"]))
    out = []
    for pos, neg in groups.values():
        for qid, p in pos:
            for _, q in neg:
                out.append((qid, 1.0 if p > q else 0.5 if p == q else 0.0))
    return out


def bootstrap(outcomes: dict[str, list[tuple[str, float]]], n: int, seed: int = 0) -> dict:
    """Accuracy per input and the show-minus-hide difference, with 95% intervals over queries."""
    names = list(outcomes)
    by_query = {name: defaultdict(list) for name in names}
    for name in names:
        for qid, v in outcomes[name]:
            by_query[name][qid].append(v)
    queries = sorted(set().union(*[set(q) for q in by_query.values()]))
    rng = random.Random(seed)

    def acc(name, sample):
        vals = [v for q in sample for v in by_query[name].get(q, [])]
        return sum(vals) / len(vals) if vals else float("nan")

    draws = {name: [] for name in names}
    diffs = []
    for _ in range(n):
        sample = [rng.choice(queries) for _ in queries]
        a = {name: acc(name, sample) for name in names}
        for name in names:
            draws[name].append(a[name])
        diffs.append(a["show"] - a["hide"])

    def ci(xs):
        xs = sorted(x for x in xs if x == x)
        return [xs[int(0.025 * (len(xs) - 1))], xs[int(0.975 * (len(xs) - 1))]] if xs else [None, None]

    result = {name: {"pairwise_accuracy": acc(name, queries), "pairs": len(outcomes[name]),
                     "ci95": ci(draws[name])} for name in names}
    result["show_minus_hide"] = {"value": result["show"]["pairwise_accuracy"] - result["hide"]["pairwise_accuracy"],
                                 "ci95": ci(diffs)}
    result["held_out_queries"] = len(queries)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", required=True)
    parser.add_argument("--work", default="runs/bench-candidate-output")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--train-config", default="configs/train/quickstart.yaml")
    parser.add_argument("--epochs", default="1")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--max-folds", type=int, default=None)
    parser.add_argument("--max-length", default="1024")
    parser.add_argument("--max-suffix-length", default="256")
    args = parser.parse_args()

    from codetool.jsonl import read_jsonl, write_jsonl
    from codetool.tree.build import label_record, summarize
    from codetool.tree.config import TreeConfig
    from codetool.tree.dataset import tree_rows

    start = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    records = [label_record(r, TreeConfig(), recompute_success=True) for r in read_jsonl(args.trees)]
    summary = summarize(records)
    rows = [row for r in records for row in tree_rows(r)[0]]
    rows_by_source = {(r["source"], r["label"]): r for r in rows}
    queries = sorted({r["query_id"] for r in rows})
    rng = random.Random(0)
    rng.shuffle(queries)
    folds = [queries[i::args.folds] for i in range(min(args.folds, len(queries)))]
    print(f"{len(records)} trees, {len(rows)} rows, {len(queries)} queries with rows, {len(folds)} folds")
    print({k: v for k, v in summary.items() if k.startswith(("pairs", "dropped", "successful", "leaves"))})
    outcomes: dict[str, list] = {"show": [], "hide": []}
    for f, held in enumerate(folds[: args.max_folds]):
        train = [r for r in rows if r["query_id"] not in held]
        test = [r for r in rows if r["query_id"] in held]
        if not train or not test:
            continue
        write_jsonl(work / f"fold{f}-train.jsonl", train)
        write_jsonl(work / f"fold{f}-test.jsonl", test)
        for mode in ("show", "hide"):
            ckpt = work / f"fold{f}-{mode}"
            cli("train-prm", "--config", args.train_config, "--dataset", str(work / f"fold{f}-train.jsonl"),
                "--eval_fraction", "0", "--eval_steps", "0", "--num_train_epochs", args.epochs, "--output_dir", str(ckpt),
                "--format.candidate_output", mode, "--format.max_length", args.max_length,
                "--format.max_suffix_length", args.max_suffix_length)
            cli("eval-prm", "--prm", str(ckpt), "--dataset", str(work / f"fold{f}-test.jsonl"), "--split", "all",
                "--output_dir", str(work / f"fold{f}-{mode}-eval"))
            outcomes[mode] += pair_outcomes(work / f"fold{f}-{mode}-eval" / "scores.jsonl", rows_by_source)
    result = bootstrap(outcomes, args.bootstrap)
    result["pair_counts"] = {k: v for k, v in summary.items() if k.startswith(("pairs_by", "dropped"))}
    result["seconds"] = time.perf_counter() - start
    print(json.dumps(result, indent=2))
    emit(benchmark="prm_candidate_output", **{f"{m}_pairwise_accuracy": result[m]["pairwise_accuracy"]
                                             for m in ("show", "hide")},
         pairs=result["show"]["pairs"], show_minus_hide=result["show_minus_hide"]["value"],
         seconds=result["seconds"])


if __name__ == "__main__":
    main()
