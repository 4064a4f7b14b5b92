"""Chosen steps as the public CodeTool code runs them: the re-run (its status and output), SCEP as
``eval/eval_SCEP.py`` counts it (against ``../shared/conformance/scep``, README §3), the
``answer.final_answer: reference`` procedure, and the main method's exact tie-break."""

from __future__ import annotations

from collections import defaultdict

import pytest
from conformance_stubs import StubEnv, corpus, jsonl, lost_runner, stub_runner

from codetool.eval.metrics import run_metrics
from codetool.executor import Executor, ExecutorConfig
from codetool.executor.result import ExecutionResult
from codetool.models.backends import ScriptedBackend
from codetool.search.answer import (
    AnswerConfig,
    ReferenceTexts,
    reference_answer_messages,
    write_final_answers,
)
from codetool.search.config import SearchConfig
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.reference import ReferenceRunner, chosen_programs, reference_steps
from codetool.search.search import SearchTask, select


def test_programs_of_chosen_steps_keep_an_empty_entry_for_a_reply_without_code():
    texts = ["no code here", "```python\nx = 1\nprint(x)\n```\n```python\ny = 2\n```", "```python\nprint(x)\n```"]
    # step 2 runs only its first block: the code-less step 1 left an (empty) history entry
    assert chosen_programs(texts) == [None, "x = 1\nprint(x)", "x = 1\npass\n\n\nprint(x)"]
    assert chosen_programs(texts[1:]) == ["x = 1\nprint(x)\n\n\ny = 2", "x = 1\npass\n\n\nprint(x)"]


def test_the_runner_reports_status_output_and_the_marker(tmp_path):
    with stub_runner() as runner:
        ok = runner.run("r = get_weather_for_weatherapi(city='Oslo')\nprint(r['temp'])")
        raised = runner.run("r = get_weather_for_weatherapi(city='Oslo')\nx = r['humidity']")
        marker = runner.run("print(geocode_for_geo(place='Rome'))")  # an error payload, printed: status 2
        silent = runner.run("print(top_headlines_for_news(topic='x'))")  # no marker: status 0
        broken = runner.run("x = (")
        answered = runner.run("finish('forty-two')\nprint('after')")  # finish prints; the step goes on
        big = runner.run("print('%s' % ('x' * 50000))")  # longer than our executor keeps: the verdict stands
    assert (ok.status, ok.res) == (0, "9")
    assert (raised.status, raised.res) == (1, "Exception Type: KeyError, Exception Value: 'humidity'")
    assert marker.status == 2 and marker.res.startswith("{'error': \"Function executing from")
    assert silent.status == 0 and "Rate limit" in silent.res
    assert broken.status == 1 and broken.res.startswith("Exception Type: SyntaxError")
    assert (answered.status, answered.res) == (0, "forty-two\nafter")
    assert big.status == 0 and set(big.res) == {"x"} and 10000 < len(big.res) <= 20000


def test_a_runner_from_a_task_wraps_its_tools_and_asks_each_call_once():
    calls = []

    class Env(StubEnv):
        def functions(self):
            funcs = super().functions()
            weather = funcs["get_weather_for_weatherapi"]

            def counted(city):
                calls.append(city)
                return weather(city)
            funcs["get_weather_for_weatherapi"] = counted
            return funcs

    task = SearchTask("q", "query", Env())
    make = lambda t: Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=t.env.functions())  # noqa: E731
    with ReferenceRunner.for_task(task, make) as runner:
        assert runner.run("print(get_weather_for_weatherapi('Rome')['temp'])").res == "27"
        assert runner.run("print(get_weather_for_weatherapi(city='Rome')['temp'])").res == "27"
        assert runner.run("print(geocode_for_geo('x')['response'] == '')").res == "True"
    assert calls == ["Rome"]  # the same call twice: answered once


