"""``label_rule: reference``: the public CodeTool code's tree labels, by hand and against the
conformance corpus (``../shared/conformance/trees``, README §1): per node status, soft/hard LR,
tau (a sum) and latent reward, the kept pairs in its order and its SFT rows, exactly."""

from __future__ import annotations

import json

import pytest
from conformance_stubs import jsonl, lost_runner, stub_runner

from codetool import CodetoolError
from codetool.search.reference import python_blocks, step_program, strip_prints
from codetool.tree.reference import (
    label_reference,
    layout,
    pair,
    program_key,
    run_paths,
    score,
    sft_rows,
)

TOL = 1e-12  # the corpus README's tolerance for floats


def reply(label: str, code: str | None, done: bool = False) -> str:
    body = f"##Step: {label}\n" + (f"Python Code:\n```python\n{code}\n```\n" if code is not None else "no code\n")
    return body + ("[All Finished]\n" if done else "")


def tree(spec: dict[str, tuple[str | None, bool]]) -> dict[str, dict]:
    """Nodes from ``id -> (code or None, done)``: leaves are the nodes without children."""
    nodes = {}
    for node_id, (code, done) in spec.items():
        parent = node_id.rsplit("-", 1)[0] if "-" in node_id else None
        nodes[node_id] = {"id": node_id, "parent": parent, "text": reply(node_id, code, done), "code": code,
                          "leaf": False, "ok": True}
    for node_id, node in nodes.items():
        node["leaf"] = not any(n["parent"] == node_id for n in nodes.values())
    return nodes


def test_print_stripping_and_programs_follow_the_public_code():
    assert strip_prints("x = f()\nprint(x)\nprint('a', f(1))") == "x = f()\npass\npass"
    assert strip_prints("print(a(b(c)))") == "print(a(b(c)))"  # two levels deep: left alone
    assert strip_prints("print(g(x), h(1))") == "print(g(x), h(1))"  # text between two calls: left alone
    assert strip_prints("myprint(1)") == "mypass"  # the pattern has no word boundary either
    assert strip_prints("print(x[)") == "pass"  # a syntax error inside a print goes with it
    assert python_blocks("```python\na\n```\n```\nb\n```\n```python\nc\n```") == ["\na\n", "\nc\n"]
    assert step_program([], ["\na\n", "\nc\n"]) == "a\n\n\nc"  # a first step runs all its blocks
    assert step_program(["\nx = 1\npass\n"], ["\nprint(x)\n", "\nnope\n"]) == "x = 1\npass\n\n\nprint(x)"


def hand_tree():
    # 1 ran; its children: 1-1 and 1-3 raise, 1-2 has no code; 2 raises outside a print, so 2-1 fails too
    return tree({"1": ("r = 1\nprint(r)", False), "1-1": ("raise KeyError('k')", False), "1-2": (None, False),
                 "1-3": ("raise KeyError('k')", False), "2": ("r = {}['x']", False), "2-1": ("print(1)", True),
                 "2-2": ("print(2)", True)})


def hand_runs(paths):
    """Status by hand: a program with a raise or ``{}['x']`` outside a print fails."""
    return {program_key(p.program): [1 if ("raise" in p.program or "{}['x']" in p.program) else 0, "out"]
            for p in paths if p.program is not None}


def test_layout_score_pairs_and_rows_by_hand():
    nodes = hand_tree()
    paths = layout(nodes)
    assert [p.name for p in paths] == ["1-1", "1-1-1", "1-1-2", "1-1-3", "1-2", "1-2-1", "1-2-2"]
    assert paths[2].program is None and paths[2].content == paths[0].content  # no code: the parent's content
    assert paths[5].program.startswith("r = {}['x']")  # the failure outside a print repeats below
    run_paths(paths, hand_runs(paths), None)
    score(paths)
    by = {p.node: p for p in paths}
    assert [by[n].status for n in ("1", "1-1", "1-2", "1-3", "2", "2-1", "2-2")] == [0, 1, 0, 1, 1, 1, 1]
    assert by["1"].soft_estimate == pytest.approx(1 / 3) and by["1"].tau == 3 and by["2"].tau == 2
    assert by["1"].latent_reward == pytest.approx(0.9 ** (2 / 3) * 0.95 ** (3 / 20), abs=TOL)
    pairs = pair(paths)
    # x-1/x-2 and x-3/x-2 only: (1-1, 1-3) never meet; (2-1, 2-2) are alike and dropped
    assert [(paths[i].node, paths[j].node) for i, j in pairs] == [("1", "2"), ("1-1", "1-2"), ("1-3", "1-2")]
    rows = sft_rows(paths, pairs)
    assert [(r.node, r.label) for r in rows] == [("1", 1), ("2", 0), ("1-1", 0), ("1-2", 1), ("1-3", 0), ("1-2", 1)]
    assert rows[3].human == "\n" and rows[2].human.startswith("\n##Step: 1-1")  # a code-less reply: empty turn
    assert rows[2].previous.endswith("[Step 1 Finished]") and rows[2].parent_res == "out"


