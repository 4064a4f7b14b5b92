"""DVTS (diverse verifier tree search) against beam search on one hand-built tree, with the real executor."""

from __future__ import annotations

import json
import re

import pytest

from codetool.assemble import make_search
from codetool.config import ConfigError
from codetool.executor import Executor, ExecutorConfig
from codetool.models.backends import ScriptedBackend
from codetool.models.completion import to_messages
from codetool.search.config import SearchConfig
from codetool.search.records import Trajectory
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)

# The tree: each node's children, handed out in this order (a node asked again gets the next ones).
# Scores are the PRM's (read from "s=" in the code). A's children outscore B's, so beam search
# (B=2) keeps only A's line at the second step; C, which only a second subtree reaches, leads to
# the best answer.
TREE = {
    "root": ["A 0.9", "B 0.5", "C 0.8", "D 0.2"],
    "A": ["A1 0.85", "A2 0.84"], "B": ["B1 0.3", "B2 0.2"], "C": ["C1 0.7", "C2 0.1"], "D": ["D1 0.1", "D2 0.1"],
    "A1": ["finish a1 0.6", "print 0.1"], "A2": ["finish a2 0.55", "print 0.05"],
    "C1": ["finish c 0.95", "print 0.1"], "B1": ["finish b1 0.2", "print 0.1"],
}


class TreePolicy:
    """Replies by the node the prompt stands at (the last ``# id=`` marker of its history)."""

    def __init__(self):
        self.served: dict[str, int] = {}

    def __call__(self, prompt) -> str:
        text = "\n".join(m["content"] for m in to_messages(prompt) if m["role"] == "assistant")
        ids = re.findall(r"# id=(\w+)", text)
        node = ids[-1] if ids else "root"
        i = self.served.get(node, 0)
        self.served[node] = i + 1
        name, *rest = TREE[node][i % len(TREE[node])].split()
        if name == "finish":
            answer, score = rest
            return f"finish('{answer}')  # id={answer} s={score}\n```"
        if name == "print":
            return f"print('still going')  # id={node}x s={rest[0]}\n```"
        return f"x = '{name}'  # id={name} s={rest[0]}\n```"


class ScriptedPRM:
    def score(self, items):
        return [float(re.search(r"s=([0-9.]+)", it.candidate).group(1)) for it in items]


class Tracked:
    """An executor wrapper that records every sandbox and how often each was closed."""

    def __init__(self, inner, registry):
        self.inner, self.registry, self.closed = inner, registry, 0
        registry.append(self)

    def fork(self):
        return Tracked(self.inner.fork(), self.registry)

    def run(self, code):
        return self.inner.run(code)

    def close(self):
        self.closed += 1
        self.inner.close()


