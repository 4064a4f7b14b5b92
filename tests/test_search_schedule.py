"""Continuous scheduling (issue 28): episodes and tree nodes advance on their own, seeds from the unit."""

from __future__ import annotations

import hashlib
import random
import threading
import time

import pytest

from codetool.assemble import make_search
from codetool.executor import Executor, ExecutorConfig
from codetool.models.completion import Completion, to_messages
from codetool.search.config import SearchConfig
from codetool.search.schedule import Serialized, is_continuous, stream, thread_safe, units_in_flight
from codetool.search.search import SearchTask
from codetool.tools.backends import make_tool_backend
from codetool.tools.environment import ToolEnvironment
from codetool.tools.loaders import load_stabletoolbench
from codetool.tree.search_settings import TreeSearch

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)


class ServerLike:
    """A policy that behaves as a server: continuous, each reply a function of the prompt, the
    seed and the sample index, after a random delay (so completion order varies run to run).
    The episode of a query named in ``hang`` waits on its first step until ``release`` is set."""

    name, supports_logprobs, continuous, max_in_flight = "server-like", False, True, 8

    def __init__(self, hang: str = "", release: threading.Event | None = None, finish_at: int = 3):
        self.hang, self.release, self.finish_at = hang, release, finish_at
        self.released = None  # whether the hung request was released (not given up on)
        self.active = self.peak = 0
        self.lock = threading.Lock()
        self.seeds: dict[str, list[int]] = {}

    def generate(self, prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=256, stop=None, seed=None,
                 constraint=None):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            out = []
            for prompt in prompts:
                messages = to_messages(prompt)
                step = sum(m["role"] == "assistant" for m in messages[:-1])
                query = messages[1]["content"]
                self.seeds.setdefault(query, []).append(seed)
                if self.hang and self.hang in query and step == 0:
                    self.released = self.release.wait(120)  # a cap, so a failing test ends
                else:
                    time.sleep(random.uniform(0, 0.03))
                row = []
                for i in range(n):
                    h = int(hashlib.sha256(f"{query}|{step}|{seed}|{i}".encode()).hexdigest()[:6], 16)
                    code = f"finish('done {h % 97}')" if step + 1 >= self.finish_at else f"x = {h}\nprint(x)"
                    row.append(Completion(f"{code}\n```", 5, 3, "stop"))
                out.append(row)
            return out
        finally:
            with self.lock:
                self.active -= 1


@pytest.fixture(scope="module")
def queries(shared_data):
    return load_stabletoolbench("G1_instruction", shared_data)[:6]


def tasks(queries):
    return [SearchTask(query_id=q.query_id, query=q.query, env=ToolEnvironment.from_query(q, make_tool_backend("simulator")),
                       benchmark="stabletoolbench", group="G1_instruction") for q in queries]


def factory(task):
    return Executor(EXEC, tools=task.env.functions())


def chosen_codes(trajs):
    return {t.query_id: [s.chosen_candidate.code for s in t.steps] for t in trajs}


def test_schedule_follows_the_backend_and_the_setting():
    assert is_continuous(ServerLike()) and not is_continuous(object())
    assert not is_continuous(ServerLike(), "rounds") and is_continuous(object(), "continuous")
    assert units_in_flight(None, ServerLike(), False, local_default=4) == 4
    assert units_in_flight(None, ServerLike(), True, local_default=4, per_unit=2) == 8  # 2 x 8 / 2
    assert units_in_flight(None, ServerLike(), True, local_default=4, per_unit=8) == 4  # at least the default
    assert units_in_flight(3, ServerLike(), True, local_default=4) == 3  # a given value is kept


def test_continuous_results_do_not_depend_on_the_order_of_completion(queries):
    cfg = SearchConfig(latent="none", k=2, max_steps=4, seed=7)
    first = make_search(ServerLike(), cfg, factory).run(tasks(queries))
    again = make_search(ServerLike(), cfg, factory).run(tasks(queries))
    assert chosen_codes(first) == chosen_codes(again)
    assert all(t.finish_type == "finish" and len(t.steps) == 3 for t in first)
    assert all(t.serving == {} for t in first)  # a backend without a serving record
    # the seed of a step is the one a batched round of that episode alone draws
    rounds = make_search(ServerLike(), SearchConfig(latent="none", k=2, max_steps=4, seed=7, concurrency=1,
                                                       schedule="rounds"), factory).run(tasks(queries))
    assert chosen_codes(rounds) == chosen_codes(first)


