"""The ``--ray`` driver's bookkeeping without Ray (issue 28): a stand-in ``ray`` module whose
workers die or raise on cue. The real cluster test is tests/test_distributed_ray.py (slow)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from codetool import CodetoolError
from codetool.config import ConfigError, load_config
from codetool.distributed.ray_cluster import ClusterConfig, RayStats, _dispatch, run_on_ray


class RayError(Exception):
    pass


class RayTaskError(RayError):
    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class ActorDiedError(RayError):
    pass


class Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class Actor:
    """Runs a batch at once: ``fate(worker, call, units)`` returns "die", "raise" or None (records)."""

    def __init__(self, index: int, fate):
        self.index, self.fate, self.calls, self.dead = index, fate, 0, False
        self.ready = types.SimpleNamespace(remote=lambda: Ref(error=ActorDiedError("gone")) if self.dead else Ref(f"w{index}"))
        self.run = types.SimpleNamespace(remote=self._run)

    def _run(self, units):
        self.calls += 1
        what = "die" if self.dead else self.fate(self.index, self.calls, units)
        if what == "die":
            self.dead = True
            return Ref(error=ActorDiedError(f"worker {self.index} died"))
        if what == "raise":
            return Ref(error=RayTaskError(ValueError("the runner broke")))
        return Ref([{"id": u} for u in units])


def fake_ray():
    def get(ref):
        if ref.error is not None:
            raise ref.error
        return ref.value
    return types.SimpleNamespace(exceptions=types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError),
                                 wait=lambda refs, num_returns, timeout: (refs[:1], refs[1:]), get=get)


def _dispatch_with(fate, units, *, workers=2, batch=1, retries=3):
    records, errors = [], []
    stats = RayStats(units=len(units), workers=workers, per_worker=[0] * workers)
    actors = [Actor(i, fate) for i in range(workers)]
    _dispatch(fake_ray(), ClusterConfig(retries=retries, in_flight=2), actors, units, batch, str,
              lambda r: r["id"], records.append, lambda u, e: errors.append((u, str(e))), stats)
    return records, errors, stats


def test_units_of_a_lost_worker_go_to_the_other_one_once():
    records, errors, stats = _dispatch_with(lambda w, call, units: "die" if (w, call) == (0, 2) else None,
                                            [str(i) for i in range(6)])
    assert sorted(r["id"] for r in records) == [str(i) for i in range(6)] and len(records) == 6
    assert errors == [] and stats.lost_workers == 1 and stats.resent == 2  # its two queued calls
    assert stats.per_worker == [1, 5] and stats.records == 6 and stats.duplicates == 0


def test_a_unit_that_kills_every_worker_is_an_error_after_its_retries():
    def fate(w, call, units):
        return "die" if "poison" in units else None
    records, errors, stats = _dispatch_with(fate, ["a", "poison", "b"], workers=3, retries=1)
    assert sorted(r["id"] for r in records) == ["a", "b"]
    assert [u for u, _ in errors] == ["poison"] and "lost 2 times" in errors[0][1]


def test_a_runner_that_raises_splits_its_batch_then_records_the_culprit():
    def fate(w, call, units):
        return "raise" if "bad" in units else None
    records, errors, _ = _dispatch_with(fate, ["a", "bad", "b", "c"], workers=1, batch=2)
    assert sorted(r["id"] for r in records) == ["a", "b", "c"]
    assert errors == [("bad", "the runner broke")]


def test_no_worker_left_is_one_line():
    with pytest.raises(CodetoolError, match="no Ray worker could start .*resumes"):
        _dispatch_with(lambda w, call, units: "die", ["a"], workers=1, retries=5)


def test_cluster_settings_are_checked_and_reach_both_commands():
    with pytest.raises(ConfigError, match="cluster.workers 0 counts workers"):
        ClusterConfig(cpus_per_worker=0)
    with pytest.raises(ConfigError, match="in_flight"):
        ClusterConfig(in_flight=0)
    from codetool.jobs.queries import RunConfig, run_hash
    from codetool.tree.config import TreeConfig, tree_hash

    run = load_config(RunConfig, overrides={"benchmark": "restbench-tmdb", "ray": "auto", "cluster.workers": 4})
    assert (run.ray, run.cluster.workers) == ("auto", 4)
    assert run_hash(run) == run_hash(load_config(RunConfig, overrides={"benchmark": "restbench-tmdb"}))
    trees = load_config(TreeConfig, overrides={"ray": "ray://head:10001", "cluster.gpus_per_worker": 1})
    assert tree_hash(trees) == tree_hash(TreeConfig())  # a Ray run resumes a local one and back


def test_a_workers_batch_is_what_it_keeps_in_flight():
    from codetool.jobs.queries import RunConfig, ray_batch
    from codetool.jobs.trees import ray_batch as tree_batch
    from codetool.tree.config import TreeConfig

    def run(**overrides):
        return ray_batch(load_config(RunConfig, overrides={"benchmark": "restbench-tmdb", **overrides}))

    server = "http://a:8000/v1,http://b:8000/v1"
    assert run() == 4  # a local policy: search.concurrency's rounds default
    assert run(policy=server) == 64  # continuous: 2 x 64 in flight / k 2
    assert run(policy=server, **{"policy_client.max_in_flight": 8, "search.k": 4}) == 4  # at least 4
    assert run(policy=server, **{"search.concurrency": 3}) == 3
    assert run(policy=server, **{"search.schedule": "rounds"}) == 4
    assert tree_batch(TreeConfig()) == 8
    assert tree_batch(TreeConfig(policy=server)) == 32  # 2 x 64 / (2 x branching 2)
    assert tree_batch(TreeConfig(policy=server, batch_trees=2)) == 2


def test_without_ray_installed_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(CodetoolError, match=r"pip install 'codetool\[ray\]'"):
        run_on_ray("auto", ClusterConfig(), ["a"], unit_key=str, record_key=str, runner=(object, ()),
                   on_record=print, on_error=print, batch=1)


@pytest.mark.parametrize("address, pinned", [("local", True), ("127.0.0.1:6379", True), ("ray://localhost:10001", True),
                                             ("auto", False), ("10.1.2.3:6379", False)])
def test_a_ray_on_this_machine_is_kept_on_loopback(monkeypatch, address, pinned):
    """``--ray local`` starts Ray in this process on 127.0.0.1, and a cluster address on loopback
    is joined on loopback. Ray left to itself picks the machine's non-loopback address (its GCS
    and raylets listening on every interface) and rewrites 127.0.0.1 into it; its one switch for
    "this machine only" is RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, inherited by what it starts.
    A remote cluster's address is left alone."""
    from codetool.distributed.ray_cluster import LOCAL_ONLY_ENV

    for name in (LOCAL_ONLY_ENV, "RAY_ADDRESS"):  # set then removed: the test's own setting is undone after it
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    seen = {}

    def init(address=None, **kwargs):
        seen.update(kwargs, address=address, env=os.environ.get(LOCAL_ONLY_ENV))
        raise ConnectionError("stop here")

    constants = types.SimpleNamespace(ENABLE_RAY_CLUSTER=True)
    ray = types.SimpleNamespace(is_initialized=lambda: False, init=init,
                                _private=types.SimpleNamespace(ray_constants=constants))
    monkeypatch.setitem(sys.modules, "ray", ray)
    with pytest.raises(CodetoolError, match="RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head"):
        run_on_ray(address, ClusterConfig(), [], unit_key=str, record_key=str, runner=(object, ()),
                   on_record=print, on_error=print, batch=1)
    assert (seen["env"] == "0") is pinned and constants.ENABLE_RAY_CLUSTER is not pinned
    assert seen.get("_node_ip_address") == ("127.0.0.1" if address == "local" else None)
