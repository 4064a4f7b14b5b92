"""The tree builder: expansion, leaves, labels, sharding, merging and the dataset export."""

from __future__ import annotations

import json

import pytest

from codetool.commands.build_trees import build_trees_command
from codetool.config import ConfigError, load_config
from codetool.executor import Executor, ExecutorConfig
from codetool.jsonl import read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.models.completion import Completion
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tree.build import TreeBuilder, tree_seed
from codetool.tree.config import TreeConfig

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


def block(code: str) -> str:
    return f"{code}\n```"  # continues the opening fence the search puts in


@pytest.fixture(scope="module")
def task(shared_data):
    from codetool.tools.loaders import load_toolbench_queries

    q = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[0]
    return SearchTask(query_id="G1_query/1", query=q.query, env=ToolEnvironment.from_query(q, make_tool_backend("simulator")))


def depth_policy():
    """Depth 1: candidate 1 calls a listed tool, candidate 2 fails. Depth 2: finish with an answer /
    give up."""
    counter = {"n": 0}

    def reply(prompt):
        depth = (len(prompt) - 3) // 2  # system + user + the opening fence, then 2 messages per step
        counter["n"] += 1
        if depth == 0:
            return block("print(checkhealth_for_squake())") if counter["n"] % 2 else block("raise KeyError('k')")
        return block("finish('Kestrel Ember')") if counter["n"] % 2 else block("give_up('stuck')")
    return ScriptedBackend(reply)


def test_builder_expands_labels_and_pairs(task):
    cfg = TreeConfig(branching=2, max_depth=3)
    record = TreeBuilder(depth_policy(), cfg, lambda t: Executor(EXEC, tools=t.env.functions())).build(task)
    nodes = record["nodes"]
    assert sorted(nodes) == ["1", "1-1", "1-2", "2", "2-1", "2-2"]
    assert nodes["1"]["ok"] and not nodes["2"]["ok"]
    assert nodes["1-1"]["leaf"] and nodes["1-1"]["ended"] == "finish" and nodes["1-1"]["success"] is True
    assert nodes["1-2"]["ended"] == "give_up" and nodes["1-2"]["success"] is False
    assert nodes["1"]["lr_soft"] == 0.5 and nodes["1"]["tau"] == 1.0
    # below the failed node 2 no path calls a tool: 2-1's finish is no success, (2-1, 2-2) is dropped
    assert nodes["2-1"]["ended"] == "finish" and nodes["2-1"]["success"] is False
    assert record["summary"]["leaves"] == 4 and record["summary"]["pairs"] == 2
    assert ["1", "2"] in [list(p) for p in record["pairs"]]  # executability decides
    assert record["summary"]["pair_counts"] == {
        "decided": {"executability": 1, "success_share": 1, "latent_reward": 0},
        "dropped": {"no_success_difference": 1, "both_failed": 0, "tie": 0, "not_executed": 0, "same_step": 0}}
    assert record["tool_names"] == ["checkhealth_for_squake", "projects_for_squake"]
    json.dumps(record)  # JSON-able


def test_trees_grown_together_share_each_levels_generate_call(shared_data):
    from codetool.tools.loaders import load_toolbench_queries

    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[:3]
    tasks = [SearchTask(query_id=f"G1_query/{q.query_id}", query=q.query,
                        env=ToolEnvironment.from_query(q, make_tool_backend("simulator"))) for q in queries]
    policy = ScriptedBackend(lambda prompt: block("print(checkhealth_for_squake())") if len(prompt) <= 3
                             else block("finish(str(checkhealth_for_squake()))"))
    records = TreeBuilder(policy, TreeConfig(branching=2, max_depth=3),
                          lambda t: Executor(EXEC, tools=t.env.functions())).build_many(tasks)
    assert [r["query_id"] for r in records] == [t.query_id for t in tasks]
    assert len(policy.calls) == 2  # one call per level, for all three trees
    assert [len(prompts) for prompts, _ in policy.calls] == [3, 6]
    for r in records:
        assert sorted(r["nodes"]) == ["1", "1-1", "1-2", "2", "2-1", "2-2"]
        assert r["summary"]["successful_leaves"] == 4 and r["summary"]["seconds"] > 0


