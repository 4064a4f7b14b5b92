"""SoPR / SoWR bookkeeping: rules, formula, win-rate cases, and the golden StableToolBench example."""

from __future__ import annotations

import ast
import csv
import json

import numpy as np
import pytest

from codetool import CodetoolError
from codetool.eval.convert import import_converted
from codetool.eval.judges import Preference, ScriptedJudge, Verdict
from codetool.eval.stabletoolbench import (
    PairCount,
    answer_details,
    average_pass_rate,
    coin_flip,
    compare_runs,
    judge_pass,
    load_pass_results,
    load_preference_results,
    majority_label,
    pass_rate,
    pass_rates_by_group,
    render_trajectory,
    rule_verdict,
    win_rate_from_counts,
)
from codetool.executor.result import ExecutionResult
from codetool.search.records import Candidate, Step, Trajectory


def traj(qid, answer="Paris has 2.1 million people.", finish="finish", group="G1", query="How many people live in Paris?"):
    step = Step(0, [Candidate(0, "```python\nprint(1)\n```", "print(1)", ExecutionResult.from_dict({"ok": True, "stdout": "1", "tool_calls": [
        {"name": "city_for_geo", "arguments": {"q": "Paris"}, "status": "ok", "response": "{\"pop\": 2100000}"}]}),
        r_spot=1.0, chosen=True)], chosen=0)
    return Trajectory(query_id=qid, query=query, benchmark="stabletoolbench", group=group, method="m",
                      steps=[step], final_answer=answer, finish_type=finish)


# --- pass rate -------------------------------------------------------------------------------

def test_rule_verdicts_need_no_judge():
    judge = ScriptedJudge("Solved")
    trajs = [traj("1", finish="max_steps", answer=None), traj("2", answer="   "), traj("3", finish="give_up", answer=""),
             traj("4", answer='{"return_type": "give_up_and_restart"}'), traj("5")]
    verdicts = judge_pass(trajs, judge, rounds=3)
    assert [row[0].label for row in verdicts] == ["Unsolved"] * 4 + ["Solved"]
    assert all(v.source == "rule" for row in verdicts[:4] for v in row)
    assert len(judge.answer_calls) == 3 and {r.round for r in judge.answer_calls} == {0, 1, 2}
    assert rule_verdict(trajs[4]) is None


def test_unsure_is_rejudged_with_the_trajectory():
    def label(req):
        return "Unsure" if req.trajectory is None else ("Solved" if req.round == 0 else "Unsolved")
    judge = ScriptedJudge(label)
    [row] = judge_pass([traj("1")], judge, rounds=2)
    assert [v.label for v in row] == ["Solved", "Unsolved"]
    assert [v.source for v in row] == ["trajectory", "trajectory"]
    detailed = [r for r in judge.answer_calls if r.trajectory is not None]
    assert len(detailed) == 2 and "city_for_geo" in detailed[0].trajectory and "print(1)" in detailed[0].trajectory


def test_stage_two_sees_the_whole_answer_as_the_evaluator_reads_it():
    judge = ScriptedJudge(lambda req: "Unsure")
    [row] = judge_pass([traj("1")], judge, rounds=1)
    assert [c.trajectory is None for c in judge.answer_calls] == [True, False]  # Unsure -> stage two
    details = json.loads(judge.answer_calls[1].trajectory)
    # the converted layout: final_answer holds the Finish call's arguments, as in their files
    assert json.loads(details["final_answer"])["final_answer"] == "Paris has 2.1 million people."
    chain, roles = details["answer_details"], []
    while chain:
        roles.append(chain[0]["role"])
        chain = chain[0]["next"]
    assert roles == ["system", "user", "assistant", "tool", "tool"]  # step, its call, Finish
    assert row[0].label == "Unsure" and row[0].source == "trajectory"


def test_codetool_protocol_is_a_single_pass():
    judge = ScriptedJudge(lambda req: "Unsure")
    [row] = judge_pass([traj("1")], judge, rounds=1, protocol="codetool")
    assert len(judge.answer_calls) == 1 and row[0].label == "Unsure" and row[0].source == "answer"
    assert pass_rate([[v.label for v in row]], 1).mean == 0.5


