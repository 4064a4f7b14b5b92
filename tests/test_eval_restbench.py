"""RestBench-TMDB path metrics on hand-made trajectories with known answers, and the data's faults."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.eval.restbench import (
    coagents_api_eval,
    coagents_lists,
    coagents_mean,
    executed_calls_text,
    executed_path,
    gold_path,
    is_subsequence,
    load_gold_paths,
    matched_in_order,
    normalize_api,
    path_metrics,
    raw_gold_path,
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


# --- conformance: shared/conformance/restbench (RestGPT's definition, CoAgents' api_eval) ----------

def test_path_metrics_conformance(shared_conformance):
    root = shared_conformance / "restbench"
    expected = json.loads((root / "expected.json").read_text())
    trajs = [Trajectory.from_dict(json.loads(line)) for line in (root / "trajectories.jsonl").read_text().splitlines()]
    per_case = {c["case_id"]: c for c in expected["per_case"]}
    for norm in ("trim", "template"):
        got, want = path_metrics(trajs, normalization=norm), expected["overall"][norm]
        assert got.n == len(per_case) == 64 and got.normalization == norm
        assert got.correct_path_rate == pytest.approx(want["restgpt_correct_path_rate"], abs=1e-12)
        assert sum(q["correct"] for q in got.per_query.values()) == want["correct_paths"]
        assert (got.matched_gold_calls, got.gold_calls) == (want["matched_gold_calls"], want["gold_calls"])
        assert got.path_pooled_rate == pytest.approx(want["pooled_gold_call_share"], abs=1e-12)
        assert got.path_fraction_score == pytest.approx(want["path_fraction_score"], abs=1e-12)
        for t in trajs:
            case, q = per_case[t.query_id][norm], got.per_query[t.query_id]
            assert (gold_path(t, normalization=norm), executed_path(t, norm)[0]) == (case["gold"], case["executed"])
            assert (int(q["correct"]), q["lcs"], q["gold"]) == (case["correct_path"], case["lcs"], case["gold_len"])
            assert q["fraction"] == pytest.approx(case["fraction"], abs=1e-12)
    coagents = expected["overall"]["coagents_api_eval"]
    got = path_metrics(trajs)
    assert got.coagents == {k: coagents[k] for k in ("success_rate", "f1", "precision", "recall", "delta",
                                                     "correct_path")}
    assert got.path_rate_coagents == coagents["correct_path"] == 0.6917
    assert " ".join(f"{got.coagents[k]}" for k in ("success_rate", "f1", "precision", "recall", "delta",
                                                   "correct_path")) == coagents["printed"]
    for t in trajs:
        case = per_case[t.query_id]
        pred, answer = coagents_lists(raw_gold_path(t), executed_calls_text(t)[0])
        assert ([e.lower() for e in pred], [e.lower() for e in answer]) == (case["coagents_pred"],
                                                                            case["coagents_answer"])
        assert got.per_query[t.query_id]["coagents"] == pytest.approx(case["coagents"], abs=1e-12)


def test_coagents_quirks_and_the_pooled_rate_by_hand():
    # nothing called: the appended finish still matches, 1 / (len(gold) + 1)
    assert coagents_api_eval(*coagents_lists(["GET /a", "GET /b"], []))["correct_path"] == pytest.approx(1 / 3)
    # a stray space in the gold never matches; a lower-case "get" is not removed
    assert coagents_lists(["GET /a ", " GET /b"], ["GET /a", "get /b"]) == (["/a", "get /b", "Finish"],
                                                                           ["/a ", " /b", "Finish"])
    assert coagents_mean([1.0]) == 0.9999  # divides by n + 0.0001
    # pooled: 2 of 3 gold calls over two queries = 0.667, the per-query mean is (1 + 0) / 2
    trajs = [traj("1", [["search_person"]], gold=["GET /search/person"]),
             traj("2", [["search_movie"]], gold=["GET /search/person", "GET /movie/{x}/credits"])]
    trajs[1].steps[0].candidates[0].result.tool_calls.append(ToolCall("movie_credits"))
    metrics = path_metrics(trajs)
    assert (metrics.matched_gold_calls, metrics.gold_calls) == (2, 3)
    assert metrics.path_pooled_rate == pytest.approx(2 / 3) and metrics.path_fraction_score == pytest.approx(0.75)
    assert path_metrics(trajs, normalization="trim").matched_gold_calls == 1  # {x} vs {movie_id}
    with pytest.raises(CodetoolError, match="normalization"):
        path_metrics(trajs, normalization="loose")
    # CodeTool's 91.15% is a pooled share of RestBench-TMDB's 226 gold calls, never a mean over 100
    assert round(206 / 226 * 100, 2) == 91.15
    assert not any(round(k / 100 * 100, 2) == 91.15 for k in range(101))
