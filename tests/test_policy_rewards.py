"""The reward functions of policy RL on scripted episodes, against hand-computed values."""

from __future__ import annotations

import pytest

from codetool.executor.result import ExecutionResult, ToolCall, no_code_result
from codetool.judge.records import ScriptedJudge
from codetool.policy.episode import Episode, EpisodeStep, step_category
from codetool.policy.rewards import (
    GroundedReward,
    JudgedReward,
    OnTheSpotReward,
    PRMReward,
    ToolCostReward,
    aggregate,
    build_rewards,
)
from codetool.search.prompt import history_entry
from codetool.search.records import Candidate


class _API:
    def __init__(self, name):
        self.name = name


class _Env:
    apis = [_API("get_weather_for_meteo"), _API("get_city_for_meteo")]

    def render(self):
        return "def get_weather_for_meteo(city): ...\ndef get_city_for_meteo(name): ..."


class _Task:
    query_id, query, env = "q1", "What is the weather in Paris?", _Env()


WEATHER = '{"city": "Paris", "temp": "18 C", "sky": "sunny"}'  # what every call here returns


def result(ok=True, calls=(), answer=None, outcome=None) -> ExecutionResult:
    return ExecutionResult(ok=ok, outcome=outcome or ("ok" if ok else "runtime_error"),
                           tool_calls=[ToolCall(name, status=status, response=WEATHER) for name, status in calls],
                           final_answer=answer)


def episode(*steps) -> Episode:
    """An episode of ``(code, result, r_spot, cost)`` steps, histories built as the rollout builds them."""
    ep = Episode(task=_Task(), prompt_ids=[1, 2, 3])
    history: list[dict] = []
    for i, (code, res, spot, cost) in enumerate(steps):
        cand = Candidate(index=0, text=f"```python\n{code}\n```" if code else "no code", code=code, result=res,
                         r_spot=spot, cost=cost)
        step = EpisodeStep(cand, f"Output {i}", history=list(history), span=(10 * i, 10 * i + 5))
        ep.steps.append(step)
        history.append(history_entry(cand, step.observation))
        if res.final_answer is not None:
            ep.finish_type, ep.final_answer = "finish", res.final_answer
    return ep


def honest() -> Episode:
    # step 1 calls a listed tool that answers; step 2 fails; step 3 finishes with an answer
    return episode(("r = get_weather_for_meteo(city='Paris')\nprint(r)", result(calls=[("get_weather_for_meteo", "ok")]),
                    1.0, 3.5),
                   ("print(r['x'])", result(ok=False), 0.0, 0.5),
                   ("finish('18 C and sunny')", result(answer="18 C and sunny"), 1.0, 0.5))


class CountingPRM:
    """Scores a step 0.2 + 0.1 x the number of earlier steps; records each call's items."""

    def __init__(self):
        self.calls = []

    def score(self, items):
        self.calls.append(items)
        return [0.2 + 0.1 * len(it.history) for it in items]


def test_aggregate_modes_skip_undefined_values():
    values = [1.0, None, 0.0, 0.5]
    assert aggregate(values, "min") == 0.0
    assert aggregate(values, "mean") == pytest.approx(0.5)
    assert aggregate(values, "last") == 0.5
    assert aggregate(values, "sum") == 1.5
    assert aggregate([None], "mean") == 0.0
    with pytest.raises(ValueError):
        aggregate(values, "median")


def test_per_step_values_of_a_scripted_episode():
    ep = honest()
    assert OnTheSpotReward().per_step(ep) == [1.0, 0.0, 1.0]
    assert ToolCostReward().per_step(ep) == [-3.5, -0.5, -0.5]
    assert GroundedReward().per_step(ep) == [None, None, 1.0]
    prm = CountingPRM()
    assert PRMReward(prm).per_step(ep) == pytest.approx([0.2, 0.3, 0.4])
    assert len(prm.calls) == 1 and len(prm.calls[0]) == 3  # one scorer call per episode


def test_prm_items_are_what_the_search_would_score():
    ep = honest()
    prm = CountingPRM()
    PRMReward(prm).per_step(ep)
    items = prm.calls[0]
    assert [it.candidate for it in items] == [s.candidate.code for s in ep.steps]
    assert items[2].history == [{"code": ep.steps[0].candidate.code, "output": "Output 0"},
                                {"code": "print(r['x'])", "output": "Output 1"}]
    assert {it.query for it in items} == {ep.task.query} and items[0].tools == ep.task.env.render()
    assert items[1].candidate_output == "Output 1"


