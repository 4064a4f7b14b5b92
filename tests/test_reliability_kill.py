"""`kill -9` after the first record, then rerun (issue 19): nothing lost, nothing duplicated, no
half line. Each job runs in a subprocess with a scripted policy that is slow on the first pass."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DRIVER = '''
import sys, time
import codetool.assemble as assemble
from codetool.models.backends import ScriptedBackend

delay, mode = float(sys.argv[1]), sys.argv[2]
count = [0]

def reply(prompt):
    time.sleep(delay)
    count[0] += 1
    if mode == "pairs" and len(prompt) <= 3:  # first step: one sibling works, the other fails
        return "print('looked it up')\\n```" if count[0] % 2 else "raise KeyError('no such field')\\n```"
    return "finish('ok')\\n```"

assemble.make_policy = lambda *a, **k: ScriptedBackend(reply)
from codetool.cli import main
sys.exit(main(sys.argv[3:]))
'''


def _queries(folder: Path) -> Path:
    folder.mkdir()
    api = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
           "required_parameters": [{"name": "city", "type": "STRING", "description": "city"}],
           "optional_parameters": [], "method": "GET"}
    for group in ("G1", "G2"):
        queries = [{"query_id": i, "query": f"{group} weather {i}?", "api_list": [api]} for i in (1, 2, 3)]
        (folder / f"{group}.json").write_text(json.dumps(queries))
    return folder


def _start(tmp_path: Path, delay: float, args: list[str], mode: str = "finish") -> subprocess.Popen:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, str(driver), str(delay), mode, *args], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_after_first_record(proc: subprocess.Popen, path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= 1:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended before writing a record: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no record within the time limit")


def _check_clean(path: Path, key) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]  # every line parses: no half line
    keys = [key(r) for r in records]
    assert len(keys) == len(set(keys)), "duplicated records"
    return records


def test_run_survives_sigkill(tmp_path):
    queries = _queries(tmp_path / "queries")
    out = tmp_path / "traj.jsonl"
    args = ["run", "--benchmark", "toolbench", "--queries", str(queries), "--output", str(out), "--prm", "none",
            "--search.k", "1", "--search.max_steps", "1", "--search.concurrency", "1",
            "--executor.isolation", "fallback"]
    _kill_after_first_record(_start(tmp_path, 0.5, args), out)
    assert len(_check_clean(out, lambda r: (r["group"], r["query_id"]))) < 6
    proc = _start(tmp_path, 0.0, args)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]
    records = _check_clean(out, lambda r: (r["group"], r["query_id"]))
    assert sorted((r["group"], r["query_id"]) for r in records) == [(g, str(i)) for g in ("G1", "G2") for i in (1, 2, 3)]
    assert all(r["finish_type"] == "finish" for r in records)


def test_build_trees_survives_sigkill(tmp_path):
    queries = _queries(tmp_path / "queries")
    out = tmp_path / "trees.jsonl"
    args = ["build-trees", "--queries", str(queries), "--output", str(out), "--dataset_dir", str(tmp_path / "prm"),
            "--branching", "2", "--max_depth", "1", "--batch_trees", "1", "--executor.isolation", "fallback"]
    _kill_after_first_record(_start(tmp_path, 0.3, args), out)
    proc = _start(tmp_path, 0.0, args)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-2000:]
    records = _check_clean(out, lambda r: r["query_id"])
    assert sorted(r["query_id"] for r in records) == [f"{g}/{i}" for g in ("G1", "G2") for i in (1, 2, 3)]


PIPELINE_YAML = """
name: killed
runs_dir: {runs}
trees: {{branching: 2, max_depth: 2, limit: 4, batch_trees: 1, val_fraction: 0.25, queries: {queries}}}
train: {{model: {model}, num_train_epochs: 1, per_device_train_batch_size: 4, eval_steps: 0, save_steps: 100, logging_steps: 1}}
search: {{max_steps: 2, max_new_tokens: 16, concurrency: 1}}
methods:
  - {{name: single-sample, k: 1, w_latent: 0.0, latent: none, temperature: 0.0}}
  - {{name: spot+latent, k: 2, latent: prm}}
evals:
  - {{benchmark: stabletoolbench, limit: 2}}
