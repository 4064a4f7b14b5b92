"""The testbed summary's numbers on hand-made trajectories and trees (hand-computed values)."""

from __future__ import annotations

import json

import pytest

from codetool.eval.testbed import (
    method_rows,
    paired_rows,
    policy_section,
    prm_pair_accuracy,
    render,
    world_scores,
    write_testbed,
)
from codetool.jsonl import write_jsonl

KEY = {"kind": "number", "value": 7.0, "decimals": 0, "given": []}


def traj(qid, method, answer, finish="finish", key=KEY):
    return {"query_id": qid, "method": method, "finish_type": finish, "final_answer": answer,
            "extra": {"answer": key} if key else {}}


@pytest.fixture
def runs(tmp_path):
    files = []
    for seed, answers in ((0, {"a": "7", "b": "8", "c": "7"}), (1, {"a": "7", "b": "7", "c": "1 or 7"})):
        path = tmp_path / f"world-heldout.seed{seed}.jsonl"
        rows = [traj(q, "spot-only", ans) for q, ans in answers.items()]
        rows.append(traj("a", "single-sample", "7", finish="max_steps"))
        rows.append(traj("b", "single-sample", "7"))
        rows.append(traj("c", "single-sample", "7"))
        rows.append(traj("x", "spot-only", "7", key=None))  # no answer key: not a world query
        write_jsonl(path, rows)
        files.append(path)
    return files


def test_scores_are_exact_and_per_seed(runs):
    scores = world_scores(runs)
    assert scores["spot-only"] == {0: {"a": 1.0, "b": 0.0, "c": 1.0}, 1: {"a": 1.0, "b": 1.0, "c": 0.0}}
    assert scores["single-sample"][0] == {"a": 0.0, "b": 1.0, "c": 1.0}


def test_method_rows_average_seeds_per_query_then_queries(runs):
    rows = {r["method"]: r for r in method_rows(world_scores(runs), samples=500)}
    spot = rows["spot-only"]
    assert spot["queries"] == 3 and spot["seeds"] == [0, 1]
    assert spot["success"] == pytest.approx(2 / 3) and spot["per_seed"] == {0: pytest.approx(2 / 3), 1: pytest.approx(2 / 3)}
    assert 0.0 <= spot["low"] <= spot["success"] <= spot["high"] <= 1.0
    assert rows["single-sample"]["success"] == pytest.approx(2 / 3)


def test_paired_rows_difference_per_query(runs):
    [row] = paired_rows(world_scores(runs), [("spot-only", "single-sample"), ("spot-only", "absent")], samples=500)
    # per query: a 1 - 0, b 0.5 - 1, c 0.5 - 1 -> mean (1 - 0.5 - 0.5) / 3 = 0
    assert row["n"] == 3 and row["mean"] == pytest.approx(0.0) and row["low"] <= 0.0 <= row["high"]


def test_prm_pairs_are_split_by_what_the_steps_did(tmp_path):
    nodes = {"1": {"ok": True}, "2": {"ok": True}, "3": {"ok": False}, "1-1": {"ok": False}, "1-2": {"ok": False}}
    write_jsonl(tmp_path / "trees.jsonl", [
        {"query_id": "q", "nodes": nodes, "pairs": [["1", "2"], ["1", "3"], ["1-1", "1-2"]]},
        {"query_id": "r", "nodes": {"1": {"ok": True}, "2": {"ok": True}}, "pairs": [["2", "1"]]},
        {"query_id": "train-only", "nodes": {"1": {"ok": True}, "2": {"ok": True}}, "pairs": [["1", "2"]]}])
    scores = {"q:1": 0.9, "q:2": 0.4, "q:3": 0.2, "q:1-1": 0.5, "q:1-2": 0.5, "r:1": 0.7, "r:2": 0.6}
    write_jsonl(tmp_path / "scores.jsonl", [{"source": k, "score": v} for k, v in scores.items()])
    out = prm_pair_accuracy(tmp_path / "trees.jsonl", tmp_path / "scores.jsonl", samples=200)
    assert out["both_ran"]["pairs"] == 2 and out["both_ran"]["queries"] == 2
    assert out["both_ran"]["accuracy"] == pytest.approx(0.5)  # q: 0.9 > 0.4 right; r: 0.6 < 0.7 wrong
    assert out["one_ran"] == {"pairs": 1, "queries": 1, "accuracy": 1.0, "low": 1.0, "high": 1.0}
    assert out["none_ran"]["accuracy"] == 0.5  # a tie counts one half
    assert prm_pair_accuracy(tmp_path / "missing.jsonl", tmp_path / "scores.jsonl") is None


