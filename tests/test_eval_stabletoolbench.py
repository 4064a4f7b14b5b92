"""SoPR / SoWR bookkeeping: rules, formula, win-rate cases, and the golden StableToolBench example."""

from __future__ import annotations

import ast
import csv
import json

import numpy as np
import pytest

from codetool import CodetoolError
from codetool.eval.convert import import_converted
from codetool.eval.preference import (
    PairCount,
    compare_runs,
    load_preference_results,
    win_rate_from_counts,
)
from codetool.eval.stabletoolbench import (
    answer_json,
    average_pass_rate,
    blank_answer,
    codetool_pass_rate,
    converted_answer,
    final_step,
    judge_pass,
    load_pass_results,
    majority_label,
    pass_rate,
    pass_rates_by_group,
    reference_rule,
    render_trajectory,
    rule_verdict,
)
from codetool.executor.result import ExecutionResult
from codetool.judge.records import ScriptedJudge, Verdict
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
    # no Finish call; the give-up's Finish arguments; give_up_and_restart inside the answer text.
    # A blank answer is judged: its final_answer is ToolBench's JSON text, not "" (StableToolBench).
    assert [row[0].label for row in verdicts] == ["Unsolved", "Solved", "Unsolved", "Unsolved", "Solved"]
    assert [row[0].source for row in verdicts] == ["rule", "answer", "rule", "rule", "answer"]
    assert len(judge.answer_calls) == 6 and {r.round for r in judge.answer_calls} == {0, 1, 2}
    assert rule_verdict(trajs[4]) is None and rule_verdict(trajs[0]).reason.startswith("the answer's last tool")


def test_the_judge_sees_the_final_answer_field_as_the_evaluator_does():
    judge = ScriptedJudge("Solved")
    judge_pass([traj("1")], judge, rounds=1)
    assert judge.answer_calls[0].answer == converted_answer(traj("1"))["final_answer"]
    assert json.loads(judge.answer_calls[0].answer) == {"return_type": "give_answer",
                                                        "final_answer": "Paris has 2.1 million people."}


def test_reference_rule_quirks():
    def answer(*messages, final="x", next_key=True):
        chain = []
        for message in reversed(("sys", "user") + messages):
            node = {"role": "tool" if not isinstance(message, str) or message.startswith("{") else "system",
                    "message": message}
            if next_key or chain:
                node["next"] = chain
            chain = [node]
        return {"final_answer": final, "answer_details": chain}
    finish = {"name": "Finish", "arguments": "{}", "response": ""}
    call = {"name": "weather_for_x", "arguments": "{}", "response": "{}"}
    assert reference_rule(answer(call, finish)) is None
    assert reference_rule(answer(finish, call)).label == "Unsolved"  # Finish not last
    assert reference_rule(answer(json.dumps(finish))).label == "Unsolved"  # JSON text: double quotes
    assert reference_rule(answer(finish, "")) is None or True  # an empty message is skipped
    assert final_step(answer(finish, {"name": "", "arguments": "", "response": ""})).startswith("Final step: {'name': ''")
    assert reference_rule(answer(call, finish, final="")).reason == "empty final answer"
    assert reference_rule(answer(call, finish, final="   ")) is None  # only "" is empty
    assert reference_rule(answer(call, finish, final="x Give_up_and_restart")) is None  # case-sensitive
    assert reference_rule(answer(call, finish, final="x give_up_and_restart y")).reason == "the answer gives up"
    assert reference_rule(answer(call, finish, final=""), finish_check=False).label == "Unsolved"
    assert reference_rule(answer(call), finish_check=False) is None  # the preference run has no Finish check


def test_unsure_is_rejudged_with_the_whole_answer():
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
    # json.dumps(answer): the converted answer, method and step count included, ASCII escapes
    assert judge.answer_calls[1].trajectory == json.dumps(converted_answer(traj("1")))
    details = json.loads(judge.answer_calls[1].trajectory)
    assert list(details) == ["method", "total_steps", "final_answer", "answer_details"]
    assert json.loads(details["final_answer"])["final_answer"] == "Paris has 2.1 million people."
    chain, roles = details["answer_details"], []
    while chain:
        roles.append(chain[0]["role"])
        chain = chain[0]["next"]
    assert roles == ["system", "user", "assistant", "tool", "tool"]  # step, its call, Finish
    assert row[0].label == "Unsure" and row[0].source == "trajectory"
    assert answer_json({"a": "é"}) == '{"a": "\\u00e9"}' and answer_json({"a": "x" * 50}, 10).startswith('{"a": "xxx')