def test_scep_of_the_48_trajectories_equals_eval_scep():
    """Per trajectory statuses, per group and pooled (83 / 197) as eval_SCEP.py printed them."""
    expected = __import__("json").loads(corpus("scep", "expected.json").read_text())
    trajs = [Trajectory.from_dict(r) for r in jsonl("scep", "trajectories.jsonl")]
    with stub_runner() as runner:
        for traj in trajs:
            traj.extra["reference_steps"] = reference_steps(traj, runner)
            want = expected["per_trajectory"][traj.query_id]
            assert [s["status"] for s in traj.extra["reference_steps"]] == want["statuses"], traj.query_id
    groups = defaultdict(list)
    for traj in trajs:
        groups[traj.group].append(traj)
    for group, want in expected["per_group"].items():
        m = run_metrics(groups[group])
        assert (m.reference_successful, m.reference_steps) == (want["successful_steps"], want["recorded_steps"])
        assert abs(m.scep - want["scep"]) <= 1e-12
    pooled = run_metrics(trajs)
    assert (pooled.reference_successful, pooled.reference_steps) == (83, 197)
    assert abs(pooled.scep - expected["pooled_all_groups"]["scep"]) <= 1e-12
    assert pooled.scep_code_steps != pooled.scep  # ours leaves code-less steps out


# -- answer.final_answer: reference -------------------------------------------------------------

def _step(text, code, stdout="", ok=True):
    result = ExecutionResult(ok=ok, stdout=stdout, error_type=None if ok else "KeyError",
                             error_message=None if ok else "KeyError: 'x'")
    return Step(0, [Candidate(0, text, code, result, chosen=True)], 0)


def _answer_traj():
    steps = [_step("##Step 1: find the weather\nPython Code:\n```python\nr = w('Paris')\nprint(r)\n```\n",
                   "r = w('Paris')\nprint(r)"),
             _step("##Step 2: read a missing field\n```python\nx = r['x']\n```\n", "x = r['x']"),
             _step("##Step 3: answer\n```python\nfinish('21 C')\n```\n", "finish('21 C')")]
    traj = Trajectory("5", "Weather in Paris?", "stabletoolbench", "G1_instruction", "m", steps=steps,
                      final_answer="21 C", finish_type="finish")
    traj.extra["reference_steps"] = [{"status": 0, "res": "{'temp': 21}"},
                                     {"status": 1, "res": "Exception Type: KeyError, Exception Value: 'x'"},
                                     {"status": 0, "res": "21 C"}]
    return traj


def test_reference_answers_drop_error_like_outputs_and_cover_finished_episodes(canary_env):
    traj = _answer_traj()
    traj.query += f" {canary_env}"
    texts = ReferenceTexts.load("")
    system, user = reference_answer_messages(traj, texts)
    assert system["role"] == "system" and canary_env not in user["content"]
    assert "{'temp': 21}" in user["content"] and "21 C" in user["content"]
    assert "KeyError" not in user["content"]  # the error-like output of step 2 is left out
    assert ": find the weather" in user["content"] and "Python Code:" not in user["content"]
    backend = ScriptedBackend(["It is 21 C in Paris."])
    assert write_final_answers([traj], backend, AnswerConfig(final_answer="reference")) == 1
    assert traj.final_answer == "It is 21 C in Paris." and traj.extra["finish_answer"] == "21 C"
    assert traj.extra["answer_procedure"] == "reference" and traj.extra["answer_texts"] == "ours"


def test_reference_answers_without_information_and_for_give_ups():
    traj = _answer_traj()
    traj.finish_type = "give_up"
    traj.extra["reference_steps"] = [{"status": 1, "res": "Error 500"}] * 3
    [message] = reference_answer_messages(traj, ReferenceTexts.load(""))
    assert message["role"] == "user" and "no valid information" in message["content"]
    from codetool.eval.stabletoolbench import rule_verdict

    assert rule_verdict(traj).label == "Unsolved"  # no regenerated answer yet: a give-up is ruled out
    write_final_answers([traj], ScriptedBackend(["No valid information could be obtained."]),
                        AnswerConfig(final_answer="reference"))
    assert rule_verdict(traj) is None  # CodeTool judges the answer it wrote, give-up or not