def test_policy_section_reads_train_policys_run(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "results.json").write_text(json.dumps({"runs": {"answer": {"0": {"generated_tokens": 600}}},
                                                       "token_budget": 600, "seeds": [0]}))
    write_jsonl(tmp_path / "eval" / "world_heldout.before.seed0.jsonl",
                [traj("a", "before", "1"), traj("b", "before", "7")])
    write_jsonl(tmp_path / "eval" / "world_heldout.answer.seed0.jsonl",
                [traj("a", "answer", "7"), traj("b", "answer", "7")])
    section = policy_section(tmp_path, samples=200)
    rows = {r["method"]: r["success"] for r in section["methods"]}
    assert rows == {"before": 0.5, "answer": 1.0}
    [paired] = section["paired"]
    assert (paired["a"], paired["b"], paired["mean"]) == ("answer", "before", 0.5)
    assert section["generated_tokens"] == {"answer": [600]} and policy_section(tmp_path / "none") is None


def test_the_summary_files_hold_every_table(runs, tmp_path):
    scores = world_scores(runs)
    summary = {"name": "t", "methods": method_rows(scores, samples=100),
               "paired": paired_rows(scores, [("spot-only", "single-sample")], samples=100), "prm_pairs": None,
               "policy_rl": None, "search": "k 2", "machine": "2 CPUs"}
    json_path, md_path = write_testbed(tmp_path / "out", summary)
    data = json.loads(json_path.read_text())
    assert [m["method"] for m in data["methods"]] == ["spot-only", "single-sample"]
    text = md_path.read_text()
    assert "| spot-only | 66.7 |" in text and "| spot-only - single-sample | 0.0 |" in text
    assert render(summary) == text


def test_the_prm_table_gives_no_interval_over_one_query():
    # the small recipe's relabelled PRM had one both-ran pair, from one query: it printed "0.0 to 0.0"
    pair = {"pairs": 1, "queries": 1, "accuracy": 0.0, "low": 0.0, "high": 0.0}
    prm = {"both_ran": pair, "one_ran": {**pair, "pairs": 7, "queries": 2, "accuracy": 1 / 7, "high": 0.25},
           "none_ran": {"pairs": 0, "queries": 0, "accuracy": None, "low": None, "high": None}}
    text = render({"name": "t", "methods": [], "paired": [], "prm_pairs": prm, "policy_rl": None, "search": "k 2",
                   "machine": "2 CPUs"})
    assert "| both steps ran (R_spot ties) | 1 (1) | 0.0 | n/a (one query) |" in text
    assert "| one ran (executability decides) | 7 (2) | 14.3 | 0.0 to 25.0 |" in text
    assert "| neither ran | 0 (0) | n/a | n/a |" in text


def test_train_policys_own_report_gives_the_exact_before_after_with_paired_intervals():
    """train-policy's report: exact success per policy with its bootstrap interval over queries and each
    setting minus before, paired by query (before, its report had only the mean over seeds)."""
    from codetool.eval.testbed import answer_scores, before_after
    from codetool.policy.report import answer_lines
    from codetool.search.records import Trajectory

    def run(answers):
        return [Trajectory.from_dict({**traj(q, "x", a), "query": q}) for q, a in answers.items()]

    evals = {"before": {0: run({"a": "1", "b": "7", "c": "1", "d": "7"}),
                        1: run({"a": "7", "b": "7", "c": "1", "d": "1"})},
             "answer": {0: run({"a": "7", "b": "7", "c": "7", "d": "7"}),
                        1: run({"a": "7", "b": "1", "c": "7", "d": "7"})},
             "toolbench": {0: [Trajectory.from_dict({**traj("z", "x", "7", key=None), "query": "z"})]}}
    scores = answer_scores(evals)
    assert set(scores) == {"before", "answer"}  # a set without answer keys is no world set
    section = before_after(scores, samples=500)
    rows = {r["method"]: r for r in section["methods"]}
    # per query the seed mean: before a .5 b 1 c 0 d .5 -> .5; answer a 1 b .5 c 1 d 1 -> .875
    assert rows["before"]["success"] == 0.5 and rows["answer"]["success"] == 0.875
    assert rows["before"]["low"] <= 0.5 <= rows["before"]["high"] and rows["before"]["queries"] == 4
    [paired] = section["paired"]
    assert (paired["a"], paired["b"], paired["n"]) == ("answer", "before", 4)
    assert paired["mean"] == pytest.approx(0.375) and paired["low"] <= 0.375 <= paired["high"]
    text = "\n".join(answer_lines({"world:train": section}))
    assert "| before | 50.0 |" in text and "| answer | 87.5 |" in text
    assert "| answer - before | +37.5 |" in text
