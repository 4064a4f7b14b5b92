"""The stepwise search with a scripted policy, the real executor and the tool simulator."""

from __future__ import annotations

import json

import pytest

from codetool.assemble import make_search
from codetool.commands.run import run_command
from codetool.config import ConfigError, load_config
from codetool.executor import Executor, ExecutorConfig
from codetool.executor.result import ExecutionResult
from codetool.jobs.queries import RunConfig
from codetool.jsonl import read_jsonl
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.records import Candidate, Trajectory
from codetool.search.search import SearchTask, select
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


def block(code: str) -> str:
    """A reply as the policy writes it after the opening fence the search puts in (code_prefix)."""
    return f"{code}\n```\nThat was the step."


@pytest.fixture(scope="module")
def query(shared_data):
    return load_stabletoolbench("G1_instruction", shared_data)[0]


def make_task(query, qid=None):
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    return SearchTask(query_id=qid or query.query_id, query=query.query, env=env, benchmark="stabletoolbench",
                      group="G1_instruction")


def factory(task):
    return Executor(EXEC, tools=task.env.functions())


class PreferSecond:
    """A PRM stand-in that prefers candidates whose code mentions 'good'."""

    def score(self, items):
        return [0.9 if "good" in it.candidate else 0.1 for it in items]


def test_selection_rule_on_hand_computed_rewards():
    cfg = SearchConfig(w_spot=1.0, w_latent=1.0, w_cost=0.5)
    cands = [Candidate(0, "", "a", r_spot=1.0, r_latent=0.2, cost=1.0),   # 1 + 0.2 - 0.5 = 0.7
             Candidate(1, "", "b", r_spot=0.0, r_latent=0.9, cost=0.0),   # 0 + 0.9 - 0   = 0.9
             Candidate(2, "", "c", r_spot=1.0, r_latent=0.4, cost=1.0)]   # 1 + 0.4 - 0.5 = 0.9
    # 1 fails on the spot: the cost term cannot lift it over 2; 2 has the best score left
    assert select(cands, cfg) == 2
    assert [round(c.score, 6) for c in cands] == [0.7, 0.9, 0.9]


def test_candidates_run_in_isolated_forks_and_the_chosen_state_is_kept(query):
    # step 1: two candidates; the first fails (so the second, which sets y, is chosen);
    # step 2: y survives, and x (set by the rejected candidate before failing) does not.
    policy = ScriptedBackend([block("x = 1\nraise ValueError('bad')"), block("y = 2\nprint(y)"),
                              block("print('x' in globals(), y)\nfinish(str(y))"), block("z = 0\nfinish('never')")])
    search = make_search(policy, SearchConfig(latent="none", k=2, max_steps=3, tie_break="first"), factory)
    traj = search.solve(make_task(query))
    assert [s.chosen for s in traj.steps] == [1, 0]
    assert traj.steps[1].candidates[0].result.stdout == "False 2\n"
    assert traj.finish_type == "finish" and traj.final_answer == "2"
    assert traj.steps[0].candidates[0].r_spot == 0.0 and traj.steps[0].candidates[1].r_spot == 1.0
    assert "ValueError" in traj.steps[0].candidates[0].result.error_type


def test_scripted_policy_solves_a_real_query_with_the_simulator(query):
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    name = env.apis[0].name
    code1 = f"r = {name}(id_conc='40698227')\nprint(type(r).__name__)"
    code2 = "finish('The concert information was retrieved.')"
    policy = ScriptedBackend([block(code1), block(code1), block(code2), "\n```"])  # 4th: an empty block
    task = SearchTask(query_id=query.query_id, query=query.query, env=env)
    traj = make_search(policy, SearchConfig(latent="none"), factory).solve(task)
    assert traj.finish_type == "finish" and traj.final_answer.startswith("The concert")
    calls = traj.executed_calls()
    assert len(calls) == 1 and calls[0].name == name and calls[0].status == "ok"
    # the second step's no-code candidate failed without breaking the loop
    second = traj.steps[1].candidates
    assert second[1].code is None and second[1].result.outcome == "no_code" and second[1].r_spot == 0
    assert traj.available_tools and traj.available_tools[0]["name"] == name
    assert traj.tool_cost > 0 and traj.steps[0].candidates[0].cost > 0
    assert set(traj.phase_seconds) == {"generation", "execution", "scoring"}
    # the policy was told about the tools and saw the first step's output
    prompt = policy.calls[1][0][0]
    assert name in prompt[0]["content"] and "Output:" in prompt[-2]["content"]
    # and the record round-trips
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))).to_dict() == traj.to_dict()