def test_a_step_without_code_gets_no_prm_call_and_zero():
    ep = episode(("x = 1", result(), 1.0, 0.5), (None, no_code_result("no block"), 0.0, 0.0))
    prm = CountingPRM()
    assert PRMReward(prm).per_step(ep) == pytest.approx([0.2, 0.0])
    assert len(prm.calls[0]) == 1


def test_grounded_needs_a_successful_listed_tool_call_before_the_answer():
    invented = episode(("finish('It is 18 C')", result(answer="It is 18 C"), 1.0, 0.5))
    failed_call = episode(("get_weather_for_meteo(city='x')", result(calls=[("get_weather_for_meteo", "error")]), 0.0, 3),
                          ("finish('18 C')", result(answer="18 C"), 1.0, 0.5))
    unlisted = episode(("lookup(city='x')", result(calls=[("lookup", "ok")]), 1.0, 3),
                       ("finish('18 C')", result(answer="18 C"), 1.0, 0.5))
    empty = episode(("get_weather_for_meteo(city='x')", result(calls=[("get_weather_for_meteo", "ok")]), 1.0, 3),
                    ("finish('  ')", result(answer="  "), 1.0, 0.5))
    for ep in (invented, failed_call, unlisted, empty):
        assert GroundedReward().per_step(ep)[-1] == 0.0
    assert GroundedReward().per_step(honest())[-1] == 1.0


def test_trl_calls_return_one_aggregated_value_per_episode_and_store_the_steps():
    def city(name, found):  # what the host records of get_city_for_meteo(name=...)
        return ExecutionResult(ok=True, outcome="ok", tool_calls=[ToolCall("get_city_for_meteo", arguments={"name": name},
                                                                           response=f'{{"city": "{found}"}}')])

    eps = [honest(), episode(("c = get_city_for_meteo(name='Lyon')", city("Lyon", "Lyon, France"), 1.0, 0.5),
                             ("c = get_city_for_meteo(name='Nice')", city("Nice", "Nice, France"), 1.0, 0.5))]
    for mode, expected in (("mean", [2 / 3, 1.0]), ("min", [0.0, 1.0]), ("last", [1.0, 1.0]), ("sum", [2.0, 2.0])):
        assert OnTheSpotReward(mode)(prompts=["a", "a"], completions=["", ""], episode=eps) == pytest.approx(expected)
    assert eps[0].step_rewards["on_the_spot"] == [1.0, 0.0, 1.0]
    # an outcome reward is its own value whatever the aggregate
    assert GroundedReward("min")(episode=eps) == [1.0, 0.0]
    assert GroundedReward().__name__ == "grounded"


def test_judged_scores_only_answered_episodes_in_one_call():
    asked = []

    def label(request):
        asked.append(request.answer)
        return "Unsure"

    eps = [honest(), episode(("x = 1", result(), 1.0, 0.5))]
    assert JudgedReward(ScriptedJudge(label))(episode=eps) == [0.5, 0.0]
    assert asked == ["18 C and sunny"]


def test_build_rewards_keeps_the_weights_in_order_and_refuses_missing_parts():
    funcs, weights = build_rewards({"grounded": 1.0, "on_the_spot": 0.5, "prm": 0.25}, aggregate="mean",
                                   scorer=CountingPRM())
    assert [f.name for f in funcs] == ["grounded", "on_the_spot", "prm"] and weights == [1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="PRM scorer"):
        build_rewards({"prm": 1.0}, aggregate="mean")
    with pytest.raises(ValueError, match="judge"):
        build_rewards({"judged": 1.0}, aggregate="mean")


def test_step_categories_of_the_histogram():
    names = {a.name for a in _Env.apis}
    ep = honest()
    assert [step_category(s, names) for s in ep.steps] == ["tool_ok", "runtime_error", "finish"]
    odd = episode(("print('hi')", result(), 1.0, 0.5), ("f()", result(calls=[("get_city_for_meteo", "error")]), 0.0, 3),
                  (None, no_code_result("none"), 0.0, 0.0), ("while 1: pass", result(ok=False, outcome="timeout"), 0, 1))
    assert [step_category(s, names) for s in odd.steps] == ["ok_no_tool", "tool_error", "no_code", "timeout"]


# ------------------------------------------------------------- issue 37: no information, no pay
def lost() -> ExecutionResult:
    return ExecutionResult(ok=False, outcome="not_executed", error_type="NotExecuted", attempts=3,
                           error_message="the fork did not start (host busy); nothing ran")


