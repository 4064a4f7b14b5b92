"""Search strategies (best-of-N, beam, lookahead) with scripted policies and scripted PRM scores."""

from __future__ import annotations

import json
import re

import pytest

from codetool.assemble import make_search
from codetool.config import ConfigError, from_dict
from codetool.executor import Executor, ExecutorConfig
from codetool.models.backends import ScriptedBackend
from codetool.search.config import SearchConfig
from codetool.search.records import Trajectory
from codetool.search.scores import aggregate
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


def block(code: str) -> str:
    return f"{code}\n```"


@pytest.fixture(scope="module")
def query(shared_data):
    return load_stabletoolbench("G1_instruction", shared_data)[0]


def make_task(query):
    env = ToolEnvironment.from_query(query, make_tool_backend("simulator"))
    return SearchTask(query_id=query.query_id, query=query.query, env=env, benchmark="stabletoolbench",
                      group="G1_instruction")


class ScriptedPRM:
    """Reads the score from a ``# s=0.7`` comment in the candidate's code."""

    def score(self, items):
        return [float(re.search(r"# s=([0-9.]+)", it.candidate).group(1)) for it in items]


class Tracked:
    """An executor wrapper that records every sandbox and how often each was closed."""

    def __init__(self, inner, registry):
        self.inner, self.registry, self.closed = inner, registry, 0
        registry.append(self)

    def fork(self):
        return Tracked(self.inner.fork(), self.registry)

    def run(self, code):
        return self.inner.run(code)

    def close(self):
        self.closed += 1
        self.inner.close()


class Watched:
    """A policy that calls ``hook`` before every generate call."""

    def __init__(self, inner, hook):
        self.inner, self.hook = inner, hook

    def generate(self, prompts, **kwargs):
        self.hook()
        return self.inner.generate(prompts, **kwargs)


def test_beam_keeps_exactly_the_b_best_and_closes_dropped_sandboxes_at_once(query):
    registry: list[Tracked] = []
    open_at_generate: list[int] = []
    env_task = make_task(query)
    api = env_task.env.apis[0].name
    policy = ScriptedBackend([
        # step 1, one beam, K=3: keep s=0.9 (a=2) and s=0.5 (a=3); a=1 is dropped
        block(f"a = 1\nr = {api}(id_conc='1')  # s=0.2"),
        block(f"a = 2\nr = {api}(id_conc='2')  # s=0.9"),
        block(f"a = 3\nr = {api}(id_conc='3')  # s=0.5"),
        # step 2, beam a=2 then beam a=3: the best two of all six children are 0.95 and 0.8
        block("finish(str(a))  # s=0.3"), block("finish(str(a))  # s=0.8"), block("print(a)  # s=0.1"),
        block("finish(str(a + 10))  # s=0.95"), block("print(a)  # s=0.05"), block("print(a)  # s=0.6"),
    ])
    watched = Watched(policy, lambda: open_at_generate.append(sum(t.closed == 0 for t in registry)))
    cfg = SearchConfig(strategy="beam", beam_width=2, k=3, max_steps=2, w_spot=0.0, tie_break="first")
    search = make_search(watched, cfg, lambda task: Tracked(Executor(EXEC, tools=task.env.functions()), registry),
                         scorer=ScriptedPRM())
    traj = search.run([env_task])[0]
    assert traj.strategy["kept"] == [[[0, 1], [0, 2]], [[1, 0], [0, 1]]]
    assert traj.final_answer == "13" and traj.finish_type == "finish"
    assert traj.strategy["scores"] == [0.95, 0.8] and traj.strategy["chosen"] == 0
    # before step 2's generation only the two kept beams' sandboxes were open (root and a=1 closed)
    assert open_at_generate == [1, 2]
    # every sandbox closed exactly once by the end
    assert all(t.closed == 1 for t in registry)
    # 1 root + 3 forks in step 1 + 6 in step 2
    assert len(registry) == 10 and traj.executor_forks == 9
    # the kept path ran the tool once, in step 1; step 2 saw a=3 without re-running anything
    assert [c.name for c in traj.executed_calls()] == [api]
    assert traj.tool_calls == 3
    assert [s.chosen for s in traj.steps] == [2, 0]
    own = sum(c.completion_tokens for s in traj.steps for c in s.candidates)
    assert traj.generated_tokens == own + 9  # plus the other beam's three step-2 children (3 words each)
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))).to_dict() == traj.to_dict()


def test_best_of_n_picks_the_highest_scored_answer(query):
    policy = ScriptedBackend([block("finish('a')  # s=0.4"), block("finish('b')  # s=0.9"),
                              block("finish('c')  # s=0.6")])
    cfg = SearchConfig(strategy="best_of_n", n=3, k=1, max_steps=2)
    search = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()), scorer=ScriptedPRM())
    traj = search.run([make_task(query)])[0]
    assert traj.final_answer == "b" and traj.query_id == query.query_id
    assert traj.strategy["scores"] == [0.4, 0.9, 0.6] and traj.strategy["chosen"] == 1
    assert len(policy.calls) == 1 and len(policy.calls[0][0]) == 3  # the N episodes share one batch
    # compute of all three episodes: 3 words per reply ("finish(...)", "#", "s=0.4"; the fence is the stop string)
    assert traj.generated_tokens == 3 * 3 and traj.executor_forks == 3
    assert traj.prm_scored_tokens > 0