def test_failure_policy_stop_and_success_executed(task):
    cfg = TreeConfig(branching=2, max_depth=3, failure_policy="stop", success="executed")
    record = TreeBuilder(depth_policy(), cfg, lambda t: Executor(EXEC, tools=t.env.functions())).build(task)
    nodes = record["nodes"]
    assert nodes["2"]["leaf"] and "2-1" not in nodes  # a failed node is not expanded
    assert nodes["1-2"]["success"] is True  # give_up ran without error: "executed" counts it


class RepeatingPolicy:
    """At depth 0 the same call twice, then (a second draw) that call and another; below, always the
    same finish twice: a policy that repeats itself."""

    name, supports_logprobs = "repeating", False

    def __init__(self):
        self.calls: list[int] = []  # prompts per generate call

    def generate(self, prompts, n=1, **_):
        self.calls.append(len(prompts))
        rows = []
        for prompt in prompts:
            depth = (len(prompt) - 3) // 2  # system + user + the opening fence, then 2 messages per step
            first = sum(self.calls) == len(prompts) if depth == 0 else True
            texts = ([block("print(checkhealth_for_squake())")] * 2 if first
                     else [block("print(checkhealth_for_squake())"), block("x = 1\nprint(x)")]) if depth == 0 \
                else [block("finish('Kestrel Ember')")] * 2
            rows.append([Completion(texts[i % 2], 5, 3, "stop") for i in range(n)])
        return rows


def test_distinct_draws_give_a_node_different_children_or_fewer(task):
    make = lambda t: Executor(EXEC, tools=t.env.functions())  # noqa: E731
    record = TreeBuilder(RepeatingPolicy(), TreeConfig(branching=2, max_depth=2), make).build(task)
    assert sorted(record["nodes"]) == ["1", "1-1", "1-2", "2", "2-1", "2-2"]  # repeats kept (the public code)
    assert record["summary"]["pairs"] == 0 and record["summary"]["pair_counts"]["dropped"]["same_step"] == 3
    policy = RepeatingPolicy()
    record = TreeBuilder(policy, TreeConfig(branching=2, max_depth=2, distinct_draws=1), make).build(task)
    nodes = record["nodes"]
    assert sorted(nodes) == ["1", "1-1", "2", "2-1"]  # a second draw found another first step; none below
    assert "checkhealth" in nodes["1"]["code"] and nodes["2"]["code"] == "x = 1\nprint(x)"
    assert policy.calls == [1, 1, 2, 2]  # the root twice, then both first steps twice
    # the first child carries the node's sampling cost: both draws' prompts, the two repeats dropped
    assert (nodes["1"]["prompt_tokens"], nodes["1"]["completion_tokens"]) == (10, 9)
    assert (nodes["2"]["prompt_tokens"], nodes["2"]["completion_tokens"]) == (0, 3)
    with pytest.raises(ConfigError, match="distinct_draws"):
        TreeConfig(distinct_draws=-1)


def test_judged_success_needs_a_judge(task):
    with pytest.raises(ConfigError, match="needs a judge"):
        TreeBuilder(depth_policy(), TreeConfig(success="judged"), None)
    with pytest.raises(ConfigError, match="trees.judge"):  # was an AttributeError
        TreeConfig(success="judged", judge="none")
    cfg = TreeConfig(branching=2, max_depth=3, success="judged")
    builder = TreeBuilder(depth_policy(), cfg, lambda t: Executor(EXEC, tools=t.env.functions()),
                          judge=lambda query, answer: False)
    assert all(not n["success"] for n in builder.build(task)["nodes"].values() if n["leaf"])


def test_judged_success_is_grounded_first(task):
    # a judge that says Solved to everything still cannot make a tool-free finish a success
    policy = ScriptedBackend(lambda prompt: block("finish('made up')") if len(prompt) <= 3 else block("x"))
    asked = []
    builder = TreeBuilder(policy, TreeConfig(branching=2, max_depth=2, success="judged"),
                          lambda t: Executor(EXEC, tools=t.env.functions()),
                          judge=lambda query, answer: asked.append(answer) or True)
    record = builder.build(task)
    assert record["summary"]["successful_leaves"] == 0 and asked == []
    assert record["summary"]["pair_counts"]["dropped"]["same_step"] == 1  # two identical finish('made up')