def test_a_hung_request_does_not_stall_other_episodes(queries):
    """The first query's request hangs until every other episode has finished: the search ends
    (no deadlock), that episode lands last, and it was released by the others finishing."""
    release = threading.Event()
    policy = ServerLike(hang=queries[0].query[:40], release=release)
    order = []

    def done(t):
        order.append(t.query_id)
        if len(order) == len(queries) - 1:
            release.set()

    make_search(policy, SearchConfig(latent="none", k=1, max_steps=3), factory).run(tasks(queries), on_done=done)
    assert order[-1] == queries[0].query_id and sorted(order) == sorted(q.query_id for q in queries)
    assert policy.released is True  # the others all finished while it hung
    assert policy.peak > 1


def test_stream_delivers_what_finished_then_raises():
    seen = []

    def work(x):
        time.sleep(0.05 * x)
        if x == 0:
            raise ValueError("zero")
        return x

    with pytest.raises(ValueError, match="zero"):
        stream(work, range(6), 3, seen.append)
    assert sorted(seen) == [1, 2]  # 1 and 2 were running beside 0; nothing started after its failure


def test_serialized_scorer_is_called_by_one_thread_at_a_time():
    class Scorer:
        active = peak = 0

        def score(self, items):
            Scorer.active += 1
            Scorer.peak = max(Scorer.peak, Scorer.active)
            time.sleep(0.01)
            Scorer.active -= 1
            return [0.5] * len(items)

    wrapped = thread_safe(Scorer())
    assert isinstance(wrapped, Serialized) and not hasattr(wrapped, "count_tokens")
    threads = [threading.Thread(target=wrapped.score, args=([1],)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Scorer.peak == 1
    safe = type("Safe", (), {"thread_safe": True, "score": lambda self, items: []})()
    assert thread_safe(safe) is safe and thread_safe(None) is None


def test_continuous_trees_are_the_same_whatever_the_timing(queries):
    from codetool.tree.build import TreeBuilder
    from codetool.tree.config import TreeConfig
    from codetool.tree.grow import grow

    cfg = TreeConfig(branching=2, max_depth=3, search=TreeSearch(max_new_tokens=256))
    runs = []
    for _ in range(2):
        builder = TreeBuilder(ServerLike(finish_at=9), cfg, factory)
        assert builder.continuous and builder.trees == 8  # 2 x 8 in flight / (2 x branching 2), at least 8
        records = []
        grow(builder, tasks(queries[:3]), records.append, trees=2, workers=4)
        runs.append({r["query_id"]: {k: n["code"] for k, n in r["nodes"].items()} for r in records})
    assert runs[0] == runs[1]
    assert all(len(nodes) == 14 for nodes in runs[0].values())  # 2 + 4 + 8 nodes, full binary trees


def test_continuous_trees_isolate_a_failing_query(queries):
    from codetool.tree.build import TreeBuilder
    from codetool.tree.config import TreeConfig
    from codetool.tree.grow import grow

    def broken_factory(task):
        if task.query_id == queries[1].query_id:
            raise RuntimeError("no sandbox")
        return factory(task)

    cfg = TreeConfig(branching=2, max_depth=2, search=TreeSearch(max_new_tokens=256))
    records = []
    grow(TreeBuilder(ServerLike(finish_at=9), cfg, broken_factory), tasks(queries[:3]), records.append, trees=3,
         workers=4)
    by_id = {r["query_id"]: r for r in records}
    assert by_id[queries[1].query_id]["finish_type"] == "error" and "no sandbox" in by_id[queries[1].query_id]["error"]
    assert [len(by_id[q.query_id]["nodes"]) for q in (queries[0], queries[2])] == [6, 6]
