"""The decide-first router: decisions, confidence, every route, fallback, records.

The executor and tool environment are small in-test fakes (the code they run is scripted here):
the fake executor ``exec``s the scripted steps in a dict namespace, forks by copying it, and counts
open executors so that leaks show up.
"""

from __future__ import annotations

import copy
import math

import pytest

from codetool import CodetoolError, assemble
from codetool.config import ConfigError
from codetool.decide.router import route_and_solve
from codetool.decide.stage import (
    NONE,
    Decision,
    RouterConfig,
    decide,
    option_probabilities,
    parse_choice,
    route_for,
)
from codetool.executor.result import ExecutionResult
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.search import SearchTask

WEATHER, NEWS = "current_weather_for_weatherapi", "top_headlines_for_newsapi"


class ToolError(Exception):
    pass


class FakeExecutor:
    """run/fork/close over a namespace dict; tool functions record their calls."""

    open_count = 0

    def __init__(self, namespace=None):
        self.namespace = namespace if namespace is not None else {}
        self.closed = False
        FakeExecutor.open_count += 1

    def fork(self):
        return FakeExecutor(copy.copy(self.namespace))

    def close(self):
        if not self.closed:
            self.closed = True
            FakeExecutor.open_count -= 1

    def run(self, code):
        calls, out, ended = [], [], {}

        def tool(name, status="ok", value=None):
            def fn(**kwargs):
                calls.append({"name": name, "arguments": kwargs, "status": status})
                if status != "ok":
                    raise ToolError(f"{name} failed")
                return value
            return fn

        env = dict(self.namespace)
        env.update({WEATHER: tool(WEATHER, value={"temp_c": 21}), NEWS: tool(NEWS, status="http_error"),
                    "print": lambda *a: out.append(" ".join(map(str, a))),
                    "finish": lambda answer: ended.setdefault("final_answer", answer),
                    "give_up": lambda reason: ended.setdefault("give_up_reason", reason)})
        try:
            exec(code, env)
            ok, error_type, message = True, None, None
        except Exception as e:  # the scripted step's own error, reported like the executor does
            ok, error_type, message = False, type(e).__name__, str(e)
        self.namespace = {k: v for k, v in env.items() if k not in (WEATHER, NEWS, "print", "finish", "give_up")
                          and not k.startswith("__")}
        return ExecutionResult.from_dict(dict(ok=ok, outcome="ok" if ok else "runtime_error", stdout="\n".join(out) + ("\n" if out else ""),
                          error_type=error_type, error_message=message, tool_calls=calls, **ended))


class FakeEnv:
    apis = None

    def describe(self):
        return [{"name": WEATHER, "tool": "WeatherAPI", "api": "current weather",
                 "description": "Current weather of a city"},
                {"name": NEWS, "tool": "NewsAPI", "api": "top headlines", "description": "Top news headlines"}]

    def render(self):
        return f"def {WEATHER}(city: str): ...\ndef {NEWS}(country: str): ..."

    def api_for(self, name):
        return None


def scores_for(table):
    """option_scores giving each option a log-prob from ``table[query keyword]``; the content-free
    request of calibration gets equal scores unless the table has an "N/A" entry."""
    def option_scores(prompt, options):
        text = prompt[-1]["content"]
        if "Request: N/A" in text and "N/A" not in table:
            return [-1.0] * len(options)
        for key, probs in table.items():
            if key in text:
                return [math.log(probs.get(o, 1e-6)) for o in options]
        raise AssertionError(f"no scores scripted for {text!r}")
    return option_scores


def make_search(policy, **cfg):
    config = SearchConfig(k=1, max_steps=3, latent="none", w_latent=0.0, temperature=0.0, **cfg)
    return assemble.make_search(policy, config, make_executor=lambda task: FakeExecutor())


def task(qid, query):
    return SearchTask(query_id=qid, query=query, env=FakeEnv(), benchmark="custom")


@pytest.fixture(autouse=True)
def no_leaks():
    FakeExecutor.open_count = 0
    yield
    assert FakeExecutor.open_count == 0, "an executor was left open"


# ----- decision stage ------------------------------------------------------------------------

