"""Voting over final answers (search.vote): normalisation, answer keys, and PRM weights that overturn a majority."""

from __future__ import annotations

import re

import pytest

from codetool.assemble import make_search
from codetool.config import ConfigError
from codetool.executor import Executor, ExecutorConfig
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.search import SearchTask
from codetool.search.vote import answer_key, normalise_answer, vote
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


def finished(answer: str | None, finish_type: str = "finish", benchmark: str = "stabletoolbench",
             calls: tuple[str, ...] = ()) -> Trajectory:
    result = ExecutionResult(ok=True, tool_calls=[ToolCall(name) for name in calls])
    step = Step(0, [Candidate(0, "", "pass", result=result, chosen=True)])
    return Trajectory("q", "query", benchmark=benchmark, steps=[step], final_answer=answer, finish_type=finish_type)


@pytest.mark.parametrize("text, expected", [
    ("The total is $1,200.00!", "total is 1200"),
    ("  PARIS.  ", "paris"),
    ("an apple a day", "apple day"),
    ("A.", "a"),  # an answer that is only an article keeps it
    ("+07 items; 3.50 kg; -0.0", "7 items 3.5 kg 0"),
    ("ｆｕｌｌ width １２", "full width 12"),
    ("-5 degrees", "-5 degrees"),
    ("2020-05-01", "2020 5 1"),
    ("run_9d3924c27a84 and 12abc", "run 9d3924c27a84 and 12abc"),  # ids that start with a digit stay words
    ("x_007", "x 7"),
    ("", ""),
    (None, ""),
])
def test_answers_are_normalised_before_voting(text, expected):
    assert normalise_answer(text) == expected


def test_answer_keys_on_stabletoolbench_and_restbench():
    assert answer_key(finished("Paris.")) == "paris"
    assert answer_key(finished("x", finish_type="give_up")) is None  # only finished answers vote
    assert answer_key(finished("x", finish_type="error")) is None
    assert answer_key(finished("  !! ")) is None  # nothing left after normalisation
    # RestBench: the executed call sequence is the answer, whatever the episode wrote or how it ended
    tmdb = finished("whatever", finish_type="max_steps", benchmark="restbench-tmdb", calls=("search_person", "credits"))
    assert answer_key(tmdb) == "search_person -> credits"
    assert answer_key(finished("x", benchmark="restbench-tmdb")) is None  # no call, no path


def test_prm_weights_overturn_the_majority():
    # B has the most votes (3), A the most PRM weight (0.4 + 0.4 = 0.8 > 3 x 0.2), C the best single score
    answers = ["A", "a.", "B", "b", "B!", "C"]
    scores = [0.4, 0.4, 0.2, 0.2, 0.2, 0.7]
    trajs = [finished(a) for a in answers]
    assert vote(trajs, scores, "none").chosen == 5
    majority = vote(trajs, scores, "majority")
    assert majority.key == "b" and majority.chosen == 2 and majority.tally == {"a": 2.0, "b": 3.0, "c": 1.0}
    weighted = vote(trajs, scores, "prm_weighted")
    assert weighted.key == "a" and weighted.chosen == 0
    assert weighted.tally == pytest.approx({"a": 0.8, "b": 0.6, "c": 0.7})
    assert weighted.record("prm_weighted")["voted_key"] == "a"


def test_ties_go_to_the_best_scored_group_and_non_voters_fall_back_to_the_score():
    trajs = [finished("x"), finished("y"), finished("y")]
    scores = [0.9, 0.3, 0.5]
    tie = vote(trajs[:2], scores[:2], "majority")  # 1 vote each: x's best score 0.9 wins the tie
    assert tie.key == "x" and tie.chosen == 0
    assert vote(trajs, scores, "majority").chosen == 2  # y's best member answers
    nobody = [finished("x", finish_type="give_up"), finished(None, finish_type="max_steps")]
    ballot = vote(nobody, [0.1, 0.2], "majority")
    assert ballot.chosen == 1 and ballot.key is None and ballot.tally == {}
    # a failed episode (-inf) weighs nothing
    assert vote([finished("x"), finished("y")], [float("-inf"), 0.1], "prm_weighted").key == "y"
    with pytest.raises(ValueError):
        vote(trajs, scores[:2], "majority")