def test_a_pair_kept_for_its_latent_reward_alone_gives_two_no_rows():
    nodes = tree({"1": ("a = 1", False), "1-1": ("a = 2", True), "1-2": ("a = 3", True), "2": ("b = 1", True)})
    paths = layout(nodes)
    run_paths(paths, {program_key(p.program): [0, ""] for p in paths}, None)
    score(paths)
    pairs = pair(paths)
    rows = sft_rows(paths, pairs)
    assert [(paths[i].node, paths[j].node) for i, j in pairs] == [("1", "2")]  # tau 2 against 0
    assert [(r.node, r.label) for r in rows] == [("1", 0), ("2", 0)]


def test_a_missing_run_without_a_runner_is_a_one_line_error():
    record = {"nodes": hand_tree()}
    with pytest.raises(CodetoolError, match="relabel"):
        label_reference(record)


# -- the conformance corpus --------------------------------------------------------------------

def _cached_runs(nodes, exec_res, generator=False):
    """The run cache from the public code's own exec_res (its statuses and outputs)."""
    paths = layout(nodes, generator=generator)
    return {program_key(p.program): [exec_res[p.name]["status"], exec_res[p.name]["res"]]
            for p in paths if p.program is not None}


def _check(record, expected):
    """Every node value, the pairs and the rows of ``record`` (labelled) against ``expected``."""
    ref = record["reference"]
    assert set(ref["nodes"]) == set(expected["nodes"])
    for node_id, want in expected["nodes"].items():
        got = ref["nodes"][node_id]
        for key in ("status", "is_leaf", "current_exec", "hard_estimate", "tau", "leaves"):
            assert got[key] == want[key], (record["query_id"], node_id, key)
        for key in ("soft_estimate", "latent_reward"):
            assert abs(got[key] - want[key]) <= TOL, (record["query_id"], node_id, key)
    assert record["pairs"] == expected["pairs"], record["query_id"]
    assert [(r["pair"], r["node"], "yes" if r["label"] else "no", r["step_text"]) for r in ref["rows"]] == \
        [(r["pair"], r["node"], r["label"], r["human"]) for r in expected["sft_rows"]], record["query_id"]


def test_labels_of_all_160_trees_equal_the_public_codes():
    """Layout, score_path, get_pair_data and get_sft_data on every tree, from the public code's
    statuses (the re-runs are checked below): 461 pairs, 922 rows."""
    trees, refs, expected = (jsonl("trees", f) for f in ("codetool_trees.jsonl", "reference_trees.jsonl",
                                                        "expected.jsonl"))
    pairs = rows = yes = 0
    for record, ref, want in zip(trees, refs, expected, strict=True):
        paths = layout(record["nodes"])
        assert [p.name for p in paths] == [p["path_name"] for p in ref["infer_path"]]
        for p, q in zip(paths, ref["infer_path"]):
            assert (p.content, p.is_leaf, p.code) == (q["content"], q["is_leaf"], ref["exec_res"][p.name]["code"])
        record["reference_runs"] = _cached_runs(record["nodes"], ref["exec_res"])
        label_reference(record)
        _check(record, want)
        pairs += len(record["pairs"])
        rows += len(record["reference"]["rows"])
        yes += sum(r["label"] for r in record["reference"]["rows"])
    assert (pairs, rows, yes) == (461, 922, 414)