judge: {{model: none}}
executor: {{isolation: fallback, timeout_s: 10}}
"""


def test_pipeline_survives_sigkill(tmp_path, tiny_model_dir, shared_data):
    queries = _queries(tmp_path / "queries")
    config = tmp_path / "p.yaml"
    config.write_text(PIPELINE_YAML.format(runs=tmp_path / "runs", queries=queries, model=tiny_model_dir))
    trees = tmp_path / "runs" / "killed" / "trees" / "trees.jsonl"
    _kill_after_first_record(_start(tmp_path, 0.3, ["pipeline", "--config", str(config)], "pairs"), trees)
    proc = _start(tmp_path, 0.0, ["pipeline", "--config", str(config)], "pairs")
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    assert len(_check_clean(trees, lambda r: r["query_id"])) == 4
    runs = list((tmp_path / "runs" / "killed" / "search").rglob("*.jsonl"))
    assert runs and all(len(_check_clean(p, lambda r: (r["group"], r["query_id"]))) == 2 for p in runs)


LEVELS_DRIVER = '''
import json, sys, time
import codetool.assemble as assemble
from codetool.models.completion import Completion, to_messages

delay, log = float(sys.argv[1]), sys.argv[2]


class Policy:
    """Each sample's code follows from its prompt's own seed (one per node); depth 2 finishes.
    Slow from depth 1 on (the first pass is killed there); every call's depths are logged."""

    name, supports_logprobs = "levels", False

    def generate(self, prompts, n=1, seed=None, **_):
        depths = [(len(to_messages(p)) - 3) // 2 for p in prompts]
        with open(log, "a") as f:
            f.write(json.dumps(depths) + "\\n")
        if max(depths) >= 1:
            time.sleep(delay)
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        return [[Completion((f"finish('{s}-{i}')" if d >= 2 else f"x = {s % 1000 + i}\\nprint(x)") + "\\n```", 5, 3,
                            "stop") for i in range(n)] for d, s in zip(depths, seeds)]


assemble.make_policy = lambda *a, **k: Policy()
from codetool.cli import main
sys.exit(main(sys.argv[3:]))
'''


def test_build_trees_sigterm_keeps_the_finished_levels_and_the_resumed_trees_are_the_same(tmp_path):
    """Issue 40: no tree was recorded until it was complete (23 minutes of depth-1 nodes lost to a
    SIGTERM) and ``<output>.lock`` stayed behind. Now each level's nodes are logged beside the
    output, SIGTERM unwinds (exit 143, no lock left), and the rerun starts from the logged level:
    it never samples the roots again, and its trees equal an uninterrupted run's."""
    queries = _queries(tmp_path / "queries")
    driver = tmp_path / "levels.py"
    driver.write_text(LEVELS_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def start(out: Path, delay: float, calls: Path) -> subprocess.Popen:
        args = ["build-trees", "--queries", str(queries), "--output", str(out), "--dataset_dir", str(out.parent / "prm"),
                "--branching", "2", "--max_depth", "3", "--limit", "2", "--executor.isolation", "fallback"]
        return subprocess.Popen([sys.executable, str(driver), str(delay), str(calls), *args], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    out, calls = tmp_path / "killed" / "trees.jsonl", tmp_path / "calls-killed.jsonl"
    nodes = Path(str(out) + ".nodes")
    proc = start(out, 30.0, calls)  # depth 1 waits long: the kill lands there
    deadline = time.monotonic() + 120
    while not (nodes.exists() and nodes.read_bytes().count(b"\n") >= 2) and proc.poll() is None:
        assert time.monotonic() < deadline, "no level logged within the time limit"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, proc.stderr.read().decode()[-2000:]
    assert "terminated (SIGTERM)" in proc.stderr.read().decode()
    assert not Path(str(out) + ".lock").exists() and (not out.exists() or out.read_text() == "")
    logged = [json.loads(line) for line in nodes.read_text().splitlines()]
    assert sorted(k for line in logged for k in line["nodes"]) == ["1", "1", "2", "2"]  # depth 1 of both trees

    resumed_calls = tmp_path / "calls-resumed.jsonl"
    again = start(out, 0.0, resumed_calls)
    assert again.wait(timeout=120) == 0, again.stderr.read().decode()[-2000:]
    assert all(0 not in json.loads(line) for line in resumed_calls.read_text().splitlines())  # no root sampled again
    assert not nodes.exists() and not Path(str(out) + ".lock").exists()

    whole = tmp_path / "whole" / "trees.jsonl"
    assert start(whole, 0.0, tmp_path / "calls-whole.jsonl").wait(timeout=120) == 0

    def trees(path):
        return {r["query_id"]: ({k: (n["code"], n["text"], n["ok"], n["leaf"], n["success"]) for k, n in r["nodes"].items()},
                                r["pairs"]) for r in map(json.loads, path.read_text().splitlines())}

    assert trees(out) == trees(whole) and len(trees(whole)) == 2
    assert all(len(tree) == 14 for tree, _ in trees(whole).values())