def test_parse_choice_is_robust_to_formatting():
    names = [WEATHER, NEWS, "search_for_x", "search_for_x_2"]
    assert parse_choice(f"`{WEATHER}`", names) == WEATHER
    assert parse_choice(f"Answer: {NEWS}()", names) == NEWS
    assert parse_choice("NONE.", names) == NONE
    assert parse_choice("none", names) == NONE
    assert parse_choice("No function is needed here.", names) == NONE
    assert parse_choice("search_for_x_2", names) == "search_for_x_2"  # not its prefix search_for_x
    assert parse_choice(f"NONE, not {WEATHER}", names) == NONE  # the earliest mention wins
    assert parse_choice("current_weather_for_weatherap", names) == WEATHER  # cut-off name
    assert parse_choice("CURRENT_WEATHER_FOR_WEATHERAPI", names) == WEATHER
    assert parse_choice("I would call the weather one", names) is None
    assert parse_choice("", names) is None


def test_option_probabilities_sum_and_per_character():
    # sum: softmax of the raw log-probs
    probs = option_probabilities([math.log(0.2), math.log(0.6)], ["NONE", "a_long_name"])
    assert probs == pytest.approx([0.25, 0.75])
    # chars: -1.2/4 = -0.3 vs -0.6/12 = -0.05 -> softmax([-0.3, -0.05])
    probs = option_probabilities([-1.2, -0.6], ["NONE", "a_long_namex"], "chars")
    expected = math.exp(-0.05) / (math.exp(-0.3) + math.exp(-0.05))
    assert probs[1] == pytest.approx(expected)
    assert option_probabilities([-math.inf, -math.inf], ["a", "b"]) == [0.5, 0.5]


def test_logprob_decisions_are_batched_and_normalised():
    backend = ScriptedBackend([], option_scores=scores_for({"capital": {NONE: 0.5, WEATHER: 0.25, NEWS: 0.25},
                                                            "rain": {NONE: 0.1, WEATHER: 0.8, NEWS: 0.1}}))
    calls = []
    inner = backend.option_logprobs
    backend.option_logprobs = lambda prompts, options: calls.append(len(prompts)) or inner(prompts, options)
    cands = [(d["name"], d["description"]) for d in FakeEnv().describe()]
    decisions = decide(backend, [("capital of France?", cands), ("will it rain in Paris?", cands)],
                       RouterConfig())
    assert calls == [3]  # one call for both queries (same tool set) and the content-free request
    assert [d.choice for d in decisions] == [NONE, WEATHER]
    assert decisions[0].confidence == pytest.approx(0.5 / (0.5 + 0.25 + 0.25 + 0.0), rel=1e-4)
    assert decisions[1].confidence == pytest.approx(0.8, rel=1e-4)
    assert sum(decisions[1].scores.values()) == pytest.approx(1.0)
    assert decisions[0].method == "logprobs" and len(decisions[0].logprobs) == 3
    assert decisions[0].prompt_tokens > 0 and decisions[0].scored_tokens == round(3 * 1.5)
    assert decisions[0].null_logprobs == [-1.0] * 3


def test_calibration_subtracts_the_content_free_scores():
    # raw: NONE 0.5, weather 0.1, news 0.4; content-free: NONE 0.8, weather 0.05, news 0.3
    table = {"rain": {NONE: 0.5, WEATHER: 0.1, NEWS: 0.4}, "N/A": {NONE: 0.8, WEATHER: 0.05, NEWS: 0.3}}
    backend = ScriptedBackend([], option_scores=scores_for(table))
    cands = [(d["name"], "") for d in FakeEnv().describe()]
    [raw] = decide(backend, [("rain tomorrow?", cands)], RouterConfig(calibrate=False))
    [cal] = decide(backend, [("rain tomorrow?", cands)], RouterConfig())
    assert raw.choice == NONE and raw.null_logprobs == []
    ratios = [0.5 / 0.8, 0.1 / 0.05, 0.4 / 0.3]  # P(o | query) / P(o | content-free), renormalised
    assert cal.choice == WEATHER and cal.confidence == pytest.approx(ratios[1] / sum(ratios), rel=1e-4)
    assert cal.scores[NONE] == pytest.approx(ratios[0] / sum(ratios), rel=1e-4)