def test_relabel_prints_pair_counts_by_reason(task, tmp_path, capsys):
    record = TreeBuilder(depth_policy(), TreeConfig(branching=2, max_depth=3),
                         lambda t: Executor(EXEC, tools=t.env.functions())).build(task)
    out = tmp_path / "trees.jsonl"
    out.write_text(json.dumps(record) + "\n")
    cfg = load_config(TreeConfig, overrides={"output": str(out), "dataset_dir": str(tmp_path / "ds"),
                                             "relabel": True, "success": "executed", "val_fraction": 0.0})
    assert build_trees_command(cfg) == 0
    printed = capsys.readouterr().out
    assert "pairs by executability" in printed and "dropped no success difference" in printed
    # executed: give_up (1-2) succeeds as well as the finish, so only executability decides
    relabelled = next(iter(read_jsonl(out)))
    assert relabelled["success_mode"] == "executed" and relabelled["pairs"] == [["1", "2"]]
    summary = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert summary["pair_counts"]["decided"]["executability"] == 1 and summary["train"] == 2


class SeedEcho:
    """Each sample's code is a function of its prompt's own seed and its index (a list of seeds
    has one per prompt; one int is the call's): a tree then shows which seeds its nodes got."""

    name, supports_logprobs, max_in_flight = "seed-echo", False, 8

    def __init__(self, continuous: bool = False):
        self.continuous = continuous

    def generate(self, prompts, n=1, seed=None, **_):
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        rows = []
        for prompt, s in zip(prompts, seeds):
            depth = (len(prompt) - 3) // 2
            code = [f"x = {s}\nprint(x + {i})" if depth < 2 else f"finish('{s}-{i}')" for i in range(n)]
            rows.append([Completion(block(c), 5, 3, "stop") for c in code])
        return rows


def test_a_tree_is_the_same_whatever_trees_share_its_batch(shared_data):
    """Issue 39: a tree grown level by level drew its samples from the first tree's seed plus the
    nodes built so far, so a Slurm shard and the unsharded run built different trees. Each node's
    seed now comes from its tree and its id: alone, batched with others, in another order, or
    grown node by node (continuous scheduling), a tree is the same."""
    from codetool.tools.loaders import load_toolbench_queries
    from codetool.tree.grow import grow

    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[:3]
    tasks = [SearchTask(query_id=f"G1_query/{q.query_id}", query=q.query,
                        env=ToolEnvironment.from_query(q, make_tool_backend("simulator"))) for q in queries]

    def codes(records):
        return {r["query_id"]: {k: n["code"] for k, n in r["nodes"].items()} for r in records}

    def builder(policy):
        return TreeBuilder(policy, TreeConfig(branching=2, max_depth=3), lambda t: Executor(EXEC, tools=t.env.functions()))

    together = codes(builder(SeedEcho()).build_many(tasks))
    alone = codes([builder(SeedEcho()).build(t) for t in tasks])
    shards = codes(builder(SeedEcho()).build_many(tasks[::2]) + builder(SeedEcho()).build_many(tasks[1:2]))
    grown = []
    grow(builder(SeedEcho(continuous=True)), tasks, grown.append, trees=2, workers=3)
    assert together == alone == shards == codes(grown)
    assert all(len(nodes) == 14 for nodes in together.values())
    first = together[tasks[0].query_id]
    assert len({first[k] for k in ("1", "2")}) == 2 and first["1-1"] != together[tasks[1].query_id]["1-1"]


