"""The pieces a tree is grown from, shared by the level-by-level builder
(:meth:`codetool.tree.build.TreeBuilder.build_many`) and the node-by-node one
(:mod:`codetool.tree.grow`): tree seeds, node records, open nodes, and how a failure ends its tree
(its error kept per tree index, its executors closed, an error record in its place).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from codetool.executor import log_safe
from codetool.executor.result import StepExecutor
from codetool.resume import unit_seed
from codetool.rewards import machine_failure, not_executed
from codetool.search.search import SearchTask
from codetool.secrets import redact

logger = logging.getLogger(__name__)


def tree_seed(base: int, query_id: str) -> int:
    """A per-tree seed that depends only on the base seed and the query id."""
    return int(hashlib.sha256(f"{base}:{query_id}".encode()).hexdigest()[:8], 16)


def node_seed(tree: int, node_id: str | None) -> int:
    """The sampling seed of a node's children: from its tree's seed and its id (``None`` for the
    root). Every path that grows trees (level by level, node by node, sharded, on Ray, resumed)
    samples a node with this seed alone, so a tree never depends on which trees share its batch."""
    return unit_seed(tree, [[node_id or "root"]])


def node_record(node_id: str, parent: str | None, depth: int, e) -> dict[str, Any]:
    """The JSON-able record of a sampled and executed node (``e``: an ``Expanded``); ``executed`` is
    false when the executor could not run its code (a leaf that says nothing, ``codetool.tree.labels``)."""
    c = e.candidate
    return {"id": node_id, "parent": parent, "depth": depth, "code": c.code, "text": c.text,
            "observation": e.observation, "result": c.result.to_dict(), "ok": bool(c.r_spot),
            "executed": not not_executed(c.result),
            "tool_calls": len(c.result.tool_calls), "final_answer": c.result.final_answer,
            "ended": e.ended, "leaf": False, "success": None,
            "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens}


@dataclass
class FrontierNode:
    """An open node of a tree being grown (``TreeBuilder.build_many``, ``codetool.tree.grow``).

    Args:
        tree (`int`): the index of its tree (task) in the batch.
        node_id (`str` or `None`): its id (``"1-2"``), ``None`` for the root.
        state: its executor (the parent's, forked), closed when the node is expanded or dropped.
        history (`list[dict]`): the steps above it (``code``, ``text``, ``observation``).
        depth (`int`): its depth (0 for the root).
    """

    tree: int
    node_id: str | None
    state: StepExecutor
    history: list[dict]
    depth: int


def guard(errors: dict[int, TreeError], trees: int | list[int], func, *args, **kwargs):
    """``func(*args, **kwargs)``, or ``None`` with the exception recorded in ``errors`` for each
    tree index in ``trees`` (a failure ends those trees, not the run)."""
    try:
        return func(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - recorded on the tree(s), the run goes on
        record_error(errors, trees, exc)
        return None


@dataclass(frozen=True)
class TreeError:
    """Why a tree's building failed.

    Args:
        message (`str`): the error, redacted and cut to 2,000 characters.
        machine (`bool`, *optional*, defaults to `False`): the failure is the machine's
            (``codetool.rewards.machine_failure``, or an executor that raised in a step: no step's
            code makes it raise); the tree's error record then says ``not_executed``.
    """

    message: str
    machine: bool = False


def record_error(errors: dict[int, TreeError], trees: int | list[int], exc: BaseException) -> None:
    """Record ``exc`` as the failure of each tree in ``trees`` (the first failure of a tree stands)."""
    error = TreeError(redact(f"{type(exc).__name__}: {exc}")[:2000], machine=machine_failure(exc))
    for t in [trees] if isinstance(trees, int) else trees:
        errors.setdefault(t, error)
    logger.warning("tree building failed (%s trees): %s", len(errors), log_safe(error.message, 500))


def faulted(errors: dict[int, TreeError], t: int, row: list) -> bool:
    """Whether tree ``t`` failed before or in this row (an executor fault: ``host_error``, the
    machine's); the row's forks are then closed."""
    fault = next((e.candidate.result.host_error for e in row if e.candidate.result.host_error), None)
    if fault:
        errors.setdefault(t, TreeError(fault, machine=True))
    if t not in errors:
        return False
    for e in row:
        if e.state is not None:
            e.state.close()
    return True


def drop_failed(frontier: list[FrontierNode], errors: dict[int, TreeError]) -> list[FrontierNode]:
    """The frontier nodes of trees that have not failed; the others' executors are closed."""
    kept = []
    for node in frontier:
        if node.tree in errors:
            node.state.close()
        else:
            kept.append(node)
    return kept


def error_record(task: SearchTask, error: TreeError, seconds: float, config_hash: str) -> dict[str, Any]:
    """The record of a tree whose building failed: its error, no nodes, no pairs; ``not_executed``
    when the failure is the machine's."""
    return {"query_id": task.query_id, "query": task.query, "tools": task.env.render(),
            "config_hash": config_hash, "nodes": {},
            "pairs": [], "error": error.message, "finish_type": "error",
            **({"not_executed": True} if error.machine else {}),
            "summary": {"nodes": 0, "leaves": 0, "successful_leaves": 0, "pairs": 0,
                        "tool_calls": 0, "seconds": seconds, "error": True}}