def test_latent_reward_from_a_scorer_decides_between_runnable_candidates(query):
    policy = ScriptedBackend([block("print('plain')"), block("print('good')"),
                              block("finish('a')"), block("finish('b')")])
    traj = make_search(policy, SearchConfig(tie_break="first"), factory, scorer=PreferSecond()).solve(make_task(query))
    first = traj.steps[0]
    assert first.chosen == 1 and first.candidates[1].r_latent == pytest.approx(0.9)
    assert first.candidates[0].score == pytest.approx(1.1) and first.candidates[1].score == pytest.approx(1.9)
    # the scorer saw the history of the chosen step at step 2: nothing to check beyond the answer
    assert traj.final_answer == "a"


def test_without_code_prefix_full_replies_are_parsed_and_a_model_that_opens_its_own_fence_works(query):
    policy = ScriptedBackend(["Sure.\n```python\nprint('a')\n```", "no code at all"])
    traj = make_search(policy, SearchConfig(latent="none", code_prefix=False, max_steps=1), factory).solve(
        make_task(query))
    assert [c.code for c in traj.steps[0].candidates] == ["print('a')", None]
    assert policy.calls[0][1]["stop"] is None and policy.calls[0][0][0][-1]["role"] == "user"
    # with the prefix, generation stops at the closing fence; a reply that opens a second fence
    # stops at once and is a candidate without code
    policy = ScriptedBackend(["```python\nprint('b')", block("print('c')")])
    traj = make_search(policy, SearchConfig(latent="none", max_steps=1), factory).solve(make_task(query))
    assert [c.code for c in traj.steps[0].candidates] == [None, "print('c')"]
    prompt = policy.calls[0][0][0]
    assert prompt[-1] == {"role": "assistant", "content": "```python\n"} and policy.calls[0][1]["stop"] == ["```"]


def test_missing_prm_is_a_config_error(query):
    with pytest.raises(Exception, match="no PRM"):
        make_search(ScriptedBackend([]), SearchConfig(latent="prm"), factory, scorer=None)


def test_rollout_latent_reward(query):
    # candidates: A calls a listed tool, B gives up. Rollouts from A finish with an answer that uses
    # that successful call's result (grounded: LR 1, tau 1); B ended with give_up (LR 0, tau 0).
    name = make_task(query).env.apis[0].name
    replies = iter([block(f"r = {name}(id_conc='40698227')\nprint(type(r).__name__)"), block("give_up('no')")])
    policy = ScriptedBackend(lambda p: next(replies) if len(p) == 3 else block("finish(str(r))"))
    cfg = SearchConfig(latent="rollout", rollouts=2, rollout_max_steps=2, max_steps=1)
    traj = make_search(policy, cfg, factory).solve(make_task(query))
    a, b = traj.steps[0].candidates
    assert a.r_latent == pytest.approx(0.95 ** (1 / 20))
    assert b.r_latent == pytest.approx(0.9)
    assert traj.steps[0].chosen == 0


def test_rollouts_count_only_grounded_finishes(query):
    """A rollout that finishes without any successful tool call on its path is no success (issue 14:
    a made-up answer is never the best leaf), so A's rollouts give LR 0 like B's give-up."""
    replies = iter([block("print('A')"), block("give_up('no')")])
    policy = ScriptedBackend(lambda p: next(replies) if len(p) == 3 else block("finish('done')"))
    cfg = SearchConfig(latent="rollout", rollouts=2, rollout_max_steps=2, max_steps=1)
    a, b = make_search(policy, cfg, factory).solve(make_task(query)).steps[0].candidates
    assert a.r_latent == pytest.approx(0.9 * 0.95 ** (1 / 20))
    assert b.r_latent == pytest.approx(0.9)


