"""Build binary action trees on training queries: the PRM's training data (CodeTool §3.2).

For each query the builder samples ``branching`` candidate steps at every node, executes each in
a ``fork()`` of its parent's executor (no step or tool call is re-run, except the steps above
the open nodes of a tree a killed build started), and expands until a
leaf: the code called ``finish``/``give_up``, the depth reached ``max_depth``, or (with
``failure_policy: stop``) the code failed. The nodes of one depth level are sampled in one batched
``generate`` call; that yields the same tree as a depth-first walk and keeps the CPU busy. Each
node's children are sampled with their own seed, from the tree's seed (base seed and query id) and
the node's id (:func:`~codetool.tree.nodes.node_seed`; one seed per prompt of the batched call), so
a tree does not depend on which trees share its batch: ``--shard i/n`` runs, Ray workers, a resumed
run and a single run give the same trees (up to float rounding in the batched forward passes).

Leaf success (``success``, see :func:`codetool.tree.labels.leaf_success`): ``executed`` (the
public code's notion: every step on the path ran without an exception or a tool error),
``grounded`` (default: ``finish`` with a non-empty answer after at least one successful call of a
listed tool; a tool-free finish never succeeds), or ``judged`` (grounded, and a judge from
``codetool.eval`` says Solved). Sibling labels follow ``label_rule``: ``ours`` (default) or
``latent`` (:func:`codetool.tree.labels.sibling_pairs`), or ``reference``, the public code's rows
exactly (:mod:`codetool.tree.reference`): after a tree is built, each node's path is re-run as the
public code runs it (earlier steps with their prints stripped, then the node; one sandbox per
tree), and the statuses and outputs are cached in the record, so ``--relabel`` needs no sandbox.
Every tree's summary counts its pairs by what decided them and its drops by reason.

Output: one JSON line per finished tree (a rerun skips finished query ids, refuses an output
written with other settings unless ``--force_resume``, and holds a lock on the output), then
:mod:`codetool.tree.dataset` turns trees into PRM examples. Nodes are logged as they are built
(:mod:`codetool.tree.checkpoint`: level by level here, node by node in :mod:`codetool.tree.grow`),
so a kill costs at most the level in progress: a rerun continues the trees it started (rebuilding
the open nodes' states by running the steps above them again) and grows the same trees.
A tree whose build raises, and a malformed query entry, is recorded as ``finish_type: error`` and
left out of the dataset; the exit status is 1 (a shard's too) and ``--retry_failed`` rebuilds only
those (``codetool.resume``). :mod:`codetool.jobs.trees` runs the job: the PRM dataset is exported
all or nothing (a full disk is an error that leaves the previous export), ``--ray ADDRESS`` builds
the trees on a Ray cluster's workers (one ``TreeRunner`` each, :mod:`codetool.distributed`), and
``--merge`` refuses shards that did not finish, naming them (Slurm templates: ``scripts/slurm/``);
the command is :mod:`codetool.commands.build_trees`, the settings :mod:`codetool.tree.config`.
A local policy grows a batch of trees level by level (:meth:`TreeBuilder.build_many`); a remote
one node by node as its samples return (:mod:`codetool.tree.grow`, ``search.schedule``), on each
Ray worker too; both label a finished tree the same way (:meth:`TreeBuilder.record`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from codetool.config import ConfigError
from codetool.search.expand import Node, check_constraints, expand_each
from codetool.search.prompt import history_entry
from codetool.search.schedule import is_continuous, serving_records, units_in_flight
from codetool.search.search import SearchTask
from codetool.tree.checkpoint import reopen
from codetool.tree.config import TreeConfig, tree_hash
from codetool.tree.labels import (
    add_counts,
    label_tree,
    leaf_success,
    node_executed,
    pair_counts,
    sibling_pairs,
)
from codetool.tree.nodes import (
    FrontierNode,
    TreeError,
    drop_failed,
    error_record,
    faulted,
    guard,
    node_record,
    node_seed,
    record_error,
    tree_seed,
)
from codetool.tree.reference import LazyRunner, label_reference, reference_runner

logger = logging.getLogger(__name__)


class TreeBuilder:
    """Expands action trees with a policy and an executor per query.

    Args:
        policy (`LLMBackend`): samples candidate steps.
        config (`TreeConfig`): tree settings.
        make_executor (`Callable[[SearchTask], StepExecutor]`): a fresh executor for a task.
        judge (*optional*): ``judge(query, answer) -> bool`` when ``success='judged'``.
        make_reference_runner (`Callable[[SearchTask], ReferenceRunner]`, *optional*): the
            re-runs of ``label_rule: reference`` (default: a sandbox from ``make_executor`` on the
            task's tools as the public code's programs see them).
    """

    def __init__(self, policy, config: TreeConfig, make_executor, judge=None, make_reference_runner=None):
        if config.success == "judged" and judge is None:
            raise ConfigError("success=judged needs a judge; pass one or use success=grounded.")
        self.policy, self.cfg, self.make_executor, self.judge = policy, config, make_executor, judge
        self.make_reference_runner = make_reference_runner or (lambda task: reference_runner(task, make_executor))
        self.chash = tree_hash(config)  # in every record, error records included
        # max_steps = max_depth: a constrained policy's last step then answers (search.constrain_last_finish)
        self.sample_cfg = config.search.search_config(k=config.branching, max_steps=config.max_depth)
        check_constraints(policy, self.sample_cfg)
        self.continuous = is_continuous(policy, config.search.schedule)
        # Under continuous scheduling a tree asks for up to all its frontier at once: fewer trees
        # than episodes fill the client (codetool.tree.grow).
        self.trees = units_in_flight(config.batch_trees, policy, self.continuous, local_default=8,
                                     per_unit=2 * config.branching)
        self.node_log = None  # where built nodes go as they are built (codetool.tree.checkpoint.NodeLog)

    def build(self, task: SearchTask) -> dict[str, Any]:
        """Build, label and summarise the tree of one query; returns its JSON-able record."""
        return self.build_many([task])[0]

    def log_nodes(self, task: SearchTask, nodes: dict[str, dict], steps: dict[str, dict]) -> None:
        """Hand freshly built ``nodes`` (and the history entries of those to expand) to
        :attr:`node_log` (a :class:`~codetool.tree.checkpoint.NodeLog`, set by the job), if any."""
        if self.node_log is not None and nodes:
            self.node_log.write(task.query_id, nodes, steps)

    def start_tree(self, t: int, task: SearchTask, partial: dict | None = None) -> list[FrontierNode]:
        """The open nodes a tree starts from: its root with a fresh executor, or, for a tree whose
        nodes a killed run logged (``partial``, :func:`~codetool.tree.checkpoint.read_partial`),
        the logged tree's open nodes with their states rebuilt (:func:`~codetool.tree.checkpoint.reopen`)."""
        root = self.make_executor(task)
        if not partial:
            return [FrontierNode(t, None, root, [], 0)]
        return reopen(t, partial, root)

    def build_many(self, tasks: list[SearchTask], partial: dict[str, dict] | None = None) -> list[dict[str, Any]]:
        """Grow the trees of ``tasks`` together, one level at a time.

        Every level of every tree is sampled in one batched ``expand`` call, so a local policy
        decodes all frontier nodes in the same forward passes and a server sees them concurrently.
        Each frontier node is sampled with its own seed (:func:`~codetool.tree.nodes.node_seed`),
        the one :mod:`codetool.tree.grow` uses: a tree is the same whatever trees share its batch.
        Each level's new nodes are logged (:meth:`log_nodes`) before the next level starts, so a
        kill costs at most the level in progress.

        Args:
            partial (`dict`, *optional*): ``{query_id: logged nodes}`` of trees a killed run
                started: they continue from their open nodes (:meth:`start_tree`).

        Returns:
            One JSON-able record per task, in order. A tree whose building failed (its executor
            could not start or faulted, the policy or the judge raised) is recorded with its
            ``error`` and no nodes or pairs; the other trees go on.
        """
        cfg, start = self.cfg, time.perf_counter()
        seeds = [tree_seed(cfg.seed, task.query_id) for task in tasks]
        trees: list[dict[str, dict]] = [{} for _ in tasks]
        errors: dict[int, TreeError] = {}  # tree index -> why it failed
        frontier: list[FrontierNode] = []
        for t, task in enumerate(tasks):
            logged = (partial or {}).get(str(task.query_id))
            if logged:
                trees[t].update(logged["nodes"])
            frontier += guard(errors, t, self.start_tree, t, task, logged) or []
        try:
            while frontier:
                level = time.perf_counter()
                rows = expand_each(self.policy, [Node(n.state, n.history, tasks[n.tree]) for n in frontier],
                                   cfg.branching, self.sample_cfg, distinct_draws=cfg.distinct_draws,
                                   seed=[node_seed(seeds[n.tree], n.node_id) for n in frontier])
                for n, row in zip(frontier, rows):
                    if isinstance(row, Exception):  # this tree's policy call failed: it ends
                        record_error(errors, n.tree, row)
                done = [[] if isinstance(row, Exception) else row for row in rows]
                logger.info("trees %s: depth %d, %d nodes sampled and executed in %.1f s",
                            ", ".join(str(t.query_id) for t in tasks[:3]) + (", ..." if len(tasks) > 3 else ""),
                            frontier[0].depth + 1, sum(map(len, done)), time.perf_counter() - level)
                next_frontier = []
                built: dict[int, tuple[dict, dict]] = {}  # tree -> (new nodes, their steps), logged below
                for n, row in zip(frontier, done):
                    t, parent, state, history, depth = n.tree, n.node_id, n.state, n.history, n.depth
                    if faulted(errors, t, row):
                        state.close()
                        continue
                    nodes, steps = built.setdefault(t, ({}, {}))
                    for i, e in enumerate(row, 1):
                        node_id = f"{parent}-{i}" if parent else str(i)
                        node = trees[t][node_id] = nodes[node_id] = node_record(node_id, parent, depth + 1, e)
                        stop = (cfg.failure_policy == "stop" and not node["ok"]) or not node["executed"]  # nothing to grow from
                        if e.ended or depth + 1 >= cfg.max_depth or stop:
                            node["leaf"] = True
                            if e.state is not None:
                                e.state.close()
                            continue
                        child = e.state if e.state is not None else state.fork()
                        step = steps[node_id] = history_entry(e.candidate, e.observation)
                        next_frontier.append(FrontierNode(t, node_id, child, history + [step], depth + 1))
                    state.close()
                frontier = drop_failed(next_frontier, errors)
                for t, (nodes, steps) in built.items():
                    if t not in errors:
                        self.log_nodes(tasks[t], nodes, steps)
        finally:
            for n in frontier:
                n.state.close()
        seconds = (time.perf_counter() - start) / len(tasks)  # the batch's time, shared evenly
        records = [guard(errors, t, self.record, task, tree, seconds) if t not in errors else None
                   for t, (task, tree) in enumerate(zip(tasks, trees))]
        return [error_record(task, errors[t], seconds, self.chash) if t in errors or record is None else record
                for t, (task, record) in enumerate(zip(tasks, records))]

    def record(self, task: SearchTask, tree: dict[str, dict], seconds: float) -> dict[str, Any]:
        """The JSON-able record of a grown tree: leaf success (the judge under ``success: judged``),
        the policy server's ``serving`` record, labels and pairs (``label_rule: reference`` re-runs
        the paths in a sandbox of its own, started only when needed); ``seconds`` is its build time."""
        cfg = self.cfg
        tool_names = sorted(api.name for api in task.env.apis)
        mode = "grounded" if cfg.success == "judged" else cfg.success
        key = task.extra.get("answer") if cfg.success == "answer" else None
        for node_id, node in tree.items():
            if node["leaf"]:
                ok = leaf_success(tree, node_id, mode, tool_names=tool_names, query=task.query, answer_key=key)
                if ok and cfg.success == "judged":
                    ok = bool(self.judge(task.query, str(node["final_answer"])))
                node["success"] = ok
        record = {"query_id": task.query_id, "query": task.query, "tools": task.env.render(),
                  "tool_names": tool_names, "observation_history": cfg.search.observation_history,
                  "step_format": cfg.search.step_format,
                  "config_hash": self.chash,
                  "nodes": tree, "summary": {"seconds": seconds}}
        if key is not None:  # success: answer relabels from the record (--relabel)
            record["answer_key"] = key
        serving = serving_records(policy=self.policy)
        if serving:
            record["serving"] = serving
        if cfg.label_rule != "reference":
            return label_record(record, cfg)
        with LazyRunner(lambda: self.make_reference_runner(task)) as runner:
            return label_record(record, cfg, runner=runner)