def test_agreement_decisions_count_votes_of_all_samples():
    replies = [WEATHER, f"`{WEATHER}`", "NONE", "hmm", f"{WEATHER}()"]
    backend = ScriptedBackend(replies)  # no option_scores: agreement is used
    cands = [(d["name"], "") for d in FakeEnv().describe()]
    [d] = decide(backend, [("will it rain?", cands)], RouterConfig(samples=5, temperature=0.7))
    assert d.method == "agreement" and d.choice == WEATHER
    assert d.confidence == pytest.approx(3 / 5)  # the unparseable reply still counts in the denominator
    assert d.samples == [WEATHER, WEATHER, NONE, "?", WEATHER]
    assert backend.calls[0][1]["n"] == 5 and backend.calls[0][1]["temperature"] == 0.7
    [d] = decide(ScriptedBackend(["??", "..."]), [("q", cands)], RouterConfig(samples=2))
    assert d.choice is None and d.confidence == 0.0


def test_logprobs_method_needs_a_scoring_backend_and_config_is_validated():
    with pytest.raises(CodetoolError, match="agreement"):
        decide(ScriptedBackend(["x"]), [("q", [])], RouterConfig(method="logprobs"))
    with pytest.raises(ConfigError, match="t_none"):
        RouterConfig(t_none=1.5)
    with pytest.raises(ConfigError, match="temperature"):
        RouterConfig(method="agreement", temperature=0.0)


def test_route_for_thresholds():
    cfg = RouterConfig(t_none=0.7, t_tool=0.5)
    assert route_for(Decision(NONE, 0.7, "logprobs"), cfg) == "direct"
    assert route_for(Decision(NONE, 0.69, "logprobs"), cfg) == "search"
    assert route_for(Decision(WEATHER, 0.5, "logprobs"), cfg) == "fast"
    assert route_for(Decision(WEATHER, 0.49, "logprobs"), cfg) == "search"
    assert route_for(Decision(None, 0.0, "agreement"), cfg) == "search"


# ----- routing -------------------------------------------------------------------------------

SCORES = {"capital": {NONE: 0.9, WEATHER: 0.05, NEWS: 0.05},
          "umbrella": {NONE: 0.05, WEATHER: 0.9, NEWS: 0.05},
          "headlines": {NONE: 0.05, WEATHER: 0.05, NEWS: 0.9},
          "unsure": {NONE: 0.34, WEATHER: 0.33, NEWS: 0.33}}


def as_reply(text, prompt):
    """A scripted reply as the backend would return it: with ``code_prefix`` the prompt ends with an
    opening fence and generation stops at the closing one, so only the code comes back."""
    if prompt[-1]["role"] == "assistant" and prompt[-1]["content"].endswith("```python\n"):
        parts = text.split("```python\n", 1)
        return parts[1].split("```")[0] if len(parts) == 2 else text
    return text


def policy_from(replies):
    """A scripted policy that picks its reply by a keyword of the prompt."""
    def reply(prompt):
        text = "\n".join(m["content"] for m in prompt)
        for key, value in replies:
            if key in text:
                return as_reply(value, prompt)
        raise AssertionError(f"no reply scripted for {text[-300:]!r}")
    return ScriptedBackend(reply, option_scores=scores_for(SCORES))


def test_none_route_answers_directly_without_tools(canary_env):
    policy = policy_from([("capital", "Paris is the capital of France.")])
    [traj] = route_and_solve([task("q1", f"What is the capital of France? key={canary_env}")],
                             RouterConfig(), make_search(policy), policy)
    assert traj.finish_type == "finish" and traj.final_answer == "Paris is the capital of France."
    assert traj.steps == [] and traj.method == "spot+latent+router"
    r = traj.routing
    assert r["route"] == "direct" and r["choice"] == NONE and r["tool"] is None and r["method"] == "logprobs"
    assert r["confidence"] == pytest.approx(0.9, rel=1e-4) and r["fallback"] is None
    assert r["tokens"]["prompt"] > 0 and traj.prompt_tokens >= r["tokens"]["prompt"] + r["tokens"]["scored"]
    assert len(policy.calls) == 1 and policy.calls[0][1]["max_new_tokens"] == RouterConfig().answer_max_new_tokens
    assert all(canary_env not in m["content"] for m in policy.calls[0][0][0])


