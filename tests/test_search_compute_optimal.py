"""Compute-optimal allocation end to end: hand-built difficulty estimates, scripted policy and PRM, the real executor."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

import codetool.assemble as assemble
from codetool.assemble import make_search
from codetool.config import ConfigError
from codetool.executor import Executor, ExecutorConfig
from codetool.models.backends import ScriptedBackend
from codetool.search.allocation import ALLOCATED
from codetool.search.compute_optimal import (
    ALLOCATABLE,
    candidates_per_step,
    plan,
    planned_candidates,
    sized,
)
from codetool.search.config import SearchConfig
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


@pytest.fixture(scope="module")
def base(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    return SearchTask(query_id=query.query_id, query=query.query, env=env, benchmark="stabletoolbench",
                      group="G1_instruction")


def tasks_of(base, confidences: dict[str, float] | None = None) -> list[SearchTask]:
    """Three queries, easy, mid and hard; with ``confidences`` each carries a decide-first confidence."""
    return [replace(base, query_id=name, query=f"{base.query} [{name}]",
                    extra={"decision_confidence": confidences[name]} if confidences else {})
            for name in ("easy", "mid", "hard")]


def settings(**over) -> SearchConfig:
    return SearchConfig(**{"strategy": "compute_optimal", "budget": 40, "k": 2, "max_steps": 1, "max_new_tokens": 4,
                           "latent": "none", "w_latent": 0.0, "tie_break": "first", **over})


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_hard_queries_get_more_budget_within_the_total(base, schedule):
    api = base.env.apis[0].name
    policy = ScriptedBackend([f"r = {api}(id_conc='1')\nfinish('ok')\n```"], cycle=True)  # 4 words
    # DVTS subtrees of one path on the three harder levels: each path costs the same, so a share buys more
    cfg = settings(schedule=schedule, max_steps=2, beam_width=1, level_strategies=["best_of_n"] * 2 + ["dvts"] * 3)
    tasks = tasks_of(base, {"easy": 0.9, "mid": 0.5, "hard": 0.1})  # difficulties 0.1, 0.5, 0.9
    search = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()))
    trajs = {t.query_id: t for t in search.run(tasks)}
    plan = {q: t.strategy for q, t in trajs.items()}
    assert {q: (s["difficulty"], s["difficulty_source"], s["level"]) for q, s in plan.items()} == {
        "easy": (0.1, "router", 0), "mid": (0.5, "router", 2), "hard": (0.9, "router", 4)}
    # shares of 40 x 3 = 120 tokens by the weights 1 : 2 : 3 of levels 0, 2 and 4
    assert [plan[q]["budget"] for q in ("easy", "mid", "hard")] == [20.0, 40.0, 60.0]
    # no probe ran: a candidate is planned at max_new_tokens (4), so the shares pay for 5, 10 and 15
    # candidates; 2 steps of k=2: 4 per best-of-N episode, 4 per DVTS path
    assert [(plan[q]["strategy"], plan[q]["size"]) for q in ("easy", "mid", "hard")] == [
        ("best_of_n", 1), ("dvts", 2), ("dvts", 3)]
    assert plan["mid"]["inner"]["subtrees"] == 2 and plan["hard"]["inner"]["subtrees"] == 3
    # compute: every candidate finishes at its first step (4 words, one tool call, one fork)
    spent = {q: (t.generated_tokens, t.tool_calls, t.executor_forks) for q, t in trajs.items()}
    assert spent == {"easy": (8, 2, 2), "mid": (16, 4, 4), "hard": (24, 6, 6)}
    assert sum(t.generated_tokens for t in trajs.values()) <= cfg.budget * 3
    assert all(t.final_answer == "ok" and t.wall_time_s > 0 for t in trajs.values())


def test_a_share_becomes_the_largest_size_that_fits():
    cfg = SearchConfig(k=2, max_steps=2, beam_width=2, lookahead_depth=1)
    # cost of one unit of size at 10 tokens per candidate: candidates per step x 2 steps x 10
    assert [candidates_per_step(s, 1, cfg) for s in ("greedy", "best_of_n", "beam", "dvts", "lookahead")] == [1, 2, 2, 2, 2]
    sub, size = sized(cfg, "best_of_n", 100, 10.0)  # 40 per episode of k=2
    assert (sub.strategy, sub.n, size) == ("best_of_n", 2, 2)
    assert sized(cfg, "beam", 170, 10.0)[0].beam_width == 2  # after one step of k=2 at most 2 beams are open
    assert sized(cfg, "greedy", 100, 10.0)[0].k == 5
    assert sized(cfg, "lookahead", 100, 10.0)[0].k == 2
    sub, size = sized(cfg, "dvts", 250, 10.0)  # per path 1 root candidate (per 2) + 2: 8 paths cost 24 <= 25
    assert (sub.n, sub.beam_width, size) == (8, 2, 8)
    sub, size = sized(cfg, "dvts", 10, 10.0)  # below the smallest size: one path
    assert (sub.n, sub.beam_width, size) == (1, 1, 1)
    assert sized(cfg, "beam", 0, 10.0)[0].beam_width == 1
    assert [planned_candidates("beam", 3, cfg), planned_candidates("dvts", 4, cfg)] == [2 + 4, 2 * (2 + 4)]
    assert planned_candidates("beam", 3, replace(cfg, max_steps=3)) == 2 + 4 + 6  # 1, then 2, then 3 beams
    assert sized(replace(cfg, max_steps=1), "beam", 1000, 10.0)[0].beam_width == 1  # one step: width buys nothing
    # the query's settings name its strategy and carry no budget; one trajectory votes for nothing
    voting = SearchConfig(strategy="compute_optimal", budget=100, vote="majority")
    assert sized(voting, "greedy", 100, 10.0)[0].vote == "none"
    assert sized(voting, "beam", 100, 10.0)[0].vote == "majority"
    assert sized(voting, "beam", 100, 10.0)[0].budget is None


def test_what_a_beam_cannot_use_goes_to_the_others():
    cfg = SearchConfig(k=2, max_steps=2)
    # best-of-N (4 candidates per episode) and a beam, whose 2 steps of k=2 use at most 6 candidates
    (bon, n, easy), (beam, width, hard) = plan(cfg, ["best_of_n", "beam"], [10.0, 30.0], tokens_per_candidate=1.0)
    assert (width, hard) == (2, 6.0) and (n, easy) == (8, 34.0)
    assert (bon.n, beam.beam_width) == (8, 2)
    # nothing to give: both keep their shares
    assert [share for *_, share in plan(cfg, ["best_of_n", "best_of_n"], [10.0, 30.0], 1.0)] == [10.0, 30.0]


class QueryPRM:
    """Scores every candidate of a query alike: the easy query's steps look good, the hard one's bad."""

    SCORES = {"easy": 0.9, "mid": 0.5, "hard": 0.2}

    def score(self, items):
        return [self.SCORES[re.search(r"\[(\w+)\]", it.query).group(1)] for it in items]


def test_the_prm_probe_estimates_difficulty_and_its_compute_is_counted(base):
    policy = ScriptedBackend(["finish('ok')\n```"], cycle=True)  # 1 word
    cfg = settings(latent="prm", w_latent=1.0, difficulty="prm", budget=20, beam_width=1)
    search = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()), scorer=QueryPRM())
    trajs = {t.query_id: t for t in search.run(tasks_of(base))}
    plan = {q: t.strategy for q, t in trajs.items()}
    assert {q: (s["difficulty"], s["difficulty_source"]) for q, s in plan.items()} == {
        "easy": (pytest.approx(0.1), "prm"), "mid": (0.5, "prm"), "hard": (0.8, "prm")}
    # the probe sampled k=2 first steps per query (1 word each): 6 tokens of the 60 are gone
    assert all(s["estimate_tokens"] == 2 and s["tokens_per_candidate"] == 1.0 for s in plan.values())
    # shares 9, 18, 27 of the 54 left; at one step beam search expands one root whatever its width,
    # so the hard query keeps the 2 tokens it can use and its 25 others go to easy and mid by 9 : 18
    assert [plan[q]["budget"] for q in ("easy", "mid", "hard")] == [17.3, 34.7, 2.0]
    # at one step of k=2 and 1 token per candidate: an episode or a DVTS path costs 2
    assert [plan[q]["size"] for q in ("easy", "mid", "hard")] == [8, 17, 1]
    for q, t in trajs.items():  # the probe's 2 candidates are in every compute field
        inner = {"easy": 8 * 2, "mid": 17 * 2, "hard": 2}[q]
        assert t.generated_tokens == 2 + inner and t.executor_forks == 2 + inner
        assert t.prm_scored_tokens > 0


def test_router_difficulty_needs_a_decision(base):
    search = make_search(ScriptedBackend(["finish('ok')\n```"], cycle=True), settings(difficulty="router"),
                         lambda t: Executor(EXEC, tools=t.env.functions()))
    with pytest.raises(ConfigError, match="--router"):
        search.run(tasks_of(base))


def test_allocatable_strategies_are_those_of_the_caller_table():
    assert set(ALLOCATABLE) == set(ALLOCATED)
    assert all(assemble.STRATEGIES[name] is fn for name, fn in ALLOCATABLE.items())
