"""Finished nodes of the trees being built, kept beside the output so a killed build loses at most
the level (or the nodes) in progress (issue 40).

``build-trees`` writes a tree's record only once the tree is complete; a tree of depth 5 against a
slow policy takes many minutes, all of it lost to a kill before this module. Now every node is
logged as soon as it is sampled and executed, in ``<output>.nodes`` (JSON lines, one per expanded
node or per tree and level: ``{"query_id", "config_hash", "nodes": {id: node record}, "steps":
{id: history entry}}``), by :class:`NodeLog` (flushed to the OS at once: a killed process loses
nothing it wrote; no fsync, so a crash of the machine may lose the last lines, which then run
again). A rerun (:func:`read_partial`) finds the trees that were started and not recorded, and
:func:`reopen` continues each from its logged nodes: the open nodes' executor states are rebuilt by
running the steps above them again, in forks, shared prefixes once; the steps' texts and outputs
shown to the policy are the logged ones. Nodes are sampled with their own seeds
(:func:`~codetool.tree.nodes.node_seed`), so a resumed tree is the tree an uninterrupted build
grows, given the same tool answers.

Limits: rebuilding a state calls the tools of the steps above the open nodes again (with a live
API whose answers change, the state may differ from the one the logged outputs show; the cache and
the simulator answer alike). Lines written with other settings are ignored. With ``--ray`` the
workers do not log nodes (the driver is the only writer): a lost tree is rebuilt whole. The file
is removed once every tree of the run is recorded.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

from codetool import CodetoolError
from codetool.jsonl import open_output, read_jsonl
from codetool.text import clean_obj
from codetool.tree.nodes import FrontierNode

logger = logging.getLogger(__name__)


def nodes_path(output: str | os.PathLike) -> Path:
    """The node log of a tree output (``trees.jsonl`` -> ``trees.jsonl.nodes``; not a ``*.jsonl``
    name, so ``--merge``'s shard pattern never matches it)."""
    return Path(str(output) + ".nodes")


class NodeLog:
    """Appends the nodes of trees in progress to ``path`` (see the module docstring).

    Args:
        path (`Path`): the node log (:func:`nodes_path` of the output).
        config_hash (`str`): the tree settings' hash, in every line.
    Raises:
        CodetoolError: the log cannot be opened (a planted link, permissions).
    """

    def __init__(self, path: str | os.PathLike, config_hash: str):
        self.path, self.config_hash = Path(path), config_hash
        self._file: BinaryIO | None = None

    def write(self, query_id: str, nodes: dict[str, dict], steps: dict[str, dict]) -> None:
        """Log ``nodes`` of the tree of ``query_id``, and the history entries of those that will be
        expanded (``steps``)."""
        if not nodes:
            return
        if self._file is None:
            self._file = open_output(self.path, append=True)
        line = json.dumps(clean_obj({"query_id": str(query_id), "config_hash": self.config_hash, "nodes": nodes,
                                     "steps": steps}), ensure_ascii=False, default=str)
        try:
            out = self._file
            out.write(line.encode("utf-8") + b"\n")
            out.flush()
        except OSError as e:
            raise CodetoolError(f"cannot write {self.path}: {e.strerror or e} (free space, then rerun: the trees "
                                "recorded so far are kept).") from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        """Close and delete the log (every tree of the run is recorded)."""
        self.close()
        self.path.unlink(missing_ok=True)


def read_partial(path: str | os.PathLike, config_hash: str, wanted: set[str]) -> dict[str, dict[str, dict]]:
    """The logged nodes of the trees ``wanted`` (query ids not yet recorded in the output), written
    with ``config_hash``: ``{query_id: {"nodes": {...}, "steps": {...}}}``. Lines of other trees or
    settings are skipped (the latter with a warning); a torn last line is skipped."""
    partial: dict[str, dict[str, dict]] = {}
    other = 0
    for line in read_jsonl(path):
        query_id = str(line.get("query_id"))
        if query_id not in wanted or not isinstance(line.get("nodes"), dict):
            continue
        if line.get("config_hash") != config_hash:
            other += 1
            continue
        tree = partial.setdefault(query_id, {"nodes": {}, "steps": {}})
        tree["nodes"].update(line["nodes"])
        tree["steps"].update(line.get("steps") or {})
    if other:
        logger.warning("%s: %d lines of nodes were written with other settings; those trees start afresh", path, other)
    return partial


def open_nodes(nodes: dict[str, dict]) -> list[str]:
    """The logged nodes still to expand: not leaves, and without children yet (a node's children
    are logged together), shallowest first."""
    parents = {n.get("parent") for n in nodes.values()}
    return sorted((i for i, n in nodes.items() if not n.get("leaf") and i not in parents),
                  key=lambda i: (i.count("-"), [int(p) for p in i.split("-")]))


def reopen(tree: int, partial: dict[str, dict], root) -> list[FrontierNode]:
    """The open nodes of a logged tree, each with its executor state rebuilt from ``root`` (the
    tree's fresh executor, which this closes) by running the steps above it again in forks.

    Args:
        tree (`int`): the tree's index (``FrontierNode.tree``).
        partial (`dict`): ``{"nodes", "steps"}`` from :func:`read_partial`.
        root (`StepExecutor`): a fresh executor for the tree's task.
    Returns:
        One :class:`FrontierNode` per open node (its history the logged steps of its path).
    Raises:
        CodetoolError: a logged node's step is missing (the log was edited).
    """
    nodes, steps = partial["nodes"], partial["steps"]
    states: dict[str | None, Any] = {None: root}
    frontier: list[FrontierNode] = []

    def state_of(node_id: str | None):
        if node_id not in states:
            parent = state_of(nodes[node_id].get("parent"))
            step = steps.get(node_id)
            if step is None:
                raise CodetoolError(f"the node log holds node {node_id} of a tree but not its step; remove the "
                                    "log (the tree is then built afresh).")
            child = parent.fork()
            if step.get("code") is not None:
                result = child.run(step["code"])
                if result.host_error:
                    raise CodetoolError(f"rebuilding node {node_id}'s state failed: {result.host_error}")
            states[node_id] = child
        return states[node_id]

    try:
        for node_id in open_nodes(nodes):
            path, at = [], node_id
            while at is not None:
                path.append(steps[at] if at in steps else {})
                at = nodes[at].get("parent")
            frontier.append(FrontierNode(tree, node_id, state_of(node_id).fork(), path[::-1],
                                         int(nodes[node_id].get("depth", node_id.count("-") + 1))))
    except BaseException:
        for n in frontier:
            n.state.close()
        raise
    finally:
        for state in states.values():
            state.close()
    return frontier