def test_codetool_protocol_is_a_single_pass_without_rules():
    judge = ScriptedJudge(lambda req: "Unsure")
    trajs = [traj("1"), traj("2", finish="max_steps", answer=None), traj("3", finish="give_up", answer="no")]
    rows = judge_pass(trajs, judge, rounds=1, protocol="codetool")
    assert len(judge.answer_calls) == 3 and all(row[0].source == "answer"
                                                for row in rows)
    assert [r.answer for r in judge.answer_calls] == ["Paris has 2.1 million people.", "", "no"]
    assert pass_rate([[v.label for v in row] for row in rows], 1).mean == 0.5


def test_codetool_pass_rate_divides_by_every_query():
    ids, labels = ["100", "1692", "7"], [["Solved"], ["Solved"], ["Unsure"]]
    # "692" is a filter id: query 1692 contains it, so it leaves the sum but not the count
    assert codetool_pass_rate(ids, labels, 1, ["692"]).mean == pytest.approx(1.5 / 3)
    assert codetool_pass_rate(ids, labels, 1).mean == pass_rate(labels, 1).mean == pytest.approx(2.5 / 3)


def test_generated_answers_are_judged_and_give_ups_cost_nothing():
    generated = traj("1", finish="max_steps", answer="Paris has 2.1 million people.")
    generated.extra["answer_source"] = "generated"
    gave_up = traj("2", finish="give_up", answer="I could not do it")
    gave_up.extra["answer_source"] = "generated"
    judge = ScriptedJudge("Solved")
    verdicts = judge_pass([generated, gave_up, traj("3", finish="max_steps", answer=None)], judge, rounds=2)
    assert [row[0].label for row in verdicts] == ["Solved", "Unsolved", "Unsolved"]
    assert [json.loads(r.answer)["final_answer"] for r in judge.answer_calls] == ["Paris has 2.1 million people."] * 2


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


def test_render_trajectory_redacts(canary_env):
    t = traj("1")
    t.steps[0].candidates[0].result.stdout = f"key={canary_env}"
    assert canary_env not in render_trajectory(t)


# --- golden: StableToolBench's data example ----------------------------------------------------

def _replay_labels(recorded: dict[str, dict[str, list[str]]], runs: dict[str, list[Trajectory]]):
    """A judge answering from the recorded verdicts, keyed by the final answer field (its first
    1,000 characters, all the preference run shows)."""
    by_answer = {}
    for method, trajs in runs.items():
        for t in trajs:
            by_answer[converted_answer(t)["final_answer"][:1000]] = recorded[method][t.query_id]

    def label(req):
        return Verdict(by_answer[req.answer[:1000]][req.round], "recorded")
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
    answers = {converted_answer(t)["final_answer"][:1000]: (m, t.query_id) for m in runs for t in runs[m]}

    def winner(req):
        method, qid = answers[req.answer_a]
        pick = queue[qid].pop(0)
        return "a" if (pick == "candidate") == (method == cand_name) else "b"
    # each preference round judges both answers again (here: the recorded labels of that round)
    cmp_judge = ScriptedJudge(_replay_labels(recorded, runs), winner=winner)
    by_id = {m: {t.query_id: t for t in runs[m]} for m in runs}
    test_ids = ["588", "608", "1073"]
    win = compare_runs(by_id[cand_name], by_id[ref_name], cmp_judge, rounds=3, query_ids=test_ids)
    assert {q: (c.candidate, c.reference) for q, c in win.per_query.items()} == \
        {q: (c.candidate, c.reference) for q, c in prefs.items()}
    assert (win.win, win.tie, win.lose) == (1.0, 0.0, 0.0)
    upstream_win = win_rate_from_counts(prefs)
    assert (upstream_win.win, upstream_win.tie) == (win.win, win.tie)
    # 588: the DFS answer is solved and the CoT one is not, so no comparison was needed.
    assert win.per_query["588"].judged == 0 and len(cmp_judge.compare_calls) == 6
    assert win_rate_from_counts({"x": PairCount(1, 2), "y": PairCount(2, 2)}).lose == 0.5


# --- conformance: StableToolBench's eval_pass_rate.py on shared/conformance/stabletoolbench --------

