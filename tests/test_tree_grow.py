"""Trees grown node by node (continuous scheduling) label like trees grown level by level: the
reference rule's re-runs happen at build time, off the scheduling thread, here and in the
``TreeRunner`` that ``build-trees`` (and each Ray worker) runs."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from codetool.executor import Executor, ExecutorConfig
from codetool.models.completion import Completion, to_messages
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tree.build import TreeBuilder
from codetool.tree.config import TreeConfig
from codetool.tree.grow import grow
from codetool.tree.reference import reference_runner
from codetool.tree.search_settings import TreeSearch

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)
SEARCH = TreeSearch(step_format="step_text", code_prefix=False, max_new_tokens=256)


class SiblingPolicy:
    """A server-like policy (``continuous``) whose reply depends on the depth and the sample index
    only, so any schedule grows the same tree: at depth 0 a tool call, then a KeyError; below, a
    finish, then a reply without code (tests/test_tree_reference.py's tree)."""

    name, supports_logprobs, continuous, max_in_flight = "siblings", False, True, 8

    def generate(self, prompts, n=1, **_):
        rows = []
        for prompt in prompts:
            depth = (len(to_messages(prompt)) - 2) // 2
            texts = (["```python\nprint(checkhealth_for_squake())\n```", "```python\nx = {}['k']\nprint(x)\n```"]
                     if depth == 0 else ["```python\nfinish('the answer')\n```", "I would rather not write code here."])
            rows.append([Completion(texts[i % 2], 5, 3, "stop") for i in range(n)])
        return rows


def make(task):
    return Executor(EXEC, tools=task.env.functions())


@pytest.fixture(scope="module")
def queries(shared_data):
    from codetool.tools.loaders import load_toolbench_queries

    return load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")


def test_continuous_trees_get_the_reference_labels_of_rounds_off_the_scheduling_thread(queries):
    task = SearchTask("G1_query/1", queries[0].query,
                      ToolEnvironment.from_query(queries[0], make_tool_backend("simulator")))
    started_in = []

    def runner(t):
        started_in.append(threading.current_thread().name)
        return reference_runner(t, make)

    records = {}
    for schedule in ("rounds", "continuous"):
        cfg = TreeConfig(branching=2, max_depth=2, label_rule="reference",
                         search=dataclasses.replace(SEARCH, schedule=schedule))
        builder = TreeBuilder(SiblingPolicy(), cfg, make, make_reference_runner=runner)
        assert builder.continuous is (schedule == "continuous")
        if builder.continuous:
            got = []
            grow(builder, [task], got.append, trees=2, workers=4)
            records[schedule] = got[0]
        else:
            records[schedule] = builder.build(task)
    rounds, continuous = records["rounds"], records["continuous"]
    ref = continuous["reference"]["nodes"]
    assert [ref[n]["status"] for n in ("1", "1-1", "1-2", "2", "2-1", "2-2")] == [0, 0, 0, 1, 1, 0]
    assert continuous["pairs"] == rounds["pairs"] == [["1", "2"], ["2-1", "2-2"]]
    assert continuous["reference"]["rows"] == rounds["reference"]["rows"]
    assert continuous["reference_runs"] == rounds["reference_runs"]
    assert started_in[0] == threading.current_thread().name  # rounds: labelled where the batch ran
    assert started_in[1].startswith("codetool-tree")  # continuous: a job of the pool, the server stays busy


def test_tree_runner_grows_continuously_with_the_reference_rule(queries, shared_data, tmp_path, monkeypatch):
    import codetool.assemble as assemble
    from codetool.commands.build_trees import build_trees_command
    from codetool.jobs.trees import TreeRunner
    from codetool.jsonl import read_jsonl

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: SiblingPolicy())
    grown = []
    monkeypatch.setattr("codetool.tree.grow.grow", lambda *a, **k: grown.append(k) or grow(*a, **k))
    cfg = TreeConfig(queries=str(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json"),
                     output=str(tmp_path / "trees.jsonl"), dataset_dir=str(tmp_path / "ds"), limit=2, branching=2,
                     max_depth=2, label_rule="reference", val_fraction=0.0, executor=EXEC, search=SEARCH)
    assert build_trees_command(cfg) == 0
    assert grown and grown[0]["trees"] == 8 and grown[0]["workers"] == 8  # batch_trees auto: at least 8
    records = sorted(read_jsonl(tmp_path / "trees.jsonl"), key=lambda r: r["query_id"])  # in completion order
    assert [r["query_id"] for r in records] == ["G1_query/1", "G1_query/2"]
    assert records[0]["pairs"] == [["1", "2"], ["2-1", "2-2"]] and records[0]["label_rule"] == "reference"
    assert all(len(r["nodes"]) == 6 and r["reference_runs"] for r in records)
    assert (tmp_path / "ds" / "train.jsonl").is_file()
    with TreeRunner(cfg, "h") as runner:  # a Ray worker's runner: the same per-unit scheduling inside
        assert runner.builder.continuous and runner.builder.trees == 8