def test_fast_path_success_takes_one_step():
    code = f"```python\nr = {WEATHER}(city='Paris')\nfinish('Take an umbrella: ' + str(r['temp_c']))\n```"
    policy = policy_from([("umbrella", code)])
    [traj] = route_and_solve([task("q2", "Do I need an umbrella in Paris?")], RouterConfig(),
                             make_search(policy), policy)
    assert traj.finish_type == "finish" and traj.final_answer == "Take an umbrella: 21"
    assert len(traj.steps) == 1 and traj.steps[0].chosen_candidate.r_spot == 1.0
    assert traj.routing["route"] == "fast" and traj.routing["tool"] == WEATHER and traj.routing["fallback"] is None
    prompt = policy.calls[0][0][0]
    assert f"the function {WEATHER} fits this request" in prompt[1]["content"]
    assert traj.query == "Do I need an umbrella in Paris?"  # the hint is not part of the record
    assert policy.calls[0][1]["temperature"] == 0.0


def test_fast_path_failure_falls_back_to_the_search_from_that_state():
    failing = f"```python\nx = 41\nr = {NEWS}(country='fr')\n```"  # a tool error after setting state
    recover = "```python\nfinish(str(x + 1))\n```"  # needs x from the fast step's state
    policy = policy_from([("Error (ToolError)", recover), ("headlines", failing)])
    [traj] = route_and_solve([task("q3", "Top headlines in France?")], RouterConfig(), make_search(policy), policy)
    assert traj.routing["route"] == "fast" and traj.routing["fallback"] == "code_error"
    assert [s.index for s in traj.steps] == [0, 1]
    assert traj.steps[0].chosen_candidate.code.startswith("x = 41")
    assert traj.finish_type == "finish" and traj.final_answer == "42"  # the search kept the fast step's state
    search_prompt = policy.calls[1][0][0]
    assert "x = 41" in search_prompt[2]["content"] and "ToolError" in search_prompt[3]["content"]
    assert traj.prompt_tokens > sum(c.prompt_tokens for s in traj.steps for c in s.candidates)


@pytest.mark.parametrize("fast_reply, reason", [
    ("", "no_code"),  # with code_prefix an empty continuation is the only way to write no code
    (f"```python\nr = {WEATHER}(city='Paris')\nprint(r)\n```", "no_finish"),
    ("```python\nfinish('sunny, probably')\n```", "no_tool_call"),
    ("```python\ngive_up('cannot')\n```", "give_up"),
])
def test_every_fast_path_failure_kind_falls_back(fast_reply, reason):
    policy = policy_from([("Write the next step", "```python\nfinish('done')\n```"), ("umbrella", fast_reply)])
    [traj] = route_and_solve([task("q4", "Do I need an umbrella?")], RouterConfig(), make_search(policy), policy)
    assert traj.routing["fallback"] == reason and traj.final_answer == "done" and len(traj.steps) == 2


def test_a_reply_without_a_code_block_falls_back_without_code_prefix():
    policy = policy_from([("Write the next step", "```python\nfinish('done')\n```"), ("umbrella", "no code at all")])
    [traj] = route_and_solve([task("q4", "Do I need an umbrella?")], RouterConfig(),
                             make_search(policy, code_prefix=False), policy)
    assert traj.routing["fallback"] == "no_code" and traj.steps[0].chosen_candidate.code is None
    assert traj.final_answer == "done"


def test_low_confidence_goes_to_the_full_search():
    code = f"```python\nfinish(str({WEATHER}(city='Oslo')['temp_c']))\n```"
    policy = policy_from([("unsure", code)])
    [traj] = route_and_solve([task("q5", "unsure what this needs")], RouterConfig(t_none=0.6, t_tool=0.6),
                             make_search(policy), policy)
    assert traj.routing["route"] == "search" and traj.routing["confidence"] == pytest.approx(0.34, rel=1e-3)
    # the search got the confidence with the task (compute_optimal's difficulty: router)
    assert traj.extra["decision_confidence"] == pytest.approx(0.34, rel=1e-3)
    assert traj.final_answer == "21" and len(traj.steps) == 1
    assert "Hint:" not in policy.calls[0][0][0][1]["content"]  # the normal policy prompt
    assert traj.phase_seconds["decision"] >= 0 and traj.method.endswith("+router")


