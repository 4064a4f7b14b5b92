"""The world across the seams: query settings that name it, a tree leaf judged by the answer key,
the ``answer`` reward of policy RL and its evaluation metric (each a path that did not exist
before issue 41)."""

from __future__ import annotations

import pytest

from codetool.config import ConfigError
from codetool.tree.labels import leaf_success

KEY = {"kind": "text", "value": "Friday", "domain": "weekday", "given": []}


def test_run_settings_take_the_world_and_its_split():
    from codetool.jobs.queries import RunConfig, load_benchmark

    cfg = RunConfig(benchmark="world", group="heldout", offset=2, limit=3)
    assert [q.query_id for q in load_benchmark(cfg)] == ["heldout-0002", "heldout-0003", "heldout-0004"]
    with pytest.raises(ConfigError, match="train or heldout"):
        RunConfig(benchmark="world")  # the default group is a StableToolBench one


def test_build_trees_reads_a_world_spec():
    from codetool.jobs.trees import load_training_queries
    from codetool.tree.config import TreeConfig

    queries, dropped = load_training_queries(TreeConfig(queries="world:train:3"))
    assert [q.query_id for q in queries] == ["train-0000", "train-0001", "train-0002"] and dropped == 0
    assert len(load_training_queries(TreeConfig(queries="world:train:9", limit=2))[0]) == 2
    with pytest.raises(ConfigError, match="world:<train|heldout>"):
        load_training_queries(TreeConfig(queries="world:test"))


@pytest.mark.parametrize(("text", "expected"), [
    ("world:train", ("train", 0, None)), ("world:heldout:5", ("heldout", 0, 5)),
    ("world:train:96:12", ("train", 96, 12)), ("world:train:0:1", ("train", 0, 1)), ("train.json", None)])
def test_a_world_spec_parses_with_or_without_an_offset(text, expected):
    from codetool.world import parse_spec

    assert parse_spec(text) == expected


@pytest.mark.parametrize("text", ["world:test", "world:", "world:train:0", "world:train:x", "world:train:-1:3",
                                  "world:train:96:0", "world:train:1:2:3", "world:train:96:"])
def test_a_bad_world_spec_names_what_it_got_and_the_accepted_forms(text):
    from codetool.world import parse_spec

    with pytest.raises(ValueError) as info:
        parse_spec(text)
    message = str(info.value)
    assert repr(text) in message and "world:<train|heldout>:<offset>:<n>" in message
    assert "world:<train|heldout>:<n>" in message
    assert "\n" not in message


def test_an_offset_spec_builds_trees_on_queries_offset_to_offset_plus_n_of_the_split():
    """world:train:96:12 -> queries 96-107 of the train split, the same as generate's (before, the spec
    could only take the first n: the trees landed on the queries the policy was warm-started on)."""
    from codetool.jobs.trees import load_training_queries
    from codetool.tree.config import TreeConfig
    from codetool.world import generate

    queries, dropped = load_training_queries(TreeConfig(queries="world:train:96:12"))
    expected = generate("train", 108)[96:]
    assert [q.query_id for q in queries] == [f"train-{i:04d}" for i in range(96, 108)] and dropped == 0
    assert [q.query for q in queries] == [w.query for w in expected]
    assert [q.extra["answer"] for q in queries] == [w.key for w in expected]
    assert [q.query_id for q in load_training_queries(TreeConfig(queries="world:train:96:12", limit=2))[0]] == [
        "train-0096", "train-0097"]
    assert load_training_queries(TreeConfig(queries="world:train:12"))[0][0].query_id == "train-0000"


def test_a_task_carries_the_answer_key_and_the_world_backend_by_default():
    from codetool.assemble import make_task, tool_backend
    from codetool.world import load_queries

    [q] = load_queries("train", 1)
    with tool_backend("auto", benchmark="world") as backend:
        task = make_task(q, backend, tool_doc="brief")
        assert task.extra["answer"] == q.extra["answer"] and str(q.extra["answer"]["value"]) not in task.env.render()
        assert task.env.call("convert_units", (), {"value": 811, "from_unit": "km", "to_unit": "mi"}).ok


def leaf(answer, ended="finish"):
    return {"1": {"parent": None, "leaf": True, "ok": True, "ended": ended, "final_answer": answer,
                  "result": {"tool_calls": []}}}


def test_tree_leaf_success_by_the_answer_key():
    assert leaf_success(leaf("It is a Friday."), "1", "answer", answer_key=KEY)
    assert not leaf_success(leaf("Friday or Monday"), "1", "answer", answer_key=KEY)
    assert not leaf_success(leaf("Friday", ended="give_up"), "1", "answer", answer_key=KEY)
    assert leaf_success(leaf("Friday"), "1", "grounded", tool_names=[]) is True  # the old modes are unchanged
    with pytest.raises(ValueError, match="answer key"):
        leaf_success(leaf("Friday"), "1", "answer")


def test_the_answer_reward_and_the_evaluation_metric():
    from codetool.policy.evaluate import metrics
    from codetool.policy.rewards import AnswerReward, build_rewards
    from codetool.search.records import Trajectory

    class Task:
        extra = {"answer": KEY}

    class Step:
        def __init__(self, ok):
            self.candidate = type("C", (), {"result": type("R", (), {"ok": ok})()})()

    class Ep:
        dropped = False

        def __init__(self, answer, finish="finish", task=Task(), last_ok=True):
            self.task, self.finish_type, self.final_answer = task, finish, answer
            self.steps, self.step_rewards = [Step(True), Step(last_ok)], {}

    reward = AnswerReward()
    assert reward(episode=[Ep("Friday"), Ep("Friday, Saturday"), Ep("Friday", "max_steps"),
                           Ep("Friday", task=type("T", (), {"extra": {}})()),
                           Ep("Friday", last_ok=False)]) == [1.0, 0.0, 0.0, 0.0, 0.0]
    funcs, weights = build_rewards({"answer": 1.0}, aggregate="mean")
    assert [f.name for f in funcs] == ["answer"] and weights == [1.0]
    trajs = [Trajectory(query_id=str(i), query="q", benchmark="world", finish_type="finish", final_answer=a,
                        extra={"answer": KEY}) for i, a in enumerate(["Friday", "Monday"])]
    assert metrics(trajs)["answer"] == 0.5


def test_policy_query_sets_name_the_world_and_never_train_on_held_out_templates():
    from codetool.policy.config import QuerySet, TrainPolicyConfig

    assert QuerySet("world", group="heldout").name == "world:heldout"
    with pytest.raises(ConfigError, match="train or heldout"):
        QuerySet("world")
    with pytest.raises(ConfigError, match="heldout templates are its evaluation split"):
        TrainPolicyConfig(prompts=[QuerySet("world", group="heldout")], evals=[], never_train_on=[], prm="none")