@pytest.fixture(scope="module")
def task(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    return SearchTask(query_id=query.query_id, query=query.query, env=env, benchmark="stabletoolbench",
                      group="G1_instruction")


def solve(task, registry=None, **settings):
    registry = [] if registry is None else registry
    cfg = SearchConfig(k=2, max_steps=3, w_spot=0.0, tie_break="first", **settings)
    policy = ScriptedBackend(TreePolicy())
    search = make_search(policy, cfg, lambda t: Tracked(Executor(EXEC, tools=t.env.functions()), registry),
                         scorer=ScriptedPRM())
    return search.run([task])[0], policy


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_dvts_and_beam_pick_differently_on_the_same_tree(task, schedule):
    beam, _ = solve(task, strategy="beam", beam_width=2, schedule=schedule)
    registry: list[Tracked] = []
    dvts, policy = solve(task, registry, strategy="dvts", n=2, beam_width=1, schedule=schedule)
    # beam: both places of step 2 go to A's children (0.85, 0.84 beat B's 0.3): it never leaves A
    assert beam.strategy["kept"] == [[[0, 0], [0, 1]], [[0, 0], [0, 1]], [[0, 0], [1, 0]]]
    assert beam.final_answer == "a1" and beam.strategy["scores"] == [0.6, 0.55]
    # DVTS: the first step's four root candidates are dealt two per subtree; each keeps its best
    assert dvts.strategy["name"] == "dvts" and dvts.strategy["subtrees"] == 2
    assert dvts.strategy["kept"] == [[[[0, 0]], [[0, 0]], [[0, 0]]], [[[0, 0]], [[0, 0]], [[0, 0]]]]
    assert dvts.final_answer == "c" and dvts.strategy["scores"] == [0.6, 0.95]
    assert dvts.strategy["subtree_of"] == [0, 1] and dvts.strategy["chosen"] == 1
    assert [s.chosen_candidate.code.split("#")[1].split()[0] for s in dvts.steps] == ["id=C", "id=C1", "id=c"]
    # one request of 4 samples for the root, then one prompt per subtree
    assert [len(p) for p, _ in policy.calls] == [1, 2, 2]
    assert policy.calls[0][1]["n"] == 4
    # compute of both subtrees, in words (the fence is the stop string): steps 1 and 2 four replies of
    # 6 words ("x = 'A'  # id=A s=0.9"), step 3 two finishes of 4 and two prints of 5
    assert dvts.generated_tokens == 4 * 6 + 4 * 6 + 2 * 4 + 2 * 5
    assert dvts.executor_forks == 12 and dvts.tool_calls == 0 and dvts.prm_scored_tokens > 0
    assert dvts.wall_time_s > 0 and set(dvts.phase_seconds) == {"generation", "execution", "scoring"}
    # the root and every fork closed exactly once
    assert len(registry) == 13 and all(t.closed == 1 for t in registry)
    assert Trajectory.from_dict(json.loads(json.dumps(dvts.to_dict()))).to_dict() == dvts.to_dict()


def test_dvts_closes_dropped_branches_before_the_next_generation(task):
    registry: list[Tracked] = []
    open_at_generate: list[int] = []

    class Watched(ScriptedBackend):
        def generate(self, prompts, **kwargs):
            open_at_generate.append(sum(t.closed == 0 for t in registry))
            return super().generate(prompts, **kwargs)

    cfg = SearchConfig(strategy="dvts", n=2, beam_width=1, k=2, max_steps=3, w_spot=0.0, tie_break="first")
    search = make_search(Watched(TreePolicy()), cfg,
                         lambda t: Tracked(Executor(EXEC, tools=t.env.functions()), registry), scorer=ScriptedPRM())
    search.run([task])
    # before each generation only the live paths hold a sandbox: the root, then one per subtree
    assert open_at_generate == [1, 2, 2]


def test_dvts_with_one_subtree_is_beam_search(task):
    beam, _ = solve(task, strategy="beam", beam_width=2)
    one, _ = solve(task, strategy="dvts", n=2, beam_width=2)
    assert one.strategy["name"] == "dvts" and one.strategy["subtrees"] == 1
    assert one.final_answer == beam.final_answer and one.strategy["scores"] == beam.strategy["scores"]
    assert one.generated_tokens == beam.generated_tokens and one.executor_forks == beam.executor_forks


def test_dvts_settings_are_checked():
    with pytest.raises(ConfigError, match="multiple of search.beam_width"):
        SearchConfig(strategy="dvts", n=3, beam_width=2)
    assert SearchConfig(strategy="dvts", n=4, beam_width=2).n == 4


@pytest.mark.parametrize("order", [{"A": "model", "B": "machine"}, {"A": "machine", "B": "model"}])
def test_which_beam_failed_last_does_not_decide_whether_the_query_counts(task, order):
    """Both beams fail at their second step, one on the policy's own error (HTTP 400: its prompt
    outgrew the context), one on the machine's (a server that failed every retry). The query is
    the policy's failure either way; before, the beam that failed last decided, and with the
    machine's last the query was left out of every rate."""
    from codetool.eval.metrics import not_executed_trajectory
    from codetool.models.remote import EndpointError, ServerFailure

    served = {"root": 0}

    def reply(prompt):
        text = "\n".join(m["content"] for m in to_messages(prompt) if m["role"] == "assistant")
        ids = re.findall(r"# id=(\w+)", text)
        if not ids:
            served["root"] += 1
            name = "AB"[(served["root"] - 1) % 2]
            return f"x = '{name}'  # id={name} s=0.{9 - served['root']}\n```"
        if order[ids[-1]] == "model":
            raise EndpointError("http://policy/v1/chat/completions answered HTTP 400: context length exceeded", 400)
        raise ServerFailure("http://policy/v1: no answer within 120 s after 4 attempts")

    cfg = SearchConfig(k=2, max_steps=3, w_spot=0.0, tie_break="first", strategy="beam", beam_width=2,
                       schedule="rounds")
    search = make_search(ScriptedBackend(reply), cfg, lambda t: Executor(EXEC, tools=t.env.functions()),
                         scorer=ScriptedPRM())
    traj = search.run([task])[0]
    assert traj.finish_type == "error" and "HTTP 400" in traj.error
    assert not not_executed_trajectory(traj)