def test_reference_texts_are_read_from_the_users_checkout(tmp_path, monkeypatch):
    """A fixture checkout with our own placeholder texts in the right file: they are read and filled."""
    (tmp_path / "infer").mkdir()
    (tmp_path / "infer" / "generate_final_answer.py").write_text(
        "filter_words = ['BROKEN']\n"
        "PAIR_INFO = '<step {step}|{query}|{info}>'\n"
        "GENERATE_FINAL_ANS = '<ask {query} from {info}>'\n"
        "def get_fianl_answer(dir_path, save_path, model_name):\n"
        "    if True:\n"
        "        messages = [{'role': 'user', 'content': '<nothing found>'}]\n"
        "    else:\n"
        "        messages = [{'role': 'system', 'content': '<you summarise>'},\n"
        "                    {'role': 'user', 'content': GENERATE_FINAL_ANS.format(query=1, info=2)}]\n")
    monkeypatch.setenv("CODETOOL_CODETOOL_DIR", str(tmp_path))
    texts = ReferenceTexts.load("")
    assert texts.markers == ("BROKEN",) and texts.source == str(tmp_path)
    traj = _answer_traj()
    traj.extra["reference_steps"][1]["res"] = "BROKEN call"
    system, user = reference_answer_messages(traj, texts)
    assert system["content"] == "<you summarise>"
    # stripped, then 'Python Code:' removed (a newline stays before it, as in the public code)
    assert user["content"].startswith("<ask Weather in Paris? from <step 1|: find the weather\n|{'temp': 21}>")
    assert "BROKEN" not in user["content"] and "<step 3|: answer|21 C>" in user["content"]
    from codetool import CodetoolError

    with pytest.raises(CodetoolError, match="LimOkii/CodeTool"):
        ReferenceTexts.load(str(tmp_path / "missing"))


# -- the main method's tie-break, observation cuts ----------------------------------------------

def test_reference_tie_break_is_exact_and_keeps_the_first():
    a, b = Candidate(0, "", "a", r_spot=1.0, r_latent=0.3), Candidate(1, "", "b", r_spot=1.0, r_latent=0.3 + 1e-12)
    assert select([a, b], SearchConfig(tie_break="first")) == 0  # equal to 1e-9: the earlier
    assert select([a, b], SearchConfig(tie_break="reference")) == 1  # strictly greater wins
    b.r_latent = 0.3
    assert select([a, b], SearchConfig(tie_break="reference")) == 0


def test_observations_cut_head_only_in_reference_mode():
    from codetool.search.prompt import format_observation

    result = ExecutionResult(ok=True, stdout="a" * 300 + "b" * 300)
    head = format_observation(result, max_chars=500, cut="head")
    assert head == "Output:\n" + "a" * 300 + "b" * 200
    assert "characters cut" in format_observation(result, max_chars=500)


def test_a_reference_run_the_machine_could_not_make_has_no_status():
    from codetool.search.reference import ReferenceNotRun

    with lost_runner() as runner:
        with pytest.raises(ReferenceNotRun, match="failure of the machine"):
            runner.run("print(1)")
        t = Trajectory("1", "q", steps=[Step(0, [Candidate(0, "```python\nprint(1)\n```", "print(1)",
                                                           ExecutionResult(ok=True))], 0)])
        steps = reference_steps(t, runner)
    # not a raise (status 1): no status at all, and SCEP leaves it out
    assert steps == [{"status": None, "res": "", "not_executed": True}]
    t.extra["reference_steps"] = steps
    assert run_metrics([t]).scep is None and run_metrics([t]).reference_steps == 0


def test_reference_tools_keep_no_outage_for_the_next_re_run():
    """A call that met an outage is asked again by the next re-run (before, its answer was kept, so
    every re-run of the path repeated a transient outage); a real answer is kept."""
    from codetool.search.reference import ReferenceTools
    from codetool.tools.spec import ToolResponse

    answers = iter([ToolResponse("timeout", error="no answer", outage=True), ToolResponse("ok", content="7"),
                    ToolResponse("ok", content="8")])

    class Env:
        def functions(self):
            return {"lookup": lambda: next(answers)}

    lookup = ReferenceTools(Env()).functions()["lookup"]
    assert lookup().outage and lookup().content == "7" and lookup().content == "7"