def test_generated_answers_are_judged_and_give_ups_cost_nothing():
    generated = traj("1", finish="max_steps", answer="Paris has 2.1 million people.")
    generated.extra["answer_source"] = "generated"
    gave_up = traj("2", finish="give_up", answer="I could not do it")
    gave_up.extra["answer_source"] = "generated"
    judge = ScriptedJudge("Solved")
    verdicts = judge_pass([generated, gave_up, traj("3", finish="max_steps", answer=None)], judge, rounds=2)
    assert [row[0].label for row in verdicts] == ["Solved", "Unsolved", "Unsolved"]
    assert [r.answer for r in judge.answer_calls] == ["Paris has 2.1 million people."] * 2
    assert json.loads(answer_details(generated))["final_answer"] == "Paris has 2.1 million people."


def test_missing_judge_is_an_error_only_when_needed():
    assert judge_pass([traj("1", finish="max_steps")], None, rounds=2)[0][0].label == "Unsolved"
    with pytest.raises(CodetoolError, match="judge"):
        judge_pass([traj("1")], None, rounds=2)


def test_pass_rate_formula_by_hand():
    # round 0: 1 + 0.5 + 0 = 1.5 / 3; round 1: 1 + 0 + 0 = 1/3; round 2: 0.5 + 1 + 0 (missing) = 1.5/3
    labels = [["Solved", "Solved", "Unsure"], ["Unsure", "Unsolved", "Solved"], {0: "Unsolved", 1: "Unsolved"}]
    pr = pass_rate(labels, rounds=3)
    per_round = [0.5, 1 / 3, 0.5]
    assert pr.per_round == pytest.approx(per_round)
    assert pr.mean == pytest.approx(np.mean(per_round)) and pr.std == pytest.approx(np.std(per_round))
    assert pr.n == 3 and pr.counts == {"Solved": 3, "Unsure": 2, "Unsolved": 3}
    with pytest.raises(CodetoolError):
        pass_rate([["Maybe"]], 1)


def test_average_over_groups_is_round_by_round():
    a = pass_rate([["Solved", "Unsolved"]], 2)          # 1, 0
    b = pass_rate([["Solved", "Solved"], ["Unsolved", "Solved"]], 2)  # 0.5, 1
    avg = average_pass_rate([a, b])
    assert avg.per_round == pytest.approx([0.75, 0.5]) and avg.mean == pytest.approx(0.625)
    trajs = [traj("1", group="A"), traj("2", group="B"), traj("3", group="B", finish="max_steps")]
    groups, overall = pass_rates_by_group(trajs, judge_pass(trajs, ScriptedJudge("Solved"), 1), 1)
    assert groups["A"].mean == 1.0 and groups["B"].mean == 0.5 and overall.mean == 0.75


def test_majority_label_ties_are_unsure():
    assert majority_label(["Solved", "Solved", "Unsolved"]) == "Solved"
    assert majority_label(["Solved", "Unsolved"]) == "Unsure"
    assert majority_label([]) == "Unsure"


# --- win rate --------------------------------------------------------------------------------