class ScriptedPRM:
    def score(self, items):
        return [float(re.search(r"# s=([0-9.]+)", it.candidate).group(1)) for it in items]


@pytest.fixture(scope="module")
def task(shared_data):
    query = load_stabletoolbench("G1_instruction", shared_data)[0]
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    return SearchTask(query_id=query.query_id, query=query.query, env=env, benchmark="stabletoolbench",
                      group="G1_instruction")


@pytest.mark.parametrize("mode, answer", [("none", "Lyon"), ("majority", "Nice"), ("prm_weighted", "Paris")])
def test_best_of_n_answers_by_its_vote(task, mode, answer):
    replies = [("Paris", 0.4), ("paris.", 0.4), ("Nice", 0.2), ("NICE", 0.2), ("nice!", 0.2), ("Lyon", 0.7)]
    policy = ScriptedBackend([f"finish('{a}')  # s={s}\n```" for a, s in replies])
    cfg = SearchConfig(strategy="best_of_n", n=6, k=1, max_steps=1, vote=mode)
    traj = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()),
                       scorer=ScriptedPRM()).run([task])[0]
    assert traj.final_answer == answer
    assert traj.generated_tokens == 6 * 3 and traj.executor_forks == 6 and traj.prm_scored_tokens > 0
    assert (traj.strategy.get("vote"), traj.strategy["chosen"]) == (
        {"none": (None, 5), "majority": ("majority", 2), "prm_weighted": ("prm_weighted", 0)}[mode])
    # every episode is kept in the record, enough to vote again with another mode afterwards
    assert traj.strategy["finished"][1] == {"answer": "paris.", "finish_type": "finish", "calls": [], "score": 0.4}
    assert traj.strategy["episode_tokens"] == [3] * 6


def test_beam_votes_over_its_finished_beams(task):
    # one root, k=3 children that all finish: beam keeps the 3 best; two say "Rome" with 0.3 each
    policy = ScriptedBackend(["finish('Rome')  # s=0.3\n```", "finish('rome')  # s=0.3\n```",
                              "finish('Oslo')  # s=0.5\n```"])
    cfg = SearchConfig(strategy="beam", beam_width=3, k=3, max_steps=1, vote="prm_weighted")
    traj = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()),
                       scorer=ScriptedPRM()).run([task])[0]
    # the best beam says Oslo (0.5); the two Rome beams together weigh more
    assert traj.strategy["scores"] == [0.5, 0.3, 0.3]
    assert traj.final_answer == "Rome" and traj.strategy["tally"] == [["oslo", 0.5], ["rome", 0.6]]


def test_a_vote_needs_several_trajectories():
    for strategy in ("greedy", "lookahead"):
        with pytest.raises(ConfigError, match="search.vote"):
            SearchConfig(strategy=strategy, vote="majority")
    for strategy in ("best_of_n", "beam", "dvts"):
        assert SearchConfig(strategy=strategy, vote="prm_weighted").vote == "prm_weighted"


def test_a_finished_record_keeps_each_call_as_the_step_records_it():
    from codetool.search.vote import finished_record

    call = ToolCall("weather", arguments={"city": "Oslo"}, response='{"temp_c": 21}')
    step = Step(0, [Candidate(0, "", "pass", result=ExecutionResult(ok=True, tool_calls=[call]), chosen=True)])
    traj = Trajectory("q", "query", steps=[step], final_answer="21 degrees", finish_type="finish")
    record = finished_record(traj, float("-inf"))
    assert record == {"answer": "21 degrees", "finish_type": "finish", "calls": [call.to_dict()], "score": None}
    assert ToolCall.from_dict(record["calls"][0]) == call  # enough to score a grounded answer afterwards