def test_a_tree_continued_from_its_logged_nodes_is_the_tree_built_whole(shared_data, tmp_path):
    """Issue 40: each level's (or node's) children are logged as they are built; a build killed
    after the first level continues from it, level by level or node by node, never sampling the
    roots again, and grows the trees an uninterrupted build grows."""
    from codetool.tools.loaders import load_toolbench_queries
    from codetool.tree.checkpoint import NodeLog, open_nodes, read_partial
    from codetool.tree.grow import grow

    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[:2]
    tasks = [SearchTask(query_id=f"G1_query/{q.query_id}", query=q.query,
                        env=ToolEnvironment.from_query(q, make_tool_backend("simulator"))) for q in queries]

    def builder(policy):
        return TreeBuilder(policy, TreeConfig(branching=2, max_depth=3), lambda t: Executor(EXEC, tools=t.env.functions()))

    def codes(records):
        return {r["query_id"]: ({k: (n["code"], n["observation"], n["leaf"], n["success"]) for k, n in r["nodes"].items()},
                                r["pairs"]) for r in records}

    logged = builder(SeedEcho())
    logged.node_log = NodeLog(tmp_path / "all.nodes", logged.chash)
    whole = codes(logged.build_many(tasks))
    logged.node_log.close()
    lines = (tmp_path / "all.nodes").read_text().splitlines()
    assert len(lines) == 2 * 3  # one line per tree and level
    (tmp_path / "cut.nodes").write_text("\n".join(lines[:2]) + "\n")  # killed after the first level
    partial = read_partial(tmp_path / "cut.nodes", logged.chash, {t.query_id for t in tasks})
    assert [open_nodes(p["nodes"]) for p in partial.values()] == [["1", "2"], ["1", "2"]]

    class Counting(SeedEcho):
        depths: list = []

        def generate(self, prompts, **kwargs):
            self.depths += [(len(p) - 3) // 2 for p in prompts]
            return super().generate(prompts, **kwargs)

    assert codes(builder(Counting()).build_many(tasks, partial)) == whole
    assert 0 not in Counting.depths and Counting.depths  # the roots were not sampled again
    grown = []
    grow(builder(SeedEcho(continuous=True)), tasks, grown.append, trees=2, workers=3, partial=partial)
    assert codes(grown) == whole
    assert read_partial(tmp_path / "cut.nodes", "another config", {t.query_id for t in tasks}) == {}


def test_a_local_model_s_batched_trees_equal_the_trees_built_alone(tiny_model_dir, shared_data):
    """The same with a local transformers policy: its batched ``generate`` draws each node's
    samples from the node's own generator (one seed per prompt)."""
    from codetool.models.transformers_backend import TransformersBackend
    from codetool.tools.loaders import load_toolbench_queries
    from codetool.tree.search_settings import TreeSearch

    queries = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[:3]
    tasks = [SearchTask(query_id=f"G1_query/{q.query_id}", query=q.query,
                        env=ToolEnvironment.from_query(q, make_tool_backend("simulator"))) for q in queries]
    policy = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")
    builder = TreeBuilder(policy, TreeConfig(branching=2, max_depth=2, search=TreeSearch(max_new_tokens=8)),
                          lambda t: Executor(EXEC, tools=t.env.functions()))

    def texts(records):
        return {r["query_id"]: {k: n["text"] for k, n in r["nodes"].items()} for r in records}

    together = texts(builder.build_many(tasks))
    assert together == texts([builder.build(t) for t in tasks[::-1]])
    assert len({t for nodes in together.values() for t in nodes.values()}) > 3  # they did sample


def test_tree_seed_depends_only_on_query_and_base():
    assert tree_seed(0, "a") == tree_seed(0, "a") != tree_seed(1, "a")


@pytest.mark.slow
def test_shards_merge_to_the_single_run(tiny_model_dir, shared_data, tmp_path):
    base = {"queries": str(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json"),
            "policy": str(tiny_model_dir), "max_depth": 2, "limit": 3, "search.max_new_tokens": 6,
            "executor.isolation": "fallback", "val_fraction": 0.34}  # batch_trees: its default (a batch of 3 here)
    single = tmp_path / "single" / "trees.jsonl"
    sharded = tmp_path / "sharded" / "trees.jsonl"
    assert build_trees_command(load_config(TreeConfig, overrides={**base, "output": str(single)})) == 0
    for i in range(2):
        assert build_trees_command(load_config(TreeConfig, overrides={**base, "output": str(sharded),
                                                                      "shard": f"{i}/2"})) == 0
    assert build_trees_command(load_config(TreeConfig, overrides={**base, "output": str(sharded), "merge": True})) == 0

    def strip(r):
        r = dict(r)
        r.pop("summary")
        for n in r["nodes"].values():
            n["result"].pop("duration_s", None)
        return r
    a, b = [strip(r) for r in read_jsonl(single)], [strip(r) for r in read_jsonl(sharded)]
    assert [r["query_id"] for r in a] == ["G1_query/1", "G1_query/2", "G1_query/3"]
    assert a == b
    # a rerun resumes: nothing is rebuilt
    before = single.read_text()
    assert build_trees_command(load_config(TreeConfig, overrides={**base, "output": str(single)})) == 0
    assert single.read_text() == before


class MachineFails:
    """An executor whose run of any code containing ``# lost`` is not executed (as the executor
    reports a failure of the machine after its retries); everything else runs for real."""

    def __init__(self, inner):
        self.inner = inner

    def run(self, code, **kw):
        from codetool.executor.result import ExecutionResult

        if "# lost" in code:
            return ExecutionResult(ok=False, outcome="not_executed", error_type="NotExecuted", attempts=3,
                                   error_message="the fork did not start (host busy); nothing ran")
        return self.inner.run(code, **kw)

    def fork(self):
        return MachineFails(self.inner.fork())

    def close(self):
        self.inner.close()

    @property
    def closed(self):
        return self.inner.closed


def test_a_node_the_machine_could_not_run_is_a_leaf_without_label(task, tmp_path):
    # depth 1: a tool call, and a KeyError that the machine failed to run (it would have lost)
    replies = iter([block("print(checkhealth_for_squake())"), block("raise KeyError('k')  # lost"),
                    block("finish('Kestrel Ember')"), block("give_up('stuck')")])
    policy = ScriptedBackend(lambda p: next(replies))
    cfg = TreeConfig(branching=2, max_depth=3)
    record = TreeBuilder(policy, cfg, lambda t: MachineFails(Executor(EXEC, tools=t.env.functions()))).build(task)
    nodes = record["nodes"]
    assert sorted(nodes) == ["1", "1-1", "1-2", "2"]          # 2 is not expanded: nothing to grow from
    assert nodes["2"]["leaf"] and nodes["2"]["executed"] is False and nodes["2"]["success"] is None
    assert nodes["2"]["result"]["attempts"] == 3
    # (1, 2) would have gone to 1 by executability; 2 did not fail, it did not run: dropped
    assert ["1", "2"] not in [list(p) for p in record["pairs"]]
    assert record["summary"]["pair_counts"]["dropped"]["not_executed"] == 1
    assert record["summary"]["not_executed"] == 1 and record["summary"]["leaves"] == 2
    from codetool.tree.build import summarize
    from codetool.tree.dataset import export_dataset

    assert summarize([record])["not_executed"] == 1
    assert record["summary"]["retried"] == 1 and summarize([record])["retried"] == 1  # 3 attempts: retried
    stats = export_dataset([record], tmp_path)
    assert stats["not_executed_nodes"] == 1 and stats["pair_counts"]["dropped"]["not_executed"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["not_executed_nodes"] == 1


class RaisesInFork(MachineFails):
    """An executor whose forks below the root raise (a sandbox root that died mid-build)."""

    def __init__(self, inner, depth=0):
        super().__init__(inner)
        self.depth = depth

    def fork(self):
        if self.depth >= 1:
            from codetool.executor import ExecutorError

            raise ExecutorError("the sandbox root process failed: [Errno 32] Broken pipe")
        return RaisesInFork(self.inner.fork(), self.depth + 1)


def test_a_tree_whose_executor_raised_is_the_machines_failure(task):
    """An executor that raised in a step (no step's code makes it raise) ends the tree as an error
    record that says ``not_executed``, counted apart in the summary; a policy that raised does not.
    Before: both were plain errors."""
    from codetool.tree.build import summarize

    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = TreeConfig(branching=2, max_depth=3)
    record = TreeBuilder(policy, cfg, lambda t: RaisesInFork(Executor(EXEC, tools=t.env.functions()))).build(task)
    assert record["finish_type"] == "error" and record["not_executed"] is True and record["pairs"] == []
    assert "sandbox root process failed" in record["error"]

    def broken(prompt):
        raise RuntimeError("a bug in the policy backend")

    other = TreeBuilder(ScriptedBackend(broken), cfg, lambda t: Executor(EXEC, tools=t.env.functions())).build(task)
    assert other["finish_type"] == "error" and "not_executed" not in other
    assert summarize([record, other])["errors"] == 2 and summarize([record, other])["errors_not_executed"] == 1


def test_a_tree_job_error_record_says_when_the_machine_failed():
    """The job's own error records (a tree the runner could not build) decide with the same
    predicate as the search: a sandbox that could not start is ``not_executed``, a malformed entry not."""
    from types import SimpleNamespace

    from codetool import CodetoolError
    from codetool.executor import ExecutorError
    from codetool.jobs.trees import tree_error_record

    q = SimpleNamespace(query_id="1", query="q")
    assert tree_error_record(q, ExecutorError("a sandbox worker did not start: x"), "h")["not_executed"] is True
    assert "not_executed" not in tree_error_record(q, CodetoolError("a malformed entry"), "h")