def test_win_rate_cases():
    cand = {q: traj(q, answer=f"candidate {q}") for q in "abcdef"}
    ref = {q: traj(q, answer=f"reference {q}") for q in "abcdeg"}
    ref["e"] = traj("e", answer="candidate e")  # identical whole answers -> a coin flip, no judge call
    cand_labels = {"a": ["Solved"] * 3, "b": ["Unsolved"] * 3, "c": ["Solved", "Unsolved", "Unsure"],
                   "d": ["Solved"] * 3, "e": ["Solved"] * 3, "f": ["Solved"] * 3}
    ref_labels = {"a": ["Unsolved"] * 3, "b": ["Solved"] * 3, "c": ["Unsolved", "Solved", "Unsolved"],
                  "d": ["Solved"] * 3, "e": ["Solved"] * 3, "g": ["Solved"] * 3}

    def winner(req):  # the judge always prefers the candidate's answer
        assert req.details_a is not None and not req.allow_tie
        return "a" if req.answer_a.startswith("candidate") else "b"
    judge = ScriptedJudge(winner=winner)
    win = compare_runs(cand, ref, cand_labels, ref_labels, judge, rounds=3)
    pq = win.per_query
    assert (pq["a"].candidate, pq["a"].reference, pq["a"].judged) == (3, 0, 0)  # solved vs not, each round
    assert (pq["b"].candidate, pq["b"].reference) == (0, 3)
    # per round: only the candidate solved, only the reference solved, neither solved -> judged
    assert (pq["c"].candidate, pq["c"].reference, pq["c"].judged) == (2, 1, 1)
    assert (pq["d"].candidate, pq["d"].judged) == (3, 3)
    flips = [coin_flip(0, "e", r) for r in range(3)]
    assert (pq["e"].candidate, pq["e"].reference, pq["e"].judged) == (flips.count("candidate"),
                                                                       flips.count("reference"), 0)
    assert win.coin_flips == 3
    assert (pq["f"].candidate, pq["g"].reference) == (3, 3)  # missing in the other run
    assert len(judge.compare_calls) == 4
    # the whole answers with their details are compared; they swap places on odd rounds
    assert [c.answer_a.startswith("candidate") for c in judge.compare_calls] == [False, False, True, False]
    assert '"answer_details"' in judge.compare_calls[0].details_a and "city_for_geo" in judge.compare_calls[0].details_a
    e_won = pq["e"].outcome == "win"
    assert win.n == 7 and win.tie == 0.0 and win.win == pytest.approx((4 + e_won) / 7)


def test_undecided_comparisons_are_seeded_coin_flips_never_ties():
    cand, ref = {"q": traj("q", answer="x")}, {"q": traj("q", answer="y")}
    judge = ScriptedJudge(winner=lambda req: Preference("tie", "same"))
    win = compare_runs(cand, ref, {"q": ["Solved"] * 3}, {"q": ["Solved"] * 3}, judge, rounds=3, seed=5)
    flips = [coin_flip(5, "q", r) for r in range(3)]
    assert win.per_query["q"].candidate == flips.count("candidate") and win.tie == 0.0 and win.coin_flips == 3
    again = compare_runs(cand, ref, {"q": ["Solved"] * 3}, {"q": ["Solved"] * 3}, judge, rounds=3, seed=5)
    assert again.per_query["q"] == win.per_query["q"]
    assert {coin_flip(s, "q", 0) for s in range(20)} == {"candidate", "reference"}
    with pytest.raises(CodetoolError, match="judge"):
        compare_runs(cand, ref, {"q": ["Solved"] * 2}, {"q": ["Solved"] * 2}, None, rounds=2)


def test_render_trajectory_redacts(canary_env):
    t = traj("1")
    t.steps[0].candidates[0].result.stdout = f"key={canary_env}"
    assert canary_env not in render_trajectory(t)


# --- golden: StableToolBench's data example ----------------------------------------------------

def _replay_labels(recorded: dict[str, dict[str, list[str]]], runs: dict[str, list[Trajectory]]):
    """A judge answering from the recorded verdicts, keyed by the final answer text."""
    by_answer = {}
    for method, trajs in runs.items():
        for t in trajs:
            by_answer[t.final_answer] = recorded[method][t.query_id]

    def label(req):
        return Verdict(by_answer[req.answer][req.round], "recorded")
    return label