def test_an_episode_with_a_step_the_machine_could_not_run_is_dropped_never_scored_zero():
    ep = episode(("r = get_weather_for_meteo(city='Paris')", result(calls=[("get_weather_for_meteo", "ok")]), 1.0, 3.5),
                 ("print(r['sky'])", lost(), 0.0, 0.5))
    ep.finish_type = "error"  # as the rollout ends it
    judge = ScriptedJudge("Solved")
    for reward in (OnTheSpotReward(), ToolCostReward(), GroundedReward(), PRMReward(CountingPRM()),
                   JudgedReward(judge)):
        # None: TRL leaves the episode out of its group's baseline and gives it advantage 0
        assert reward(episode=[ep, honest()])[0] is None, reward.name
        assert ep.step_rewards[reward.name] == [None, None]
    assert step_category(ep.steps[1], {a.name for a in _Env.apis}) == "not_executed"


def test_a_dropped_episode_leaves_its_groups_process_statistics():
    from codetool.policy.advantages import process_advantages

    done, failed = honest(), episode(("print(r['x'])", result(ok=False), 0.0, 0.5))
    dropped = episode(("print(1)", lost(), 0.0, 0.5))
    dropped.finish_type = "error"
    reward = GroundedReward()
    reward(episode=[done, failed, dropped])
    spans = [[s.span for s in e.steps] for e in (done, failed, dropped)]
    adv = process_advantages([e.step_rewards for e in (done, failed, dropped)], {"grounded": 1.0}, spans, 3, 40)
    # the group is (1, 0): mean 0.5, std 0.7071; the dropped episode adds no 0 to it and learns nothing
    assert adv[0, 0].item() == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-4), rel=1e-5)
    assert adv[1, 0].item() == pytest.approx(-0.5 / (0.5 ** 0.5 + 1e-4), rel=1e-5)
    assert adv[2].abs().sum().item() == 0.0


def test_a_free_step_that_does_nothing_the_host_can_see_earns_no_on_the_spot_reward():
    # padding an episode with clean no-op steps used to raise its mean on-the-spot reward (3/4 > 2/3)
    padded = episode(("x = 1", result(), 1.0, 0.5), *[(s.candidate.code, s.candidate.result, s.candidate.r_spot,
                                                        s.candidate.cost) for s in honest().steps])
    assert OnTheSpotReward().per_step(padded) == [None, 1.0, 0.0, 1.0]
    assert OnTheSpotReward()(episode=[padded])[0] == OnTheSpotReward()(episode=[honest()])[0] == pytest.approx(2 / 3)
    # a no-tool step that fails still costs: the code's failure is information
    assert OnTheSpotReward().per_step(honest())[1] == 0.0


def test_judged_never_takes_the_judges_word_alone():
    # a gullible judge says Solved to anything: an answer that uses no tool result still earns 0
    judge = ScriptedJudge("Solved")
    invented = episode(("get_weather_for_meteo(city='Paris')", result(calls=[("get_weather_for_meteo", "ok")]), 1.0, 3),
                       ("finish('I could not get the weather, sorry.')", result(answer="I could not get the weather, sorry."),
                        1.0, 0.5))
    assert JudgedReward(judge)(episode=[invented, honest()]) == [0.0, 1.0]


def test_a_weak_judge_is_refused_for_training_rewards_unless_asked_for():
    weak = ScriptedJudge("Solved", weak=True)
    with pytest.raises(ValueError, match="weak"):
        build_rewards({"judged": 1.0}, aggregate="mean", judge=weak)
    funcs, _ = build_rewards({"judged": 1.0}, aggregate="mean", judge=weak, allow_weak_judge=True)
    assert funcs[0].judge is weak


def test_tool_cost_is_the_episodes_sum_whatever_the_aggregate():
    # a mean would let cheap padding steps lower an episode's cost per step
    ep = honest()
    for mode in ("mean", "min", "last", "sum"):
        assert ToolCostReward(mode)(episode=[ep]) == [pytest.approx(-4.5)]


def test_an_answer_from_a_step_that_failed_earns_no_outcome():
    # finish() called from a __del__ during a step that then raised: the answer is recorded, the step failed
    ep = episode(("r = get_weather_for_meteo(city='Paris')", result(calls=[("get_weather_for_meteo", "ok")]), 1.0, 3),
                 ("gc.collect(); x = r['x']", ExecutionResult(ok=False, outcome="runtime_error", final_answer="sunny"),
                  0.0, 1.0))
    assert ep.finish_type == "finish" and GroundedReward().per_step(ep)[-1] == 0.0


