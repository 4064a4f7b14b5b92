"""RestBench-TMDB path metrics on hand-made trajectories with known answers, and the data's faults."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.eval.restbench import (
    executed_path,
    gold_path,
    is_subsequence,
    load_gold_paths,
    matched_in_order,
    normalize_api,
    path_metrics,
)
from codetool.executor.result import ExecutionResult, ToolCall
from codetool.search.records import Candidate, Step, Trajectory

TOOLS = [
    {"name": "search_person", "tool": "tmdb", "api": "GET /search/person", "method": "GET", "path": "/search/person"},
    {"name": "person_movie_credits", "tool": "tmdb", "api": "GET /person/{person_id}/movie_credits",
     "method": "get", "path": "/person/{person_id}/movie_credits"},
    {"name": "search_movie", "tool": "tmdb", "api": "GET /search/movie", "method": "GET", "path": "/search/movie"},
    {"name": "movie_credits", "tool": "tmdb", "api": "GET /movie/{movie_id}/credits", "method": "GET",
     "path": "/movie/{movie_id}/credits"},
    {"name": "movie_details", "tool": "tmdb", "api": "x", "method": "GET",
     "url": "https://api.themoviedb.org/3/movie/{movie_id}"},
]


def traj(qid, calls_per_step, gold=None, query="q", tools=TOOLS):
    steps = [Step(i, [Candidate(0, "", "pass", ExecutionResult(ok=True, tool_calls=[ToolCall(n) for n in names]),
                                chosen=True)], 0) for i, names in enumerate(calls_per_step)]
    extra = {"gold_path": gold} if gold is not None else {}
    return Trajectory(qid, query, "restbench-tmdb", "tmdb", "m", steps=steps, final_answer="x",
                      finish_type="finish", available_tools=tools, extra=extra)


def test_normalize_field_cases():
    # restbench-gold-spaces: a stray trailing / leading space
    assert normalize_api("GET /movie/{movie_id}/credits ") == "GET /movie/{}/credits"
    assert normalize_api(" GET /movie/popular") == "GET /movie/popular"
    # the data's one wrong path template: {movie_id} where the spec says {person_id}
    assert normalize_api("GET /person/{movie_id}/movie_credits") == normalize_api("GET /person/{person_id}/movie_credits")
    assert normalize_api("get  /search/movie/") == "GET /search/movie"
    assert normalize_api("GET https://api.themoviedb.org/3/search/movie?query=x") == "GET /search/movie"
    assert normalize_api("GET /movie/550/credits") == "GET /movie/{}/credits"
    assert normalize_api("/tv/popular") == "GET /tv/popular" and normalize_api("  ") == ""


def test_matched_in_order_is_the_longest_common_subsequence():
    assert matched_in_order(["a", "b", "c"], ["b", "x", "c", "a"]) == 2
    assert matched_in_order(["a", "a"], ["a"]) == 1
    assert matched_in_order([], ["a"]) == 0 and matched_in_order(["a"], []) == 0


def test_subsequence():
    assert is_subsequence(["a", "c"], ["a", "b", "c"])
    assert not is_subsequence(["c", "a"], ["a", "b", "c"])
    assert not is_subsequence(["a", "a"], ["a"])
    assert is_subsequence([], ["a"])


def test_path_rate_and_delta_by_hand():
    gold_sc = ["GET /search/person", "GET /person/{person_id}/movie_credits"]
    trajs = [
        # correct, with an extra call between: +1
        traj("1", [["search_person"], ["search_movie", "person_movie_credits"]], gold_sc),
        # wrong order: incorrect
        traj("2", [["person_movie_credits", "search_person"]], gold_sc),
        # the wrong-template gold path with stray spaces still matches: exact length, +0
        traj("3", [["search_person", "person_movie_credits"]], [" GET /search/person ", "GET /person/{movie_id}/movie_credits"]),
        # missing a call
        traj("4", [["search_movie"]], ["GET /search/movie ", "GET /movie/{movie_id}/credits"]),
        # a call named "METHOD /path" and a tool given by url; one unknown call
        traj("5", [["GET /search/movie", "movie_details", "mystery"]], ["GET /search/movie", "GET /movie/{movie_id}"]),
        # no gold path: left out
        traj("6", [["search_movie"]]),
    ]
    m = path_metrics(trajs)
    assert m.n == 5 and m.missing_gold == 1 and m.unmapped_calls == 1
    assert m.correct_path_rate == pytest.approx(3 / 5)
    assert [m.per_query[q]["correct"] for q in "12345"] == [True, False, True, False, True]
    # fractional: the wrong order matches one gold call in order (1/2), the missing call 1/2 -> 4/5
    assert [m.per_query[q]["fraction"] for q in "12345"] == [1.0, 0.5, 1.0, 0.5, 1.0]
    assert m.path_fraction_score == pytest.approx(4 / 5)
    # delta on successful (= correct-path) queries: (3-2) + (2-2) + (3-2) -> mean 2/3
    assert m.success_basis == "correct_path" and m.successful == 3
    assert m.delta_solution_len == pytest.approx(2 / 3)
    # with a judge, success is the judge's Solved label instead
    judged = path_metrics(trajs, solved=[False, True, True, False, False, True])
    assert judged.success_basis == "judge" and judged.successful == 2
    assert judged.delta_solution_len == pytest.approx(0.0)  # (2-2) + (2-2)
    assert executed_path(trajs[4]) == (["GET /search/movie", "GET /movie/{}"], 1)


def test_gold_from_restgpt_file(shared_data):
    gold = load_gold_paths(shared_data / "RestGPT" / "datasets" / "tmdb.json")
    assert len(gold) == 100
    data = json.loads((shared_data / "RestGPT" / "datasets" / "tmdb.json").read_text())
    assert data[29]["solution"][0] == "GET /search/movie "  # the stray space is in the data
    t = traj("29", [["search_movie"]], query=data[29]["query"])
    assert gold_path(t, gold)[0] == "GET /search/movie"
    lanasa = traj("98", [["search_person", "person_movie_credits"]], query="  " + data[98]["query"])
    assert data[98]["solution"] == ["GET /search/person", "GET /person/{movie_id}/movie_credits"]
    assert path_metrics([lanasa], fallback=gold).correct_path_rate == 1.0
    # extra["gold_path"] wins over the file
    own = traj("98", [["search_person"]], gold=["GET /search/person"], query=data[98]["query"])
    assert gold_path(own, gold) == ["GET /search/person"]
    # CodeTool's candidate file gives full URLs; they normalise the same way
    codetool = load_gold_paths(shared_data / "CodeTool" / "infer" / "tmdb" / "tmdb.data.candidate=20.v2.json")
    q = " ".join(data[0]["query"].split())
    assert [normalize_api(g) for g in codetool[q]] == [normalize_api(g) for g in gold[q]]
    with pytest.raises(CodetoolError, match="not found"):
        load_gold_paths(shared_data / "nope.json")


def test_unshuffled_candidates_are_flagged():
    # restbench-gold-first: the data lists the gold APIs first, in order
    gold = ["GET /search/person", "GET /person/{person_id}/movie_credits"]
    first = traj("1", [["search_person", "person_movie_credits"]], gold)
    shuffled = traj("2", [["search_person", "person_movie_credits"]], gold, tools=list(reversed(TOOLS)))
    assert path_metrics([first, shuffled]).gold_first == 1
