"""Benchmark: the PRM rows of the same trees under ``trees.label_rule: ours`` and ``reference``
(issue 26 item 2): row counts, labels, the rows only the public code writes, and how often its
notion of a failed step disagrees with ours.

    .venv/bin/python benchmarks/bench_label_rules.py --trees runs/quickstart/trees/trees.jsonl \
        [--work /tmp/bench-label-rules] [--success grounded]

The trees (``codetool build-trees`` records, e.g. the quickstart's) are copied and relabelled
with ``codetool build-trees --relabel`` once per rule; under ``reference`` every node's path is
re-run in the sandbox on the same tool backend as the quickstart (the simulator), with the
default queries (ToolBench's examples). Nothing is sampled.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _result import emit  # noqa: E402


def relabel(trees: Path, work: Path, rule: str, success: str) -> tuple[list[dict], list[dict]]:
    out = work / rule
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(trees, out / "trees.jsonl")
    subprocess.run([sys.executable, "-m", "codetool.cli", "build-trees", "--output", str(out / "trees.jsonl"),
                    "--dataset_dir", str(out / "ds"), "--relabel", "--label_rule", rule, "--success", success,
                    "--val_fraction", "0"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "trees.jsonl").read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in (out / "ds" / "prm_examples.jsonl").read_text().splitlines() if line.strip()]
    return records, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-label-rules"))
    parser.add_argument("--success", default="grounded", help="leaf success for the ours rule")
    args = parser.parse_args()
    result: dict[str, dict] = {}
    for rule in ("ours", "reference"):
        records, rows = relabel(args.trees, args.work, rule, args.success)
        counts = Counter()
        for r in records:
            for k, v in r.get("summary", {}).get("pair_counts", {}).get("decided", {}).items():
                counts[k] += v
        result[rule] = {"trees": len(records), "pairs": sum(len(r["pairs"]) for r in records), "rows": len(rows),
                        "yes": sum(r["label"] for r in rows), "no": sum(1 - r["label"] for r in rows),
                        "rows_without_code": sum(1 for r in rows if not r["candidate"]),
                        "pairs_by": dict(counts)}
        if rule == "reference":
            nodes = [(n, r["reference"]["nodes"].get(i)) for r in records for i, n in r["nodes"].items()]
            kept = [(n, ref) for n, ref in nodes if ref is not None]
            result[rule]["both_no_pairs"] = sum(
                1 for r in records for k in range(len(r["pairs"]))
                if [x["label"] for x in r["reference"]["rows"] if x["pair"] == k] == [0, 0])
            result[rule]["status_disagrees_with_ok"] = sum(1 for n, ref in kept if (ref["status"] == 0) != bool(n["ok"]))
            result[rule]["nodes"] = len(kept)
    print(f"{'':28s}{'ours':>10s}{'reference':>12s}")
    for key in ("pairs", "rows", "yes", "no", "rows_without_code"):
        print(f"{key:28s}{result['ours'][key]:>10d}{result['reference'][key]:>12d}")
    ref = result["reference"]
    print(f"reference: {ref['both_no_pairs']} pairs with two 'no' rows; its status (0 = ran) disagrees with our ok "
          f"on {ref['status_disagrees_with_ok']} of {ref['nodes']} nodes")
    print("pairs by what kept them:", {rule: result[rule]["pairs_by"] for rule in result})
    emit(benchmark="label_rules", **{f"{rule}_{k}": v for rule in result for k, v in result[rule].items()
                                     if isinstance(v, int)})


if __name__ == "__main__":
    main()