class BrokenExecutor:
    """An executor whose forks fail: a fault of the host, not of the model's code."""

    isolation = "none"

    def fork(self):
        raise RuntimeError("the sandbox is gone")

    def run(self, code, *, timeout_s=None):
        raise RuntimeError("the sandbox is gone")

    def close(self):
        pass


def test_a_host_fault_under_rollout_latent_is_recorded_as_the_host_s(query):
    """The candidates' forks failed (no state to roll out from): the episode ends with the host's
    error, not with the rollout's AttributeError on the missing state (a bug found by mypy)."""
    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(latent="rollout", rollouts=2, rollout_max_steps=1, max_steps=2)
    traj = make_search(policy, cfg, lambda task: BrokenExecutor()).solve(make_task(query))
    assert traj.finish_type == "error" and traj.error == "RuntimeError: the sandbox is gone"


def test_concurrent_episodes_share_generate_calls(query):
    policy = ScriptedBackend(lambda p: block("finish('ok')"))
    tasks = [make_task(query, qid=f"q{i}") for i in range(3)]
    done = []
    trajs = make_search(policy, SearchConfig(latent="none", concurrency=3), factory).run(tasks, on_done=done.append)
    assert len(policy.calls) == 1 and len(policy.calls[0][0]) == 3 and policy.calls[0][1]["n"] == 2
    assert [t.query_id for t in done] == ["q0", "q1", "q2"] and all(t.final_answer == "ok" for t in trajs)


def test_max_steps_and_give_up_end_episodes(query):
    policy = ScriptedBackend(lambda p: block("print(1)"))
    traj = make_search(policy, SearchConfig(latent="none", max_steps=2, k=1), factory).solve(make_task(query))
    assert traj.finish_type == "max_steps" and len(traj.steps) == 2 and traj.final_answer is None
    policy = ScriptedBackend(lambda p: block("give_up('no API for this')"))
    traj = make_search(policy, SearchConfig(latent="none", k=1), factory).solve(make_task(query))
    assert traj.finish_type == "give_up" and traj.extra["give_up_reason"] == "no API for this"


def test_prompts_and_trajectories_never_hold_a_secret(query, canary_env, tmp_path):
    policy = ScriptedBackend(lambda p: block(f"print('{canary_env}')\nimport os\nprint(dict(os.environ))"))
    traj = make_search(policy, SearchConfig(latent="none", max_steps=2, k=1), factory).solve(make_task(query))
    from codetool.jsonl import append_jsonl

    append_jsonl(tmp_path / "t.jsonl", traj.to_dict())
    assert canary_env not in (tmp_path / "t.jsonl").read_text()
    for prompts, _ in policy.calls:
        assert canary_env not in json.dumps(prompts)


def test_run_command_writes_and_resumes(tiny_model_dir, shared_data, tmp_path):
    out = tmp_path / "traj.jsonl"
    base = {"benchmark": "stabletoolbench", "group": "G1_instruction", "data_dir": str(shared_data),
            "policy": str(tiny_model_dir), "output": str(out), "search.max_new_tokens": 8,
            "search.max_steps": 1, "executor.isolation": "fallback", "answer.max_new_tokens": 8}
    assert run_command(load_config(RunConfig, overrides={**base, "limit": 2})) == 0
    assert [r["query_id"] for r in read_jsonl(out)] == [q.query_id for q in load_stabletoolbench(
        "G1_instruction", shared_data, subset="codetool")[:2]]
    # a rerun with a larger limit only runs the missing query
    assert run_command(load_config(RunConfig, overrides={**base, "limit": 3})) == 0
    records = list(read_jsonl(out))
    assert len(records) == 3 and len({r["query_id"] for r in records}) == 3
    assert all(r["method"] == "spot-only" and r["config_hash"] for r in records)
    # episodes that ran out of steps were sent for a final answer (the tiny model may write none)
    unfinished = [r for r in records if r["finish_type"] == "max_steps" and r["steps"]]
    assert all(r["extra"].get("answer_source", "generated") == "generated" for r in unfinished)