def test_generator_quirks_reproduce_the_34_generator_trees():
    trees, expected = jsonl("trees", "codetool_trees.jsonl"), jsonl("trees", "expected.jsonl")
    generated = {r["q_id"]: r for r in jsonl("trees", "generator_trees.jsonl")}
    checked = 0
    for record, want in zip(trees, expected, strict=True):
        if want["generator_reachable"]:
            continue
        gen = generated[record["query_id"]]
        paths = layout(record["nodes"], generator=True)
        assert [(p.name, p.content, p.is_leaf) for p in paths] == \
            [(q["path_name"], q["content"], q["is_leaf"]) for q in gen["infer_path"]]
        record["reference_runs"] = _cached_runs(record["nodes"], gen["exec_res"], generator=True)
        label_reference(record, generator=True)
        _check(record, want["generator"])
        assert not set(want["generator"]["absent"]) & set(record["reference"]["nodes"])
        checked += 1
    assert checked == 34


def _rerun(trees, refs, expected, runner):
    """Statuses re-derived by running our layout's programs on the stub tools, then the labels."""
    for record, ref, want in zip(trees, refs, expected, strict=True):
        record.pop("reference_runs", None)
        label_reference(record, runner)
        for p in ref["infer_path"]:
            got, res = record["reference"]["nodes"][p["path_name"][2:]], ref["exec_res"][p["path_name"]]
            assert got["status"] == res["status"], (record["query_id"], p["path_name"])
            if not res["res"].startswith("Traceback"):  # a program that does not compile: execnet's traceback
                assert got["res"] == res["res"], (record["query_id"], p["path_name"])
        _check(record, want)


def test_statuses_rerun_on_the_stub_tools_equal_the_public_codes():
    """Every fourth tree (all node kinds occur), re-run in our sandbox; all 160 in the slow test."""
    trees, refs, expected = (jsonl("trees", f)[::4] for f in ("codetool_trees.jsonl", "reference_trees.jsonl",
                                                              "expected.jsonl"))
    with stub_runner() as runner:
        _rerun(trees, refs, expected, runner)
    kinds = {k for want in expected for k in want["node_kinds"].values()}
    assert len(kinds) == 15


@pytest.mark.slow
def test_statuses_of_all_trees_rerun_on_the_stub_tools():
    trees, refs, expected = (jsonl("trees", f) for f in ("codetool_trees.jsonl", "reference_trees.jsonl",
                                                        "expected.jsonl"))
    with stub_runner() as runner:
        _rerun(trees, refs, expected, runner)
        gens = {r["q_id"]: r for r in jsonl("trees", "generator_trees.jsonl")}
        for record, want in zip(trees, expected):
            if not want["generator_reachable"]:
                record.pop("reference_runs")
                label_reference(record, runner, generator=True)
                _check(record, want["generator"])
                for p in gens[record["query_id"]]["infer_path"]:
                    status = gens[record["query_id"]]["exec_res"][p["path_name"]]["status"]
                    assert record["reference"]["nodes"][p["path_name"][2:]]["status"] == status
    json.dumps(trees)  # the records stay JSON-able


# -- the product path: build-trees with label_rule reference --------------------------------------

def _policy():
    """Depth 1: a tool call that runs / a KeyError outside a print. Depth 2: finish / a reply without code."""
    from codetool.models.backends import ScriptedBackend

    counter = {"n": 0}

    def reply(prompt):
        counter["n"] += 1
        first = counter["n"] % 2 == 1
        if len(prompt) <= 2:
            return "```python\nprint(checkhealth_for_squake())\n```" if first else "```python\nx = {}['k']\nprint(x)\n```"
        return "```python\nfinish('the answer')\n```" if first else "I would rather not write code here."
    return ScriptedBackend(reply)


