"""Growing action trees node by node against a remote policy (continuous scheduling, issue 28).

:meth:`codetool.tree.build.TreeBuilder.build_many` grows a batch of trees level by level, one
batched ``generate`` call per level, which is what a local model wants. Against a server that
leaves it idle while the slowest node of a level is sampled, executed and recorded, and between
batches of trees. :func:`grow` instead expands every node as its own job in a thread pool: when a
node's samples return, its candidates run in forks of its executor, its children are queued at
once, and a finished tree is labelled (:meth:`~codetool.tree.build.TreeBuilder.record`: the
reference rule's re-runs too, as a job of the pool unless a judge decides success) and handed to
``on_done`` while the other trees go on (a new tree starts in its place). Deeper nodes are
expanded first, so trees finish early and their executors close. ``TreeRunner`` calls it for
its units, on one machine or in each Ray worker (:mod:`codetool.jobs.trees`).

Each node's sampling seed comes from its tree's seed (``tree_seed``: the base seed and the query
id) and its node id, so a tree does not depend on the timing, ``batch_trees`` or sharding. A
failure ends its tree only (an error record, as in ``build_many``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from codetool.search.expand import Node, expand_each
from codetool.search.prompt import history_entry
from codetool.search.search import SearchTask
from codetool.tree.nodes import (
    FrontierNode,
    TreeError,
    error_record,
    faulted,
    node_record,
    node_seed,
    record_error,
    tree_seed,
)

logger = logging.getLogger(__name__)


@dataclass
class _Tree:
    """A tree being grown: its task, nodes so far, jobs not yet handled and its first failure."""

    task: SearchTask
    seed: int
    nodes: dict[str, dict] = field(default_factory=dict)
    open: int = 0
    started: float = field(default_factory=time.perf_counter)


def grow(builder, tasks: Iterable[SearchTask], on_done: Callable[[dict], None], *, trees: int, workers: int,
         admit: Callable[[int], bool] | None = None, partial: dict[str, dict] | None = None) -> None:
    """Grow the tree of every task, ``trees`` at a time, with at most ``workers`` jobs running.

    Args:
        builder (`TreeBuilder`): its policy, settings, executor factory and judge; each expanded
            node's children go to :meth:`~codetool.tree.build.TreeBuilder.log_nodes` at once.
        tasks (`Iterable[SearchTask]`): taken one at a time as trees finish.
        on_done (`Callable[[dict], None]`): receives each tree record (or error record) in this
            thread as soon as the tree is done.
        admit (`Callable[[int], bool]`, *optional*): whether a new tree may start beside the number
            growing (a memory cap, :class:`codetool.memory_use.MemoryGate`); asked again when a job
            ends or half a second later; a tree always starts when none grows.
        partial (`dict`, *optional*): ``{query_id: logged nodes}`` of trees a killed run started:
            they continue from their open nodes.
    """
    cfg, sample_cfg = builder.cfg, builder.sample_cfg
    pending = iter(tasks)
    live: dict[int, _Tree] = {}
    errors: dict[int, TreeError] = {}
    ready: deque[FrontierNode] = deque()
    running: dict[Future, tuple[str, Any]] = {}
    counter = 0
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="codetool-tree")

    def submit(kind: str, payload, func, *args) -> None:
        running[pool.submit(func, *args)] = (kind, payload)

    def expand_node(n: FrontierNode, tree: _Tree):
        node = Node(n.state, n.history, tree.task)
        return expand_each(builder.policy, [node], cfg.branching, sample_cfg, seed=[node_seed(tree.seed, n.node_id)],
                           distinct_draws=cfg.distinct_draws)[0]

    def close_tree(t: int) -> None:
        # A judged success asks the judge, which may be a local model that must not run in several
        # threads at once: labelled here, in the scheduling thread. Without a judge the labelling
        # (label_rule reference re-runs the paths in a sandbox) is a job like the nodes', so the
        # server stays busy meanwhile; a new tree may start in its place at once.
        tree = live.pop(t)
        seconds = time.perf_counter() - tree.started
        if t in errors:
            on_done(error_record(tree.task, errors.pop(t), seconds, builder.chash))
        elif builder.judge is None:
            submit("record", (t, tree.task, seconds), builder.record, tree.task, tree.nodes, seconds)
        else:
            land(t, tree.task, seconds, lambda: builder.record(tree.task, tree.nodes, seconds))

    def land(t: int, task: SearchTask, seconds: float, result) -> None:
        try:
            record = result()
        except Exception as exc:  # noqa: BLE001 - this tree ends as an error record
            record_error(errors, t, exc)
            record = error_record(task, errors.pop(t), seconds, builder.chash)
        on_done(record)

    def settle(t: int) -> None:
        live[t].open -= 1
        if live[t].open == 0:
            close_tree(t)

    def on_row(n: FrontierNode, row) -> None:
        t, tree = n.tree, live[n.tree]
        if isinstance(row, Exception):
            record_error(errors, t, row)
            row = []
        if faulted(errors, t, row):
            n.state.close()
            return
        nodes, steps = {}, {}
        for i, e in enumerate(row, 1):
            node_id = f"{n.node_id}-{i}" if n.node_id else str(i)
            node = tree.nodes[node_id] = nodes[node_id] = node_record(node_id, n.node_id, n.depth + 1, e)
            stop = (cfg.failure_policy == "stop" and not node["ok"]) or not node["executed"]  # nothing to grow from
            if e.ended or n.depth + 1 >= cfg.max_depth or stop:
                node["leaf"] = True
                if e.state is not None:
                    e.state.close()
                continue
            child = e.state if e.state is not None else n.state.fork()
            tree.open += 1
            step = steps[node_id] = history_entry(e.candidate, e.observation)
            ready.append(FrontierNode(t, node_id, child, n.history + [step], n.depth + 1))
        n.state.close()
        builder.log_nodes(tree.task, nodes, steps)

    try:
        while True:
            held = False
            while len(live) < trees:
                if live and admit is not None and not admit(len(live)):
                    held = True  # asked again when a job ends, or half a second later
                    break
                if (task := next(pending, None)) is None:
                    break
                logged = (partial or {}).get(str(task.query_id))
                live[counter] = _Tree(task, tree_seed(cfg.seed, task.query_id), open=1)
                if logged:
                    live[counter].nodes.update(logged["nodes"])
                submit("start", counter, builder.start_tree, counter, task, logged)
                counter += 1
            while ready and len(running) < workers:
                n = ready.pop()  # deepest first: trees finish early and close their executors
                if n.tree in errors:
                    n.state.close()
                    settle(n.tree)
                else:
                    submit("node", n, expand_node, n, live[n.tree])
            if not running:
                break
            done, _ = wait(list(running), timeout=0.5 if held else None, return_when=FIRST_COMPLETED)
            for future in done:
                kind, payload = running.pop(future)
                exc = future.exception()
                if kind == "record":
                    index, done_task, seconds = payload
                    land(index, done_task, seconds, future.result)
                elif kind == "start":  # the root, or the open nodes of a logged tree (maybe none left)
                    if exc is not None:
                        record_error(errors, payload, exc)
                    else:
                        opened = future.result()
                        ready.extend(opened)
                        live[payload].open += len(opened)
                    settle(payload)
                else:
                    on_row(payload, exc if exc is not None else future.result())
                    settle(payload.tree)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for n in ready:
            n.state.close()
        raise
    pool.shutdown(wait=True)