@pytest.mark.parametrize("how, answer", [("last", "A"), ("min", "B"), ("prod", "B")])
def test_best_of_n_aggregates_over_steps(query, how, answer):
    # episode A: 0.3 then 0.9; episode B: 0.8 then 0.6 (the two episodes' steps share each round)
    policy = ScriptedBackend([block("x = 1  # s=0.3"), block("x = 2  # s=0.8"),
                              block("finish('A')  # s=0.9"), block("finish('B')  # s=0.6")])
    cfg = SearchConfig(strategy="best_of_n", n=2, k=1, max_steps=2, aggregate=how)
    search = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()), scorer=ScriptedPRM())
    assert search.run([make_task(query)])[0].final_answer == answer
    assert aggregate([0.8, 0.6], "prod") == pytest.approx(0.48)


def test_lookahead_scores_candidates_by_a_rollout_and_counts_its_tokens(query):
    call = f"r = {make_task(query).env.apis[0].name}(id_conc='40698227')"  # a rollout success is grounded
    policy = ScriptedBackend([
        block(f"{call}\nx = 1\nprint(x)"), block(f"{call}\nx = 2\nprint(x)"),   # step 1: both run fine
        block("finish(str(x)+str(r))"),                         # rollout of x=1: it finishes, using r
        block("raise ValueError('stuck')"),                     # rollout of x=2: it does not
        block("finish(str(x)+str(r))"), block("finish(str(x)+str(r))"),  # step 2 (ended: no rollout)
    ])
    cfg = SearchConfig(strategy="lookahead", lookahead_depth=1, k=2, max_steps=2, tie_break="first", seed=None)
    traj = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions())).run([make_task(query)])[0]
    assert traj.final_answer.startswith("1{") and traj.steps[0].chosen == 0
    assert traj.steps[0].candidates[0].r_latent > traj.steps[0].candidates[1].r_latent
    assert traj.strategy == {"name": "lookahead", "depth": 1}
    own = sum(c.completion_tokens for s in traj.steps for c in s.candidates)
    assert traj.generated_tokens == own + 1 + 2  # the two rollouts' words (the fence is the stop string)
    # 2 + 2 candidate forks, and per rollout one fork to start from plus its own step's fork
    assert traj.executor_forks == 2 + 2 + 2 * 2


def test_greedy_is_the_default_and_counts_compute(query):
    assert SearchConfig().strategy == "greedy"
    policy = ScriptedBackend([block("print(1)"), block("print(2)"), block("finish('ok')"), block("finish('no')")])
    traj = make_search(policy, SearchConfig(latent="none", tie_break="first"),
                       lambda t: Executor(EXEC, tools=t.env.functions())).solve(make_task(query))
    assert traj.final_answer == "ok" and traj.strategy == {}
    assert traj.generated_tokens == traj.completion_tokens > 0
    assert traj.executor_forks == 4 and traj.tool_calls == 0  # one fork per candidate that ran


def test_old_records_load_and_bad_options_are_config_errors():
    old = {"query_id": "1", "query": "q", "finish_type": "finish", "final_answer": "x"}
    traj = Trajectory.from_dict(old)
    assert (traj.generated_tokens, traj.prm_scored_tokens, traj.tool_calls, traj.executor_forks) == (0, 0, 0, 0)
    for bad in ({"beam_width": 0}, {"n": 0}, {"lookahead_depth": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SearchConfig(**bad)
    with pytest.raises(ConfigError):
        from_dict(SearchConfig, {"strategy": "mcts"})


def test_metric_against_tokens_plot_is_written(tmp_path):
    from codetool.eval.plots import metric_vs_tokens

    path = metric_vs_tokens({"greedy": [(100.0, 20.0), (110.0, 30.0)], "beam": [(220.0, 40.0)], "empty": []},
                            tmp_path / "m.png", metric="SCEP (%)")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_lookahead_with_a_prm_scores_each_rollouts_last_step(query):
    # Neither rollout finishes (depth 1), so a success share cannot tell the candidates apart;
    # the PRM's score of each rollout's last step can (search-and-learn's lookahead value).
    policy = ScriptedBackend([
        block("x = 1\nprint(x)  # s=0.5"), block("x = 2\nprint(x)  # s=0.5"),  # step 1
        block("print(x)  # s=0.2"),                                            # rollout of x=1
        block("print(x * 10)  # s=0.9"),                                       # rollout of x=2
        block("finish(str(x))  # s=0.5"), block("finish('no')  # s=0.5"),      # step 2
    ])
    cfg = SearchConfig(strategy="lookahead", lookahead_depth=1, k=2, max_steps=2, tie_break="first", seed=None)
    prm = ScriptedPRM()
    traj = make_search(policy, cfg, lambda t: Executor(EXEC, tools=t.env.functions()),
                       scorer=prm).run([make_task(query)])[0]
    first = traj.steps[0].candidates
    assert [c.r_latent for c in first] == [pytest.approx(0.2), pytest.approx(0.9)]
    assert traj.steps[0].chosen == 1 and traj.final_answer == "2"
    assert traj.prm_scored_tokens > 0


def test_rollout_value_prm_without_a_prm_is_a_config_error():
    with pytest.raises(ConfigError, match="rollout_value"):
        make_search(ScriptedBackend([]), SearchConfig(strategy="lookahead", rollout_value="prm"),
                    lambda t: None)


def test_lookahead_needs_a_latent_weight_and_is_labelled_by_its_rollouts():
    from codetool.jobs.queries import method_label

    with pytest.raises(ConfigError, match="w_latent"):
        SearchConfig(strategy="lookahead", w_latent=0.0)
    assert method_label(SearchConfig(strategy="lookahead", latent="none", k=2)) == "spot+rollout"
    assert method_label(SearchConfig(strategy="lookahead", latent="prm", k=2)) == "spot+latent"