def test_mixed_batch_keeps_task_order_and_batches_each_route():
    weather = f"```python\nfinish(str({WEATHER}(city='Rome')['temp_c']))\n```"
    policy = policy_from([("capital", "Rome."), ("umbrella", weather), ("unsure", weather)])
    tasks = [task("a", "unsure about this"), task("b", "capital of Italy?"), task("c", "umbrella in Rome?"),
             task("d", "capital of Spain?"), task("e", "umbrella in Oslo?")]
    seen = []
    trajs = route_and_solve(tasks, RouterConfig(), make_search(policy), policy, on_done=lambda t: seen.append(t.query_id))
    assert [t.query_id for t in trajs] == ["a", "b", "c", "d", "e"]
    assert [t.routing["route"] for t in trajs] == ["search", "direct", "fast", "direct", "fast"]
    assert sorted(seen) == ["a", "b", "c", "d", "e"]
    sizes = [len(prompts) for prompts, _ in policy.calls]
    assert sizes == [2, 2, 1]  # direct answers in one call, fast steps in one call, then the search


def test_precomputed_decisions_and_duplicate_ids():
    policy = policy_from([("capital", "Paris.")])
    d = Decision(NONE, 0.95, "agreement", scores={NONE: 0.95}, samples=[NONE] * 3)
    [traj] = route_and_solve([task("q", "capital?")], RouterConfig(), make_search(policy), policy, decisions=[d])
    assert traj.routing["method"] == "agreement" and traj.routing["samples"] == [NONE] * 3
    with pytest.raises(CodetoolError, match="twice"):
        route_and_solve([task("q", "capital?"), task("q", "capital?")], RouterConfig(), make_search(policy), policy)


def test_decide_through_a_real_transformers_backend(tiny_model_dir):
    from codetool.models.backends import TransformersBackend

    backend = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")
    cands = [(d["name"], d["description"]) for d in FakeEnv().describe()]
    items = [("What is the capital of France?", cands), ("Will it rain in Paris?", cands)]
    decisions = decide(backend, items, RouterConfig())
    for d in decisions:
        assert d.method == "logprobs" and d.choice in (NONE, WEATHER, NEWS)
        assert sum(d.scores.values()) == pytest.approx(1.0) and 0 < d.confidence <= 1
        assert len(d.logprobs) == len(d.null_logprobs) == 3 and all(x <= 0 for x in d.logprobs)
        expected = [a - b for a, b in zip(d.logprobs, d.null_logprobs)]
        assert [d.scores[o] for o in (NONE, WEATHER, NEWS)] == pytest.approx(
            option_probabilities(expected, [NONE, WEATHER, NEWS]))
        assert d.prompt_tokens > 50 and d.scored_tokens > 3
    [sampled] = decide(backend, items[:1], RouterConfig(method="agreement", samples=3, max_new_tokens=8))
    assert len(sampled.samples) == 3 and sampled.completion_tokens > 0


# ----- Probe&Prefill (When2Tool) ----------------------------------------------------------------

def probe_decision(p_tool, t_probe=0.5):
    none = p_tool < t_probe
    return Decision(NONE if none else None, 1 - p_tool if none else p_tool, "probe", p_tool=p_tool)


def test_probe_routes_by_p_tool_and_prefill():
    soft, hard = RouterConfig(t_probe=0.4), RouterConfig(t_probe=0.4, prefill="hard")
    assert route_for(probe_decision(0.39), soft) == "fast" and route_for(probe_decision(0.39), hard) == "direct"
    assert route_for(probe_decision(0.4), soft) == "search" == route_for(probe_decision(0.4), hard)
    with pytest.raises(ConfigError, match="router.probe"):
        RouterConfig(method="probe")
    with pytest.raises(ConfigError, match="prefill"):
        RouterConfig(prefill="medium")