def test_build_trees_with_the_reference_rule_writes_the_public_codes_rows(shared_data, tmp_path):
    from codetool.executor import Executor, ExecutorConfig
    from codetool.search.search import SearchTask
    from codetool.tools.backends import make_tool_backend
    from codetool.tools.environment import ToolEnvironment
    from codetool.tools.loaders import load_toolbench_queries
    from codetool.tree.build import TreeBuilder, label_record
    from codetool.tree.config import TreeConfig
    from codetool.tree.dataset import export_dataset, tree_rows
    from codetool.tree.search_settings import TreeSearch

    q = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[0]
    task = SearchTask("G1_query/1", q.query, ToolEnvironment.from_query(q, make_tool_backend("simulator")))
    search = TreeSearch(step_format="step_text", code_prefix=False, max_new_tokens=256)
    make = lambda t: Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=t.env.functions())  # noqa: E731
    cfg = TreeConfig(branching=2, max_depth=2, label_rule="reference", search=search)
    record = TreeBuilder(_policy(), cfg, make).build(task)
    ref = record["reference"]["nodes"]
    assert [ref[n]["status"] for n in ("1", "1-1", "1-2", "2", "2-1", "2-2")] == [0, 0, 0, 1, 1, 0]
    assert not record["nodes"]["1-2"]["ok"]  # ours: a reply without code failed; the public code: a success
    assert record["pairs"] == [["1", "2"], ["2-1", "2-2"]]  # (1-1, 1-2) alike: dropped
    rows, skipped = tree_rows(record)
    assert [(r["source"], r["label"]) for r in rows] == [("G1_query/1:1", 1), ("G1_query/1:2", 0),
                                                           ("G1_query/1:2-1", 0), ("G1_query/1:2-2", 1)]
    assert skipped == 0 and rows[3]["step_text"] == "\n" and rows[3]["candidate"] == ""
    assert rows[2]["previous_steps"].endswith("[Step 1 Finished]") and "KeyError" in rows[2]["parent_result"]
    # ours on the same tree: its own-fork executability, code-less rows left out
    ours = label_record(json.loads(json.dumps(record)), TreeConfig(branching=2, max_depth=2, label_rule="ours"))
    assert tree_rows(ours)[0] and all(r["candidate"] for r in tree_rows(ours)[0])
    # a relabel reads the cached runs: no sandbox
    again = label_record(json.loads(json.dumps(record)), cfg, runner=None)
    assert again["reference"]["rows"] == record["reference"]["rows"]
    stats = export_dataset([record], tmp_path / "ds", val_fraction=0.0)
    assert stats["train"] == 4 and stats["pair_counts"]["decided"]["executability"] == 2


def test_relabel_to_the_reference_rule_reruns_the_missing_programs(shared_data, tmp_path):
    from codetool.commands.build_trees import build_trees_command
    from codetool.config import load_config
    from codetool.executor import Executor, ExecutorConfig
    from codetool.jsonl import read_jsonl
    from codetool.search.search import SearchTask
    from codetool.tools.backends import make_tool_backend
    from codetool.tools.environment import ToolEnvironment
    from codetool.tools.loaders import load_toolbench_queries
    from codetool.tree.build import TreeBuilder
    from codetool.tree.config import TreeConfig
    from codetool.tree.search_settings import TreeSearch

    q = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[0]
    task = SearchTask("G1_query/1", q.query, ToolEnvironment.from_query(q, make_tool_backend("simulator")))
    search = TreeSearch(step_format="step_text", code_prefix=False, max_new_tokens=256)
    make = lambda t: Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=t.env.functions())  # noqa: E731
    record = TreeBuilder(_policy(), TreeConfig(branching=2, max_depth=2, search=search), make).build(task)
    assert record["label_rule"] == "ours" and "reference_runs" not in record
    out = tmp_path / "trees.jsonl"
    out.write_text(json.dumps(record) + "\n")
    cfg = load_config(TreeConfig, overrides={"output": str(out), "dataset_dir": str(tmp_path / "ds"), "relabel": True,
                                             "label_rule": "reference", "val_fraction": 0.0,
                                             "executor.isolation": "fallback"})
    assert build_trees_command(cfg) == 0
    relabelled = next(iter(read_jsonl(out)))
    assert relabelled["label_rule"] == "reference" and len(relabelled["reference_runs"]) == 4  # four programs
    assert relabelled["pairs"] == [["1", "2"], ["2-1", "2-2"]]
    assert [r["label"] for r in read_jsonl(tmp_path / "ds" / "train.jsonl")] == [1, 0, 0, 1]


def test_a_reference_program_the_machine_could_not_run_fails_the_tree_not_the_node():
    # the public code has no "not executed": the tree gets no labels (an error record, rebuilt by
    # --retry_failed) rather than a status 1 the code never earned
    from codetool.search.reference import ReferenceNotRun

    record = {"nodes": hand_tree()}
    with lost_runner() as runner, pytest.raises(ReferenceNotRun):
        label_reference(record, runner)
    assert record["reference_runs"] == {}  # nothing cached: a relabel runs them again