def test_golden_data_example_pass_and_win(shared_data):
    root = shared_data / "StableToolBench" / "data_example"
    ref_name, cand_name = "virtual_chatgpt_cot", "virtual_chatgpt_dfs"
    runs = {m: import_converted(root / "model_predictions_converted" / m / "G1_instruction.json")
            for m in (ref_name, cand_name)}
    recorded = {m: load_pass_results(root / "pass_rate_results" / m / f"G1_instruction_{m}.json") for m in runs}
    # The csv files hold the same verdicts (a dict printed as text, as upstream writes them).
    for m in runs:
        with open(root / "pass_rate_results" / m / f"G1_instruction_{m}.csv", newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                rounds = ast.literal_eval(row["is_solved"])
                assert [rounds[r].split(".")[-1] for r in sorted(rounds)] == recorded[m][row["query_id"]]

    judge = ScriptedJudge(_replay_labels(recorded, runs))
    verdicts = {m: judge_pass(runs[m], judge, rounds=3) for m in runs}
    labels = {m: {t.query_id: [v.label for v in row] for t, row in zip(runs[m], verdicts[m])} for m in runs}
    assert labels == recorded  # our rules agree with every recorded verdict
    # 588 of the CoT run never called Finish: Unsolved by rule, the judge was not asked.
    assert all(v.source == "rule" for t, row in zip(runs[ref_name], verdicts[ref_name]) if t.query_id == "588"
               for v in row)
    assert len(judge.answer_calls) == 3 * 5

    # Pass rates as eval_pass_rate.py prints them: "Solve rate: 66.7% Std: 0.0%" and 100.0%.
    def upstream(rec):
        scores = [sum({"Solved": 1, "Unsure": 0.5}.get(v[r], 0) for v in rec.values()) / len(rec) for r in range(3)]
        return sum(scores) / len(scores), float(np.std(scores))
    for m, expected in ((ref_name, "66.7"), (cand_name, "100.0")):
        ours = pass_rate(list(labels[m].values()), rounds=3)
        assert (ours.mean, ours.std) == upstream(recorded[m])
        assert f"{100 * ours.mean:.1f}" == expected and ours.std == 0.0

    # Win rate: replay the recorded preferences round by round.
    prefs = load_preference_results(root / "preference_results" / f"G1_instruction_{ref_name}_{cand_name}.json",
                                    reference=ref_name, candidate=cand_name)
    queue = {q: ["candidate"] * c.candidate + ["reference"] * c.reference for q, c in prefs.items()}
    answers = {t.final_answer: (cand_name, t.query_id) for t in runs[cand_name]}
    answers.update({t.final_answer: (ref_name, t.query_id) for t in runs[ref_name]})

    def winner(req):
        method, qid = answers[req.answer_a]
        pick = queue[qid].pop(0)
        return "a" if (pick == "candidate") == (method == cand_name) else "b"
    cmp_judge = ScriptedJudge(winner=winner)
    by_id = {m: {t.query_id: t for t in runs[m]} for m in runs}
    test_ids = ["588", "608", "1073"]
    win = compare_runs(by_id[cand_name], by_id[ref_name], labels[cand_name], labels[ref_name], cmp_judge,
                       rounds=3, query_ids=test_ids)
    assert {q: (c.candidate, c.reference) for q, c in win.per_query.items()} == \
        {q: (c.candidate, c.reference) for q, c in prefs.items()}
    assert (win.win, win.tie, win.lose) == (1.0, 0.0, 0.0)
    upstream_win = win_rate_from_counts(prefs)
    assert (upstream_win.win, upstream_win.tie) == (win.win, win.tie)
    # 588: the DFS answer is solved and the CoT one is not, so no comparison was needed.
    assert win.per_query["588"].judged == 0 and len(cmp_judge.compare_calls) == 6
    assert win_rate_from_counts({"x": PairCount(1, 2), "y": PairCount(2, 2)}).lose == 0.5


def test_two_runs_without_answers_flip_a_coin_without_a_judge():
    a, b = traj("q", answer=None, finish="max_steps"), traj("q", answer="  ", finish="max_steps")
    b.steps[0].candidates[0].code = "print(2)"  # different trajectories, still nothing to compare
    win = compare_runs({"q": a}, {"q": b}, {"q": ["Unsolved"]}, {"q": ["Unsolved"]}, None, rounds=1)
    assert win.tie == 0.0 and win.per_query["q"].judged == 0 and win.coin_flips == 1


def test_blank_finishes_go_to_the_judge_as_stabletoolbench_does():
    """judge.blank_finish judge: finish("") and finish("   ") are judged on ToolBench's JSON text (what
    StableToolBench's evaluator reads in our export); ours rules them Unsolved."""
    judge = ScriptedJudge("Unsure")
    trajs = [traj("1", answer=""), traj("2", answer="   "), traj("3", finish="max_steps", answer="")]
    assert [row[0].source for row in judge_pass(trajs, judge, rounds=1)] == ["rule"] * 3
    verdicts = judge_pass(trajs, judge, rounds=1, blank_finish="judge")
    assert [row[0].source for row in verdicts] == ["trajectory", "trajectory", "rule"]  # judged twice (Unsure)
    first = [r.answer for r in judge.answer_calls if r.trajectory is None]
    assert all('"return_type": "give_answer"' in a and '"final_answer"' in a for a in first) and len(first) == 2
