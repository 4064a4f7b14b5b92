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