def label_record(record: dict[str, Any], cfg: TreeConfig, *, recompute_success: bool = False,
                 runner=None) -> dict[str, Any]:
    """Label a tree record in place: LR, tau and latent reward per node, sibling ``pairs`` under
    ``cfg.label_rule``, and the ``summary`` (pairs by what decided them, drops by reason).

    Args:
        record (`dict`): a tree record (``nodes``; ``tool_names`` when present).
        cfg (`TreeConfig`): alpha, beta, L, tau_mode, label_rule (and success when recomputing).
        recompute_success (`bool`, *optional*): derive each leaf's success again under
            ``cfg.success`` (``executed`` or ``grounded``; ``judged`` keeps the stored verdicts).
        runner (`ReferenceRunner`, *optional*): runs the programs ``label_rule: reference`` needs
            that the record's ``reference_runs`` does not hold yet.
    Returns:
        The same record.
    Raises:
        CodetoolError: ``label_rule: reference`` needs a run that is neither cached nor runnable.
    """
    tree = record["nodes"]
    if recompute_success and cfg.success != "judged":
        names = record.get("tool_names")
        for node_id, node in tree.items():
            if node["leaf"]:
                node["success"] = leaf_success(tree, node_id, cfg.success, tool_names=names,
                                                query=record.get("query"), answer_key=record.get("answer_key"))
    label_tree(tree, alpha=cfg.alpha, beta=cfg.beta, max_len=cfg.max_len, tau_mode=cfg.tau_mode)
    if cfg.label_rule == "reference":
        counts = label_reference(record, runner, generator=cfg.generator_quirks, alpha=cfg.alpha, beta=cfg.beta,
                                 max_len=cfg.max_len)
        pairs = record["pairs"]
    else:
        pairs, counts = sibling_pairs(tree, cfg.label_rule)
    leaves = [n for n in tree.values() if n["leaf"] and node_executed(n)]
    record["pairs"] = pairs
    record["label_rule"], record["success_mode"] = cfg.label_rule, cfg.success
    record["summary"] = {"nodes": len(tree), "leaves": len(leaves),
                         "not_executed": sum(not node_executed(n) for n in tree.values()),
                         "retried": sum(int((n.get("result") or {}).get("attempts") or 1) > 1 for n in tree.values()),
                         "successful_leaves": sum(bool(n["success"]) for n in leaves),
                         "pairs": len(pairs), "pair_counts": counts,
                         "tool_calls": sum(n["tool_calls"] for n in tree.values()),
                         "seconds": record.get("summary", {}).get("seconds", 0.0)}
    return record


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over tree records: trees (built), errors (trees whose build failed: left out of every
    other total; ``errors_not_executed`` of them the machine's failure), nodes, leaves (executed ones), leaf success rate, ``not_executed`` (nodes the
    executor could not run: no label counts them), ``retried`` (nodes whose step the executor had to
    try again after a failure of the machine, whatever came of it), pairs (``pairs_by_<reason>`` for what decided
    them, ``dropped_<reason>`` for drops), tool calls, seconds per tree and trees per hour."""
    s = [r["summary"] for r in records if r.get("finish_type") != "error"]
    total = {k: sum(x.get(k, 0) for x in s) for k in ("nodes", "leaves", "successful_leaves", "pairs",
                                                      "tool_calls", "seconds", "not_executed", "retried")}
    counts = pair_counts()
    for x in s:
        add_counts(counts, x.get("pair_counts", {}))
    seconds_per_tree = total["seconds"] / len(s) if s else 0.0
    machine = sum(bool(r.get("not_executed")) for r in records if r.get("finish_type") == "error")
    return {"trees": len(s), "errors": len(records) - len(s), "errors_not_executed": machine, **{k: v for k, v in total.items() if k != "seconds"},
            **{f"pairs_by_{k}": v for k, v in counts["decided"].items()},
            **{f"dropped_{k}": v for k, v in counts["dropped"].items()},
            "leaf_success_rate": total["successful_leaves"] / total["leaves"] if total["leaves"] else 0.0,
            "seconds_per_tree": seconds_per_tree,
            "trees_per_hour": 3600.0 / seconds_per_tree if seconds_per_tree else 0.0}


def judge_fn(cfg: TreeConfig):
    """``judge(query, answer) -> bool`` (Solved) for ``success: judged``, else ``None``."""
    if cfg.success != "judged":
        return None
    from codetool.assemble import make_judge
    from codetool.judge.config import JudgeConfig
    from codetool.judge.records import AnswerRequest

    judge = make_judge(JudgeConfig(model=cfg.judge))
    if judge is None:
        raise ConfigError(f"trees.success is 'judged' but trees.judge {cfg.judge!r} configures no judge; set "
                          "trees.judge to a judge model, or use success: grounded.")
    return lambda query, answer: judge.judge_answers([AnswerRequest(query, answer)])[0].label == "Solved"
