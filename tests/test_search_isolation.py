"""Episode isolation (issue 17): an exception inside one episode (executor fault, executor that
cannot start, PRM scorer failure) or one tree ends that episode or tree as an error with its
message; the others, run in the same batch, finish normally."""

from __future__ import annotations

from dataclasses import replace

import pytest

from codetool.assemble import make_search
from codetool.executor import Executor, ExecutorConfig, ExecutorError
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench
from codetool.tree.build import TreeBuilder, summarize
from codetool.tree.config import TreeConfig

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


def block(code: str) -> str:
    return f"{code}\n```"  # continues the opening fence the search puts in


class Faulty:
    """An executor whose runs raise in the host, as the review's ``inf`` frame made them."""

    def __init__(self, inner):
        self.inner = inner

    def fork(self):
        return Faulty(self.inner.fork())

    def run(self, code):
        raise OverflowError("cannot convert float infinity to integer")

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def tasks(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    base = SearchTask(query_id="good", query=query.query, env=env, benchmark="stabletoolbench")
    return base, replace(base, query_id="bad", query="bad " + query.query)


def factory(bad: str):
    def make(task):
        if task.query_id == "bad" and bad == "start":
            raise ExecutorError("the sandbox did not start")
        ex = Executor(EXEC, tools=task.env.functions())
        return Faulty(ex) if task.query_id == "bad" and bad == "run" else ex
    return make


def policy():
    return ScriptedBackend(lambda prompt: block("print('step')\nfinish('the answer')"))


@pytest.mark.parametrize("bad", ["run", "start"])
def test_an_executor_fault_ends_only_its_episode(tasks, bad):
    search = make_search(policy(), SearchConfig(latent="none", k=2, max_steps=2, concurrency=2), factory(bad))
    trajs = {t.query_id: t for t in search.run(list(tasks))}
    assert trajs["good"].finish_type == "finish" and trajs["good"].final_answer == "the answer"
    assert trajs["bad"].finish_type == "error"
    assert ("OverflowError" if bad == "run" else "the sandbox did not start") in trajs["bad"].error


class Scorer:
    """A PRM stand-in that fails on any batch holding the bad query."""

    def score(self, items):
        if any(it.query.startswith("bad") for it in items):
            raise RuntimeError("scorer crashed")
        return [0.5] * len(items)


def test_a_scorer_failure_ends_only_the_episode_it_fails_on(tasks):
    search = make_search(policy(), SearchConfig(latent="prm", k=2, max_steps=2, concurrency=2),
                         factory("none"), scorer=Scorer())
    trajs = {t.query_id: t for t in search.run(list(tasks))}
    assert trajs["good"].finish_type == "finish"
    assert trajs["bad"].finish_type == "error" and "scorer crashed" in trajs["bad"].error


def test_a_fault_ends_only_its_tree(tasks):
    builder = TreeBuilder(policy(), TreeConfig(branching=2, max_depth=2), factory("run"))
    records = builder.build_many([tasks[1], tasks[0]])
    assert "OverflowError" in records[0]["error"] and records[0]["nodes"] == {} and records[0]["pairs"] == []
    assert "error" not in records[1] and sorted(records[1]["nodes"]) == ["1", "2"]
    assert summarize(records)["errors"] == 1 and summarize(records)["trees"] == 1


def test_a_policy_failure_for_one_prompt_ends_only_its_episode(tasks):
    """The batched policy call raises (e.g. one prompt exceeds the context): each episode is
    retried on its own, so only the one whose prompt fails ends as an error."""
    def reply(prompt):
        if "bad " in str(prompt):
            raise RuntimeError("context length exceeded")
        return block("print('step')\nfinish('the answer')")

    search = make_search(ScriptedBackend(reply), SearchConfig(latent="none", k=2, max_steps=2, concurrency=2),
                         factory("none"))
    trajs = {t.query_id: t for t in search.run(list(tasks))}
    assert trajs["good"].finish_type == "finish" and trajs["good"].final_answer == "the answer"
    assert trajs["bad"].finish_type == "error" and "context length exceeded" in trajs["bad"].error


# ------------------------------------------------------------------------------- issue 27
# A state whose code would break the old worker's reply to a fork (its own step still ends normally);
# the keeper forks with C functions bound at boot, so it breaks nothing now.
POISON = ("import json\n_dumps = json.dumps\n"
          "def dumps(obj, *a, **k):\n"
          "    return '{not json' if isinstance(obj, dict) and obj.get('op') == 'forked' else _dumps(obj, *a, **k)\n"
          "json.dumps = dumps\nprint('poisoned')")


def test_a_poisoned_candidate_costs_only_its_own_subtree(tasks):
    calls = {"n": 0}

    def reply(prompt):
        calls["n"] += 1
        if len(prompt) <= 3:  # depth 1: the first candidate poisons its state, the second is honest
            return block(POISON) if calls["n"] % 2 else block("print('honest')")
        return block("finish('the answer')")

    builder = TreeBuilder(ScriptedBackend(reply), TreeConfig(branching=2, max_depth=2),
                          lambda t: Executor(EXEC, tools=t.env.functions()))
    record = builder.build(tasks[0])
    assert record.get("finish_type") != "error" and "error" not in record, record.get("error")
    nodes = record["nodes"]
    assert sorted(nodes) == ["1", "1-1", "1-2", "2", "2-1", "2-2"]
    # the poisoned state forks like any other: its subtree runs, as does its sibling's
    assert nodes["1-1"]["ok"] and nodes["1-2"]["ok"]
    assert nodes["2-1"]["ok"] and nodes["2-2"]["ok"] and nodes["2-1"]["ended"] == "finish"


SIGNAL_ALL = ("import os, signal, threading, time\n"
              "def hit():\n"
              "    end = time.time() + 3\n"
              "    while time.time() < end:\n"
              "        for p in [int(x) for x in os.listdir('/proc') if x.isdigit()]:\n"
              "            if p != os.getpid():\n"
              "                try:\n                    os.kill(p, signal.SIGKILL)\n"
              "                except OSError:\n                    pass\n"
              "        time.sleep(0.002)\n"
              "threading.Thread(target=hit, daemon=True).start()\n"
              "print(undefined_name)")


def test_a_candidate_cannot_change_its_siblings_result(tasks):
    """The first candidate fails on its own but leaves a thread that kills every process it can
    see; were its sibling killed too, both would score 0 and the right answer could be lost."""
    probe = Executor(EXEC)
    separate = "uid" in probe.isolation
    probe.close()
    if not separate:
        pytest.skip("candidates are separate principals only when the host runs as root")
    calls = {"n": 0}

    def reply(prompt):
        calls["n"] += 1
        return block(SIGNAL_ALL) if calls["n"] % 2 else block("import time\ntime.sleep(0.3)\nfinish('right')")

    for _ in range(3):
        search = make_search(ScriptedBackend(reply), SearchConfig(latent="none", k=2, max_steps=1),
                             lambda t: Executor(EXEC, tools=t.env.functions()))
        [traj] = search.run([tasks[0]])
        assert traj.finish_type == "finish" and traj.final_answer == "right", traj.to_dict()
