"""scripts/slurm (issue 28): the array task and merge commands of the templates, run as Slurm would
run them, give the trees and PRM dataset of the unsharded run; the submit script wires them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codetool.jsonl import read_jsonl

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "scripts" / "slurm"
CODETOOL = str(Path(sys.executable).with_name("codetool"))


def _run(args: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(args, env={**os.environ, "CODETOOL": CODETOOL, **(env or {})}, cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _strip(record: dict) -> dict:
    record = dict(record)
    record.pop("summary")
    for node in record["nodes"].values():
        node["result"].pop("duration_s", None)
    return record


@pytest.mark.slow
def test_the_array_task_and_merge_commands_give_the_unsharded_trees(tiny_model_dir, shared_data, tmp_path):
    queries = shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json"
    options = ["--queries", str(queries), "--policy", str(tiny_model_dir), "--max_depth", "2", "--limit", "3",
               "--search.max_new_tokens", "6", "--executor.isolation", "fallback", "--val_fraction", "0.34",
               "--emit", "nodes", "--log-level", "WARNING"]  # default batch_trees: shards batch other trees
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    _run([CODETOOL, "build-trees", *options, "--output", str(single / "trees.jsonl"),
          "--dataset_dir", str(single / "prm")])
    args = [*options, "--output", str(sharded / "trees.jsonl"), "--dataset_dir", str(sharded / "prm")]
    for task in (0, 1):  # what Slurm runs for `sbatch --array=0-1 build_trees.sbatch ARGS`
        _run(["bash", str(SLURM / "build_trees.sbatch"), *args],
             env={"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": "2"})
    assert sorted(p.name for p in sharded.glob("*.jsonl")) == ["trees.shard-0-of-2.jsonl", "trees.shard-1-of-2.jsonl"]
    _run(["bash", str(SLURM / "merge_trees.sbatch"), *args])
    a = [_strip(r) for r in read_jsonl(single / "trees.jsonl")]
    b = [_strip(r) for r in read_jsonl(sharded / "trees.jsonl")]
    assert [r["query_id"] for r in a] == ["G1_query/1", "G1_query/2", "G1_query/3"]
    assert a == b
    for name in ("prm_examples.jsonl", "train.jsonl", "validation.jsonl"):
        assert (single / "prm" / name).read_text() == (sharded / "prm" / name).read_text()


def test_an_array_task_outside_slurm_says_how_to_submit_it(tmp_path):
    out = subprocess.run(["bash", str(SLURM / "build_trees.sbatch")], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert out.returncode != 0 and "sbatch --array=0-<n-1>" in out.stderr


def test_submit_wires_the_merge_after_every_array_task(tmp_path):
    """A stand-in ``sbatch`` on PATH records what submit_trees.sh asks for."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    "print('4242;cluster' if any(a.startswith('--array') for a in sys.argv) else '4243')\n")
    fake.chmod(0o755)
    out = _run(["bash", str(SLURM / "submit_trees.sh"), "4", "--config", "trees.yaml"],
               env={"PATH": f"{fake.parent}:{os.environ['PATH']}", "SBATCH_ARGS": "--partition=cpu"})
    assert out.stdout.strip() == "array job 4242 (4 shards), merge job 4243"
    array, merge = [json.loads(line) for line in log.read_text().splitlines()]
    assert array == ["--parsable", "--partition=cpu", "--array=0-3", str(SLURM / "build_trees.sbatch"),
                     "--config", "trees.yaml"]
    assert merge == ["--parsable", "--partition=cpu", "--dependency=afterany:4242", str(SLURM / "merge_trees.sbatch"),
                     "--config", "trees.yaml"]