def test_a_reply_without_code_gets_the_defined_no_code_result(query):
    from codetool.executor.result import NO_CODE, OUTCOMES, ExecutionResult

    policy = ScriptedBackend(["I would look it up first."])
    search = make_search(policy, SearchConfig(latent="none", code_prefix=False, max_steps=1, k=1),
                         lambda t: Executor(EXEC, tools=t.env.functions()))
    cand = search.solve(make_task(query)).steps[0].candidates[0]
    assert NO_CODE in OUTCOMES and cand.code is None and cand.r_spot == 0.0
    result = cand.result  # a well-formed ExecutionResult, not a hand-built dict
    assert isinstance(result, ExecutionResult)
    assert (result.ok, result.outcome, result.error_type, result.tool_calls) == (False, "no_code", "NoCodeBlock", [])


@pytest.mark.parametrize("override", [{"temperature": -1.0}, {"temperature": float("nan")}, {"top_p": 2.0},
                                      {"top_p": 0.0}, {"max_new_tokens": 0}])
def test_sampling_settings_are_checked_before_any_model_loads(override):
    with pytest.raises(ConfigError, match=next(iter(override))):
        SearchConfig(**override)


class LostRuns:
    """An executor whose forks report every run as not executed (the machine failed, after the
    executor's retries) while the episode's own state is real."""

    def __init__(self, inner, lost=False):
        self.inner, self.lost = inner, lost

    def run(self, code, **kw):
        if self.lost:
            return ExecutionResult(ok=False, outcome="not_executed", error_type="NotExecuted", attempts=3,
                                   error_message="the fork did not start; nothing ran")
        return self.inner.run(code, **kw)

    def fork(self):
        return LostRuns(self.inner.fork(), lost=True)

    def close(self):
        self.inner.close()

    @property
    def closed(self):
        return self.inner.closed


def test_a_step_the_machine_could_not_run_ends_the_episode_as_not_executed(query):
    from codetool.eval.metrics import not_executed_trajectory, run_metrics

    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(k=2, max_steps=3, latent="none", w_latent=0.0)
    traj = make_search(policy, cfg, lambda t: LostRuns(factory(t))).solve(make_task(query))
    # no candidate ran: nothing is chosen or rejected, no step is recorded, and the episode says why
    assert traj.steps == [] and traj.finish_type == "error" and "not executed" in traj.error
    assert traj.extra["not_executed"] == {"step": 0, "candidates": 2, "attempts": 6}
    assert not_executed_trajectory(traj)
    m = run_metrics([traj])
    assert m.not_executed_trajectories == 1 and m.executed_candidates == 0 and m.scep_all_candidates is None
    from codetool.jobs.run_summary import summary_rows

    rows = dict(summary_rows(m, [traj], {}))
    assert rows["  not executed (the machine's failure: left out of every rate)"] == "1 episodes, 0 candidates"


def test_the_summary_gives_both_sceps_with_their_counts(query):
    """The public code's SCEP (its re-runs; a reply without ```python fails) beside ours, each with
    its n: a 0.0% beside 100.0% with no counts read as a contradiction."""
    from codetool.eval.metrics import run_metrics
    from codetool.jobs.run_summary import summary_rows

    cfg = SearchConfig(k=1, max_steps=2, latent="none", w_latent=0.0)
    traj = make_search(ScriptedBackend(lambda p: block("print(1)")), cfg, factory).solve(make_task(query))
    traj.extra["reference_steps"] = [{"status": 1, "res": ""}] * len(traj.steps)
    rows = dict(summary_rows(run_metrics([traj]), [traj], {}))
    n = len(traj.steps)
    assert rows["SCEP (public code's count: a reply without ```python fails)"] == f"0.0% (0 of {n} steps)"
    assert rows["  chosen code steps that ran in the search (ours)"] == f"100.0% ({n} of {n} steps)"