def test_soft_prefill_no_tool_side_is_a_steered_step_that_may_finish_without_a_tool():
    from codetool.decide.router import prefill_text

    policy = policy_from([("France", "```python\nfinish('Paris')\n```")])
    d = probe_decision(0.2)
    [traj] = route_and_solve([task("p1", "What is the capital of France?")], RouterConfig(), make_search(policy),
                             policy, decisions=[d])
    steer = prefill_text(d, "fast", RouterConfig())
    assert steer.startswith("This request needs no function")
    assert policy.calls[0][0][0][-1] == {"role": "assistant", "content": steer + "```python\n"}
    assert "fits this request" not in policy.calls[0][0][0][1]["content"]  # no function hint for the probe
    assert traj.routing["route"] == "fast" and traj.routing["fallback"] is None and traj.final_answer == "Paris"
    assert traj.steps[0].chosen_candidate.text.startswith(steer + "```python\nfinish('Paris')")
    assert traj.routing["p_tool"] == 0.2 and traj.routing["prefill"] == "soft" and traj.routing["prefill_text"] == steer


def test_soft_prefill_fast_step_that_does_not_finish_falls_back_without_a_prefill():
    policy = policy_from([("Write the next step", "```python\nfinish('21 degrees')\n```"),
                          ("weather", f"```python\nr = {WEATHER}(city='Paris')\nprint(r)\n```")])
    [traj] = route_and_solve([task("p2", "What is the weather in Paris?")], RouterConfig(), make_search(policy), policy,
                             decisions=[probe_decision(0.1)])
    assert traj.routing["fallback"] == "no_finish" and len(traj.steps) == 2 and traj.final_answer == "21 degrees"
    assert policy.calls[1][0][0][-1]["content"] == "```python\n"  # the search's step: code_prefix only


@pytest.mark.parametrize("prefill", ["soft", "hard"])
def test_tool_side_runs_the_search_with_its_first_reply_prefilled(prefill):
    first = f"```python\nr = {WEATHER}(city='Paris')\nprint(r)\n```"
    policy = policy_from([("Write the next step", "```python\nfinish('21 degrees')\n```"), ("weather", first)])
    cfg = RouterConfig(prefill=prefill)
    [traj] = route_and_solve([task("p3", "What is the weather in Paris?")], cfg, make_search(policy), policy,
                             decisions=[probe_decision(0.9)])
    assert traj.routing["route"] == "search" and traj.final_answer == "21 degrees"
    opening = policy.calls[0][0][0][-1]
    want = "```python\n" if prefill == "hard" else "This request needs a function call"
    assert opening["role"] == "assistant" and opening["content"].startswith(want)
    assert opening["content"].endswith("```python\n") and opening["content"].count("```python") == 1
    assert policy.calls[1][0][0][-1]["content"] == "```python\n"  # only the first step is prefilled


def test_hard_prefill_no_tool_side_answers_directly():
    policy = policy_from([("capital", "Paris.")])
    [traj] = route_and_solve([task("p4", "What is the capital of France?")], RouterConfig(prefill="hard"),
                             make_search(policy), policy, decisions=[probe_decision(0.05)])
    assert traj.routing["route"] == "direct" and traj.steps == [] and traj.final_answer == "Paris."
    assert traj.routing["prefill_text"] == ""


def test_prefill_without_code_prefix_is_kept_in_the_candidate_text():
    policy = policy_from([("France", "```python\nfinish('Paris')\n```")])
    search = make_search(policy, code_prefix=False)
    [traj] = route_and_solve([task("p5", "What is the capital of France?")], RouterConfig(), search, policy,
                             decisions=[probe_decision(0.2)])
    assert policy.calls[0][0][0][-1]["content"].startswith("This request needs no function")
    assert traj.steps[0].chosen_candidate.text.startswith("This request needs no function")
    assert traj.final_answer == "Paris"


def test_a_fast_step_the_machine_could_not_run_falls_back_as_not_executed_not_as_a_code_error():
    from codetool.decide.router import fast_failure
    from codetool.executor.result import ExecutionResult
    from codetool.search.expand import Expanded
    from codetool.search.records import Candidate

    lost = ExecutionResult(ok=False, outcome="not_executed", attempts=3)
    assert fast_failure(Expanded(Candidate(0, "", "finish('x')", result=lost), None, "")) == "not_executed"