@pytest.mark.parametrize("run", ["candidate", "reference"])
def test_pass_rate_conformance(stb_conformance, run):
    for group in stb_conformance.groups:
        expected = stb_conformance.expected_pass[run][group]
        trajs = stb_conformance.trajectories(run, group)
        judge = stb_conformance.judge_factory()
        verdicts = judge_pass(trajs, judge, rounds=3)
        labels = {t.query_id: [v.label for v in row] for t, row in zip(trajs, verdicts)}
        assert labels == expected["labels"], group
        assert sorted(t.query_id for t, row in zip(trajs, verdicts) if row[0].source == "rule") == \
            sorted(expected["rule_decided"]), group
        assert sorted(t.query_id for t, row in zip(trajs, verdicts) if row[0].source != "rule") == \
            sorted(expected["judged"]), group
        rate = pass_rate(list(labels.values()), rounds=3)
        assert rate.per_round == pytest.approx(expected["per_round"], abs=1e-12)
        assert 100 * rate.mean == pytest.approx(expected["solve_rate"], abs=1e-12)
        assert 100 * rate.std == pytest.approx(expected["std"], abs=1e-12)
        assert f"Solve rate: {100 * rate.mean:.1f}% Std: {100 * rate.std:.1f}%" == expected["printed"]


def test_blank_finish_ours_rules_blank_answers_out():
    trajs = [traj("1", answer="   "), traj("2", answer=""), traj("3")]
    judge = ScriptedJudge("Solved")
    assert [row[0].label for row in judge_pass(trajs, judge, 1)] == ["Solved", "Solved", "Solved"]  # judged
    ours = judge_pass(trajs, ScriptedJudge("Solved"), 1, blank_finish="unsolved")
    assert [(row[0].label, row[0].source) for row in ours] == [("Unsolved", "rule")] * 2 + [("Solved", "answer")]
    assert blank_answer('{"return_type": "give_answer", "final_answer": " "}') and blank_answer("  ")
    assert not blank_answer('{"return_type": "give_up_and_restart"}') and not blank_answer("x")


def test_blank_finish_judge_sends_toolbench_json_text_through_both_stages():
    """judge.blank_finish judge: finish("") and finish("   ") are judged on ToolBench's JSON text (what
    StableToolBench's evaluator reads in our export), an Unsure one again from the whole answer; an
    episode without a finish stays ruled out under both settings."""
    trajs = [traj("1", answer=""), traj("2", answer="   "), traj("3", finish="max_steps", answer="")]
    ours = judge_pass(trajs, ScriptedJudge("Unsure"), rounds=1, blank_finish="unsolved")
    assert [row[0].source for row in ours] == ["rule"] * 3
    judge = ScriptedJudge("Unsure")
    verdicts = judge_pass(trajs, judge, rounds=1, blank_finish="judge")
    assert [row[0].source for row in verdicts] == ["trajectory", "trajectory", "rule"]
    first = [r.answer for r in judge.answer_calls if r.trajectory is None]
    assert len(first) == 2 and all(json.loads(a)["return_type"] == "give_answer" for a in first)


def test_a_give_up_whose_answer_was_regenerated_is_judged():
    """answer.final_answer reference writes an answer for a given-up trajectory too; its export is a
    give_answer Finish call, so the converted-answer rule sends it to the judge (CodeTool judges
    every answer it wrote), while a plain give-up stays ruled out."""
    plain = traj("1", finish="give_up", answer="")
    again = traj("2", finish="give_up", answer="Paris has 2.1 million people.")
    again.extra.update({"answer_source": "generated", "answer_procedure": "reference"})
    verdicts = judge_pass([plain, again], ScriptedJudge("Solved"), rounds=1)
    assert [(row[0].label, row[0].source) for row in verdicts] == [("Unsolved", "rule"), ("Solved", "answer")]


def test_episodes_the_machine_could_not_run_leave_the_pass_rate_and_are_counted():
    from codetool.eval.markdown import _detail_header, _detail_rows
    from codetool.eval.runs import Run
    from codetool.eval.stabletoolbench import evaluate

    lost = Trajectory("3", "q", benchmark="stabletoolbench", group="G1", finish_type="error",
                      error="not executed: ...", extra={"not_executed": {"step": 0, "candidates": 2, "attempts": 6}})
    trajs = [traj("1"), traj("2", finish="max_steps"), lost]
    labels = {"m": [["Solved"], ["Unsolved"], ["Unsolved"]]}
    out = evaluate([Run("m", "x", trajs)], labels, 1, ["stabletoolbench"])["stabletoolbench"]["methods"]["m"]
    # 1 of the 2 episodes that ran is Solved: 0.5, not 1/3 (the lost one is no Unsolved)
    for part in (out["groups"]["G1"], out["overall"]):
        assert part["pass_rate"]["mean"] == pytest.approx(0.5) and part["n"] == 2
        assert part["not_executed"] == 1
    header = _detail_header("stabletoolbench")
    row = dict(zip(header, _detail_rows("stabletoolbench", out)[-1]))
    assert row["not executed"] == 1
