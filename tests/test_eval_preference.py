"""SoWR as StableToolBench's eval_preference.py computes it: rules, random order, and the conformance corpus."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.eval.preference import (
    PairCount,
    compare_runs,
    preference_answer,
    win_rate_from_counts,
)
from codetool.executor.result import ExecutionResult
from codetool.judge.records import Preference, ScriptedJudge
from codetool.search.records import Candidate, Step, Trajectory


def traj(qid, answer="Paris has 2.1 million people.", finish="finish", query="How many people live in Paris?"):
    step = Step(0, [Candidate(0, "```python\nprint(1)\n```", "print(1)", ExecutionResult.from_dict({"ok": True, "stdout": "1", "tool_calls": [
        {"name": "city_for_geo", "arguments": {"q": "Paris"}, "status": "ok", "response": "{\"pop\": 2100000}"}]}),
        r_spot=1.0, chosen=True)], chosen=0)
    return Trajectory(query_id=qid, query=query, benchmark="stabletoolbench", group="G1", method="m",
                      steps=[step], final_answer=answer, finish_type=finish)


def inner(req_answer: str) -> str:
    return json.loads(req_answer)["final_answer"] if req_answer.startswith("{") else req_answer


def test_the_rule_case_by_case():
    # per query: (candidate label, reference label) every round; the judge prefers the reference
    cases = {"a": ("Solved", "Unsolved"), "b": ("Unsure", "Unsolved"), "c": ("Unsolved", "Unsure"),
             "d": ("Unsure", "Unsure"), "e": ("Unsolved", "Unsolved"), "f": ("Solved", "Solved"),
             "g": ("Unsure", "Solved")}
    cand = {q: traj(q, answer=f"cand {q}") for q in cases}
    ref = {q: traj(q, answer=f"ref {q}") for q in cases}

    def label(req):
        who, q = inner(req.answer).split()
        assert not req.reason  # the preference run's status checks ask for no reason
        return cases[q][0 if who == "cand" else 1]

    def winner(req):
        return "a" if inner(req.answer_a).startswith("ref") else "b"
    judge = ScriptedJudge(label, winner)
    win = compare_runs(cand, ref, judge, rounds=3)
    got = {q: (c.candidate, c.reference, c.judged) for q, c in win.per_query.items()}
    # one Solved wins; no Solved and exactly one Unsure: the Unsure one wins, no comparison (b, c);
    # two Unsure, two Unsolved and two Solved are compared
    assert got == {"a": (3, 0, 0), "b": (3, 0, 0), "c": (0, 3, 0), "d": (0, 3, 3), "e": (0, 3, 3),
                   "f": (0, 3, 3), "g": (0, 3, 0)}
    assert len(judge.compare_calls) == 9 and all(not c.allow_tie for c in judge.compare_calls)
    # both answers are judged afresh in every round: 7 queries x 2 answers x 3 rounds at stage one,
    # and the 5 Unsure answers again from the whole answer
    stages = [c.trajectory is None for c in judge.answer_calls]
    assert (stages.count(True), stages.count(False)) == (42, 15) and (win.win, win.lose, win.tie) == (pytest.approx(2 / 7),
                                                                              pytest.approx(5 / 7), 0.0)
    assert win.per_query["a"].round_winners == ["candidate"] * 3


def test_answers_are_shuffled_at_random_and_seeded():
    cand = {str(q): traj(str(q), answer=f"cand {q}") for q in range(40)}
    ref = {str(q): traj(str(q), answer=f"ref {q}") for q in range(40)}

    def run(seed):
        judge = ScriptedJudge("Solved", lambda req: "a")  # always the first shown
        win = compare_runs(cand, ref, judge, rounds=2, seed=seed)
        shown_first = [inner(c.answer_a).split()[0] for c in judge.compare_calls]
        return win, shown_first
    win, first = run(0)
    assert 20 < first.count("cand") < 60  # both orders occur (80 comparisons)
    # the winner is whoever was shown first: the points follow the shuffle
    assert sum(c.candidate for c in win.per_query.values()) == first.count("cand")
    again, first_again = run(0)
    assert first_again == first and again.per_query == win.per_query
    assert run(1)[1] != first


def test_cut_no_finish_check_and_identical_answers():
    long = "x" * 995 + " give_up_and_restart"
    cand = {"1": traj("1", answer=long), "2": traj("2", finish="max_steps", answer=None), "3": traj("3")}
    ref = {"1": traj("1", answer="short"), "2": traj("2", answer="ok"), "3": traj("3")}
    assert len(preference_answer(cand["1"])["final_answer"]) == 1000 and "method" not in preference_answer(cand["1"])
    seen = []

    def label(req):
        seen.append(req.answer)
        return "Solved"
    judge = ScriptedJudge(label, lambda req: "a")
    win = compare_runs(cand, ref, judge, rounds=1)
    # the give-up after character 1,000 is cut away: judged, not ruled out
    assert any(s.startswith('{\n  "return_type": "give_answer",\n  "final_answer": "xxx') for s in seen)
    # no Finish call: the preference still judges it; its final_answer is "" -> Unsolved by rule
    assert win.per_query["2"].reference == 1 and win.per_query["2"].judged == 0
    # identical answers: a random pick, never a comparison
    assert win.per_query["3"].judged == 0 and win.random_picks == 1
    assert [inner(c.answer_a)[:5] for c in judge.compare_calls if c.round == 0] in (["short"], ["xxxxx"])


def test_missing_queries_and_unreadable_comparisons():
    cand, ref = {"q": traj("q", answer="x"), "c": traj("c")}, {"q": traj("q", answer="y"), "r": traj("r")}
    judge = ScriptedJudge("Solved", lambda req: Preference("tie", "unreadable", parse_failed=True))
    win = compare_runs(cand, ref, judge, rounds=3, seed=5)
    assert (win.per_query["c"].candidate, win.per_query["r"].reference) == (3, 3)
    assert win.undecided == 3 and win.per_query["q"].judged == 0 and win.tie == 0.0
    assert sum([win.per_query["q"].candidate, win.per_query["q"].reference]) == 3
    with pytest.raises(CodetoolError, match="judge"):
        compare_runs(cand, ref, None, rounds=1)
    assert win_rate_from_counts({"x": PairCount(1, 2), "y": PairCount(2, 2)}).lose == 0.5


# --- conformance: StableToolBench's eval_preference.py on shared/conformance/stabletoolbench -------

@pytest.mark.parametrize("rounds", [3, 2])
def test_win_rate_conformance(stb_conformance, rounds):
    expected_all = stb_conformance.expected_pref[f"{rounds}_rounds"]
    calls = stb_conformance.expected_pref["judge_calls_3_rounds"]
    for group in stb_conformance.groups:
        expected = expected_all[group]
        ids = stb_conformance.test_ids[group]
        cand = {t.query_id: t for t in stb_conformance.trajectories("candidate", group)}
        ref = {t.query_id: t for t in stb_conformance.trajectories("reference", group)}
        judge = stb_conformance.judge_factory()
        win = compare_runs(cand, ref, judge, rounds=rounds, query_ids=ids, seed=0)
        per_query = dict(expected["per_query"])
        if group == "G1_tool":  # identical answers: StableToolBench's own random stream decides
            assert not judge.compare_calls and all(c.candidate + c.reference == rounds for c in win.per_query.values())
            assert set(win.per_query) == set(per_query)
            continue
        got = {q: {"candidate": c.candidate, "reference": c.reference, "outcome": c.outcome,
                   "round_winners": c.round_winners} for q, c in win.per_query.items()}
        assert got == per_query, group
        assert (win.win, win.lose, win.tie) == pytest.approx(
            (expected["win_rate"], expected["lose_rate"], expected["tie_rate"]), abs=1e-12)
        printed = (f"Test set: {group}. Reference model: reference, Candidate model: candidate. "
                   f"Win rate: {win.win}, Tie rate: {win.tie}")
        assert printed == expected["printed"]
        if rounds == 3:  # which rounds went to a comparison, and the statuses the judge was asked for
            compared = {}
            for c in judge.compare_calls:
                qid = next(q for q in ids if cand[q].query == c.query)
                compared.setdefault(qid, {})[str(c.round)] = win.per_query[qid].round_winners[c.round]
            assert compared == {q: e["compared"] for q, e in calls.items() if q in ids and e.get("compared")}
