"""``codetool.search.episode``: what ends an episode as the machine's failure (issue 37).

One predicate (``codetool.rewards.machine_failure``) decides it for the search's episodes and the
jobs' error records alike; an executor that raised in the middle of an episode (``host_error``: no
step's code makes ``fork``/``run`` raise, docs/EXECUTOR.md), an executor that cannot start and a
PRM scorer whose reply does not fit the items end the episode ``not_executed`` (no rate counts it),
while an error of the query itself stays its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codetool import CodetoolError
from codetool.assemble import make_search
from codetool.eval.metrics import not_executed_trajectory, run_metrics
from codetool.executor import ExecutorError
from codetool.jobs.queries import RunConfig, error_record
from codetool.models.backends import ScriptedBackend
from codetool.models.remote import EndpointError, ServerFailure
from codetool.rewards import ScorerFault, machine_failure
from codetool.search.config import SearchConfig
from codetool.search.episode import Episode, fail
from codetool.search.records import Trajectory
from codetool.tools.loaders import load_stabletoolbench
from tests.test_search import block, factory, make_task


@pytest.fixture(scope="module")
def query(shared_data):
    return load_stabletoolbench("G1_instruction", shared_data)[0]


ERRORS = [(ExecutorError("a sandbox worker did not start: x"), True),
          (ServerFailure("http://127.0.0.1:9/score: HTTP 503 after 4 attempts"), True),
          (ScorerFault("the PRM scorer returned 1 scores for 2 items"), True),
          (EndpointError("answered HTTP 400: prompt too long", 400), False),
          (CodetoolError("a malformed entry"), False), (ValueError("a bug"), False), ("a message", False)]


@pytest.mark.parametrize(("error", "machine"), ERRORS, ids=lambda v: type(v).__name__ if not isinstance(v, bool) else "")
def test_the_search_and_the_jobs_decide_with_one_predicate(error, machine):
    """Before: the search counted only ServerFailure as the machine's, the jobs ExecutorError too."""
    assert machine_failure(error) is machine
    traj = Trajectory(query_id="1", query="q", benchmark="stabletoolbench")
    fail(Episode(SimpleNamespace(query_id="1"), None, traj), error)
    unit = SimpleNamespace(query_id="1", query="q", benchmark="stabletoolbench", group="G1_instruction")
    record = Trajectory.from_dict(error_record(RunConfig(benchmark="stabletoolbench"), "h", unit, error))
    assert traj.finish_type == record.finish_type == "error"
    assert not_executed_trajectory(traj) is not_executed_trajectory(record) is machine


class RaisesOnSecondFork:
    """An executor whose ``fork()`` raises from the second step on (a sandbox root that died)."""

    def __init__(self, inner, forks=None):
        self.inner, self.forks = inner, forks if forks is not None else [0]

    def run(self, code, **kw):
        return self.inner.run(code, **kw)

    def fork(self):
        self.forks[0] += 1
        if self.forks[0] > 2:  # k=2: the first step's two forks work
            raise ExecutorError("the sandbox root process failed: [Errno 32] Broken pipe")
        return RaisesOnSecondFork(self.inner.fork(), self.forks)

    def close(self):
        self.inner.close()


def test_an_executor_that_raises_mid_episode_is_the_machines_failure(query):
    """Before: the episode ended as the query's error, counted in every rate."""
    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(k=2, max_steps=3, latent="none", w_latent=0.0)
    traj = make_search(policy, cfg, lambda t: RaisesOnSecondFork(factory(t))).solve(make_task(query))
    assert traj.finish_type == "error" and "sandbox root process failed" in traj.error
    assert len(traj.steps) == 1 and traj.extra["not_executed"]["step"] == 1
    assert not_executed_trajectory(traj) and run_metrics([traj]).not_executed_trajectories == 1


@pytest.mark.parametrize(("error", "machine"), [(ExecutorError("the bwrap sandbox did not start: x"), True),
                                                (ValueError("the task's tools are malformed"), False)])
def test_an_executor_that_cannot_start_is_the_machines_failure(query, error, machine):
    """Before: a sandbox that could not start for the search's episode was the query's error."""
    def make_executor(task):
        raise error

    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(k=2, max_steps=3, latent="none", w_latent=0.0)
    traj = make_search(policy, cfg, make_executor).solve(make_task(query))
    assert traj.finish_type == "error" and str(error) in traj.error and traj.steps == []
    assert not_executed_trajectory(traj) is machine


class ShortScorer:
    """A local PRM scorer with a bug: one score too few."""

    def score(self, items):
        return [0.5] * (len(items) - 1)


def test_a_local_scorer_of_the_wrong_length_is_an_error_not_the_policys_failure(query):
    """Before: zip(strict=True) raised ValueError and the episode was the query's error."""
    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(k=2, max_steps=3, latent="prm", w_latent=1.0)
    traj = make_search(policy, cfg, factory, scorer=ShortScorer()).solve(make_task(query))
    assert traj.finish_type == "error" and "ScorerFault: the PRM scorer returned 1 scores for 2 items" in traj.error
    assert not_executed_trajectory(traj)


def test_a_rollout_value_from_a_scorer_of_the_wrong_length_is_not_the_policys_failure(query):
    """``latent: rollout`` scored by the PRM: a scorer that answers no score for the item was a
    ZeroDivisionError, the query's error; now a ScorerFault, left out of every rate."""
    policy = ScriptedBackend(lambda p: block("print(1)"))
    cfg = SearchConfig(k=2, max_steps=2, latent="rollout", w_latent=1.0, rollout_value="prm", rollouts=1,
                       rollout_max_steps=1)
    traj = make_search(policy, cfg, factory, scorer=ShortScorer()).solve(make_task(query))
    assert traj.finish_type == "error" and "ScorerFault: the PRM scorer returned 0 scores for 1 items" in traj.error
    assert not_executed_trajectory(traj)