def weather(city, response=WEATHER, ok=True) -> ExecutionResult:
    """What the host records of a clean (or failing) step calling get_weather_for_meteo(city=...)."""
    return ExecutionResult(ok=ok, outcome="ok" if ok else "runtime_error",
                           tool_calls=[ToolCall("get_weather_for_meteo", arguments={"city": city}, response=response)])


def spot(ep) -> list:
    OnTheSpotReward()(episode=[ep])
    return ep.step_rewards["on_the_spot"]


def test_a_step_that_only_repeats_a_call_has_no_on_the_spot_value():
    # issue 37 attack round: repeating a successful call diluted a failing step under mean (and
    # added under sum); a repeat is the same call as the service reads it, answered alike
    paris = weather("Paris")
    padded = episode(("r = get_weather_for_meteo(city='Paris')", paris, 1.0, 3),
                     ("r = get_weather_for_meteo(city='Paris')", paris, 1.0, 3),
                     ("r = get_weather_for_meteo(city='Paris')", paris, 1.0, 3),
                     ("print(r['x'])", result(ok=False), 0.0, 0.5),
                     ("finish('18 C')", result(answer="18 C"), 1.0, 0.5))
    assert spot(padded) == [1.0, None, None, 0.0, 1.0]
    assert OnTheSpotReward("mean")(episode=[padded]) == [pytest.approx(2 / 3)]  # as without the repeats
    one, text = weather(1), weather("1")  # 1 and "1" are one argument to the service
    assert spot(episode(("f(city=1)", one, 1.0, 3), ("f(city='1')", text, 1.0, 3))) == [1.0, None]


def test_a_call_with_other_arguments_or_a_new_answer_is_new_work():
    lyon = weather("Lyon")  # the same weather for another city: another question
    poll = weather("Paris", response='{"city": "Paris", "temp": "19 C", "sky": "cloudy"}')  # the answer changed
    ep = episode(("r = get_weather_for_meteo(city='Paris')", weather("Paris"), 1.0, 3),
                 ("r = get_weather_for_meteo(city='Lyon')", lyon, 1.0, 3),
                 ("r = get_weather_for_meteo(city='Paris')", poll, 1.0, 3))
    assert spot(ep) == [1.0, 1.0, 1.0]
    # the clean run of a call after the step that made it failed is the recovery
    failed = episode(("r = get_weather_for_meteo(city='Paris')\nr['x']", weather("Paris", ok=False), 0.0, 3),
                     ("r = get_weather_for_meteo(city='Paris')", weather("Paris"), 1.0, 3))
    assert spot(failed) == [0.0, 1.0]


def test_ending_before_any_tool_call_has_no_on_the_spot_value():
    # giving up (or finishing) at once scored 1, the most an on-the-spot reward pays, for no work
    at_once = episode(("give_up('too hard')", ExecutionResult(ok=True, outcome="ok", give_up_reason="too hard"), 1.0, 0.5))
    assert spot(at_once) == [None] and OnTheSpotReward()(episode=[at_once]) == [0.0]
    invented = episode(("x = 1", result(), 1.0, 0.5), ("finish('18 C')", result(answer="18 C"), 1.0, 0.5))
    assert spot(invented) == [None, None]
    tried = episode(("r = get_weather_for_meteo(city='Paris')", weather("Paris"), 1.0, 3),
                    ("give_up('no')", ExecutionResult(ok=True, outcome="ok", give_up_reason="no"), 1.0, 0.5))
    assert spot(tried) == [1.0, 1.0]
    # a query that offers no tools is answered without one
    no_tools = episode(("finish('42')", result(answer="42"), 1.0, 0.5))
    no_tools.task = type("NoTools", (), {"query_id": "q2", "query": "6 x 7?", "env": type("E", (), {"apis": []})()})()
    assert spot(no_tools) == [1.0]


@pytest.mark.parametrize("extra", [-1, 1])
def test_a_prm_scorer_of_the_wrong_length_is_its_fault_never_another_steps_score(extra):
    """Before: one score too many was silently dropped (each step took a score, the last ignored),
    one too few raised StopIteration out of the reward."""
    from codetool.rewards import ScorerFault, machine_failure

    class Wrong:
        def score(self, items):
            return [0.5] * (len(items) + extra)

    with pytest.raises(ScorerFault, match=f"returned {3 + extra} scores for 3 items") as e:
        PRMReward(Wrong()).per_step(honest())
    assert machine_failure(e.value)
