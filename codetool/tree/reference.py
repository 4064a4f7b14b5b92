"""The public CodeTool code's labels of an action tree (``trees.label_rule: reference``).

The public code labels its trees in four steps, each reproduced here on a codetool tree record:

1. :func:`layout`: the tree as its generator (``DataProcess.recursive_generation``,
   ``src/data_process.py``) records it: one path per node, depth first, named ``1-`` plus our id
   (our ``2-1`` is its ``1-2-1``), with its ``content`` (the replies on the path, each followed by
   ``[Step d Finished]`` and a newline), ``is_leaf`` and the program it runs
   (:mod:`codetool.search.reference`). A reply without a ```` ```python ```` block is a leaf with
   status 0 whose content is its parent's, and its own reply is its output. Our nodes below a
   reply that has no such block or says ``[All Finished]`` are not in the layout (the generator
   never expands those); a node we did not expand (a ``finish`` whose text does not say
   ``[All Finished]``, or ``failure_policy: stop``) is a leaf here, where the generator would
   have gone on.
2. the status of each path: :class:`~codetool.search.reference.ReferenceRunner` re-runs its
   program (0 ran, 1 raised, 2 printed ``Function executing from``). Runs are cached in the
   record (``reference_runs``, by the program's SHA-256), so a relabel needs no sandbox.
3. :func:`score`: ``score_path`` (``src/run_rapid.py``): ``current_exec`` (status 0), and over the
   leaves found by a string prefix test on path names, ``soft_estimate`` (share with status 0),
   ``hard_estimate`` (any), ``tau`` (their summed depth below the node) and
   ``latent_reward = 0.9 ** (1 - soft) * 0.95 ** (tau / 20)``.
4. :func:`pair` and :func:`sft_rows`: ``get_pair_data`` keeps, for every path whose name does
   not end in ``2``, the pair with the sibling whose name ends in ``2`` instead, when their
   ``current_exec``, ``hard_estimate`` or ``latent_reward`` differ; ``get_sft_data``
   (``src/rm_generative_data.py``) then writes two rows per pair, ``yes`` for the one that ran
   when exactly one did, else ``yes`` only for a strictly greater hard or soft estimate (so a
   pair kept for its latent reward alone gives two ``no`` rows). The human turn of a row is the
   path's content after its parent's ``[Step d-1 Finished]``; a path whose content lacks that
   marker gives no row.

Quirks reproduced on purpose (docs/FIDELITY.md): pairs are x-1/x-2 and x-3/x-2 only (x-1 and x-3
never meet; with ten or more children the string arithmetic pairs wrongly, as there);
replies without code are successful leaves with an empty human turn; a failure outside a print
fails every descendant. ``generator=True`` also reproduces the generator's history bookkeeping
after a reply without code (it pops one history entry too many and returns): that reply's later
siblings are never recorded, and every node recorded after it in the same first-step subtree
loses one ancestor step from its content and program (README of ``shared/conformance`` §1.5.5).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from codetool import CodetoolError
from codetool.search.reference import (
    STATUS_OK,
    ReferenceRunner,
    python_blocks,
    reference_output,
    step_program,
    strip_prints,
)
from codetool.tree.labels import children_of, pair_counts, path_to

ALL_FINISHED = "[All Finished]"


def finished_marker(depth: int) -> str:
    """The stop word the public code appends to a depth-``depth`` reply: ``[Step d Finished]``."""
    return f"[Step {depth} Finished]"


@dataclass
class ReferencePath:
    """One entry of the public code's ``infer_path`` (with its ``exec_res`` and score).

    Args:
        name (`str`): its path name (``1-2-1``).
        node (`str`): our node id (``2-1``).
        content (`str`): the replies on its path with their stop words.
        is_leaf (`bool`): a leaf of the public code's tree.
        program (`str` or `None`): what it runs; ``None`` for a reply without code.
        code (`str`): ``exec_res.code``: the print-stripped first blocks of its path.
        status (`int`), res (`str`): ``exec_res.status`` and ``exec_res.res``.
        current_exec, soft_estimate, hard_estimate, tau, leaves, latent_reward: ``score_path``'s
            values (``tau`` and ``leaves`` are its locals; ``leaves`` as our ids).
    """

    name: str
    node: str
    content: str
    is_leaf: bool
    program: str | None
    code: str
    status: int | None = None
    res: str = ""
    current_exec: bool = False
    soft_estimate: float | None = None
    hard_estimate: int | None = None
    tau: int = 0
    leaves: list[str] = field(default_factory=list)
    latent_reward: float | None = None


def layout(nodes: dict[str, dict], *, generator: bool = False) -> list[ReferencePath]:
    """The public code's paths of a tree (see the module docstring), depth first.

    Args:
        nodes (`dict[str, dict]`): a tree record's ``nodes`` (``text`` and ``parent`` are read).
        generator (`bool`, *optional*, defaults to `False`): keep the generator's bookkeeping after
            a reply without code (module docstring); ``False`` lays out every node it reaches.
    """
    kids = children_of(nodes)
    paths: list[ReferencePath] = []
    replies: list[str] = []   # the generator's history of replies (with stop words)
    codes: list[str] = []     # and of print-stripped first blocks

    def expand(parent: str | None, depth: int) -> None:
        for node_id in kids.get(parent, []):
            text = nodes[node_id].get("text") or ""
            name = f"1-{node_id}"
            blocks = python_blocks(text)
            if not blocks:
                paths.append(ReferencePath(name, node_id, "".join(replies), True, None, "\n".join(codes), res=text))
                if generator:
                    if replies:
                        replies.pop()
                    if codes:
                        codes.pop()
                    return
                continue
            program = step_program(codes, blocks)
            codes.append(strip_prints(blocks[0]))
            replies.append(text + finished_marker(depth) + "\n")
            done = ALL_FINISHED in text
            paths.append(ReferencePath(name, node_id, "".join(replies), done or not kids.get(node_id), program,
                                       "\n".join(codes)))
            if not done:
                expand(node_id, depth + 1)
            if replies:
                replies.pop()
            if codes:
                codes.pop()

    expand(None, 1)
    return paths


def program_key(program: str) -> str:
    """The key of a program in a record's ``reference_runs``."""
    return hashlib.sha256(program.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def run_paths(paths: list[ReferencePath], runs: dict[str, list], runner: ReferenceRunner | None) -> int:
    """Set ``status`` and ``res`` of every path: a reply without code is 0 with its text; a program
    comes from ``runs`` (``key -> [status, res]``, updated) or is run by ``runner``. Returns the
    number of programs run.

    Raises:
        CodetoolError: a program is not in ``runs`` and no ``runner`` was given.
    """
    ran = 0
    for path in paths:
        if path.program is None:
            path.status = STATUS_OK
            continue
        key = program_key(path.program)
        if key not in runs:
            if runner is None:
                raise CodetoolError(f"node {path.node}: its reference status is not in the tree record; build or "
                                    "relabel the trees with label_rule reference while the tools are reachable "
                                    "(codetool build-trees --relabel re-runs the programs).")
            outcome = runner.run(path.program)
            runs[key] = [outcome.status, outcome.res]
            ran += 1
        path.status, path.res = int(runs[key][0]), str(runs[key][1])
    return ran


def score(paths: list[ReferencePath], *, alpha: float = 0.9, beta: float = 0.95, max_len: float = 20) -> None:
    """``score_path``: fill ``current_exec``, ``leaves``, ``soft_estimate``, ``hard_estimate``,
    ``tau`` and ``latent_reward`` of every path (statuses set).

    Raises:
        CodetoolError: a path that is not a leaf has no leaf below it (the public code stops there).
    """
    leaves = [p for p in paths if p.is_leaf]
    for path in paths:
        below = [leaf for leaf in leaves if leaf.name.startswith(path.name)]
        if not below:
            raise CodetoolError(f"node {path.node}: no leaf below it in the reference layout.")
        wins = sum(leaf.status == STATUS_OK for leaf in below)
        path.current_exec = path.status == STATUS_OK
        path.leaves = [leaf.node for leaf in below]
        path.tau = sum(leaf.name.count("-") for leaf in below) - path.name.count("-") * len(below)
        path.soft_estimate = wins / len(below)
        path.hard_estimate = 1 if wins else 0
        path.latent_reward = alpha ** (1 - path.soft_estimate) * (beta ** (path.tau / max_len))


def pair(paths: list[ReferencePath]) -> list[tuple[int, int]]:
    """``get_pair_data``: index pairs ``(first, second)`` into ``paths`` (module docstring)."""
    by_name = {p.name: i for i, p in enumerate(paths)}
    pairs = []
    for i, path in enumerate(paths):
        if path.name.endswith("2"):
            continue
        j = by_name.get(path.name[:-1] + "2")
        if j is None:
            continue
        other = paths[j]
        if (path.current_exec != other.current_exec or path.hard_estimate != other.hard_estimate
                or path.latent_reward != other.latent_reward):
            pairs.append((i, j))
    return pairs


@dataclass
class ReferenceRow:
    """One row ``get_sft_data`` writes.

    Args:
        pair (`int`): index into the pairs; node (`str`): our id of the path it is about.
        label (`int`): 1 for ``yes``, 0 for ``no``.
        human (`str`): the human turn (the step's text with its stop word).
        previous (`str`): the earlier steps' text up to the parent's stop word (empty at depth 1).
        parent_res (`str`): the parent's output (``exec_res`` of the parent; empty at depth 1).
    """

    pair: int
    node: str
    label: int
    human: str
    previous: str = ""
    parent_res: str = ""


def _estimates(path: ReferencePath) -> tuple[int, float]:
    """``(hard_estimate, soft_estimate)`` of a path that ``score_path`` filled."""
    assert path.hard_estimate is not None and path.soft_estimate is not None, "score_path first"
    return path.hard_estimate, path.soft_estimate


def sft_rows(paths: list[ReferencePath], pairs: list[tuple[int, int]]) -> list[ReferenceRow]:
    """``get_sft_data``: the rows of ``pairs`` in order (module docstring)."""
    by_name = {p.name: p for p in paths}
    rows = []
    for k, (i, j) in enumerate(pairs):
        both = (paths[i], paths[j])
        depth = both[0].name.count("-")
        for a in (0, 1):
            me, other = both[a], both[1 - a]
            if me.current_exec == other.current_exec:
                (my_hard, my_soft), (their_hard, their_soft) = _estimates(me), _estimates(other)
                yes = my_hard > their_hard or my_soft > their_soft
            else:
                yes = me.current_exec
            if depth == 1:
                rows.append(ReferenceRow(k, me.node, int(yes), me.content))
                continue
            marker = finished_marker(depth - 1)
            if marker not in me.content:
                continue
            parts = me.content.split(marker)
            parent = by_name.get(me.name[:-2])
            rows.append(ReferenceRow(k, me.node, int(yes), parts[1], parts[0] + marker,
                                     parent.res if parent is not None else ""))
    return rows


def decided_by(a: ReferencePath, b: ReferencePath) -> str:
    """What kept a pair: ``executability``, ``success_share`` (labels differ) or ``latent_reward``
    (two ``no`` rows)."""
    if a.current_exec != b.current_exec:
        return "executability"
    if a.hard_estimate != b.hard_estimate or a.soft_estimate != b.soft_estimate:
        return "success_share"
    return "latent_reward"


def label_reference(record: dict[str, Any], runner: ReferenceRunner | None = None, *, generator: bool = False,
                    alpha: float = 0.9, beta: float = 0.95, max_len: float = 20.0) -> dict:
    """Label ``record`` as the public code would (module docstring), in place.

    Sets ``record["pairs"]`` (``[first, second]`` node ids, in the public code's order: *not*
    better/worse), ``record["reference"]`` (``nodes``: the layout's values per node; ``rows``: the
    rows with ``label`` 1/0, ``step_text``, ``previous_steps``, ``parent_result``) and the run cache
    ``record["reference_runs"]``.

    Args:
        runner (`ReferenceRunner`, *optional*): runs the programs not yet in the cache.
        generator (`bool`, *optional*): the generator's bookkeeping (:func:`layout`).
    Returns:
        The pair counts (``codetool.tree.labels.pair_counts``): kept pairs by what kept them,
        ``dropped["tie"]``: pairs examined and not kept.
    """
    paths = layout(record["nodes"], generator=generator)
    run_paths(paths, record.setdefault("reference_runs", {}), runner)
    score(paths, alpha=alpha, beta=beta, max_len=max_len)
    pairs = pair(paths)
    rows = sft_rows(paths, pairs)
    counts = pair_counts()
    for i, j in pairs:
        counts["decided"][decided_by(paths[i], paths[j])] += 1
    names = {p.name for p in paths}
    examined = sum(1 for p in paths if not p.name.endswith("2") and p.name[:-1] + "2" in names)
    counts["dropped"]["tie"] = examined - len(pairs)
    record["pairs"] = [[paths[i].node, paths[j].node] for i, j in pairs]
    record["reference"] = {
        "generator": generator,
        "nodes": {p.node: {"name": p.name, "status": p.status, "res": p.res, "is_leaf": p.is_leaf,
                           "current_exec": p.current_exec, "soft_estimate": p.soft_estimate,
                           "hard_estimate": p.hard_estimate, "tau": p.tau, "leaves": p.leaves,
                           "latent_reward": p.latent_reward, "content": p.content} for p in paths},
        "rows": [{"pair": r.pair, "node": r.node, "label": r.label, "step_text": r.human,
                  "previous_steps": r.previous, "parent_result": r.parent_res} for r in rows]}
    return counts


class LazyRunner:
    """A :class:`ReferenceRunner` started on its first :meth:`run` (a relabel whose runs are all
    cached starts no sandbox).

    Args:
        start (`Callable[[], ReferenceRunner]` or `None`): makes the runner; ``None``: runs are
            refused with a one-line error (the tree's query is unknown).
    """

    def __init__(self, start):
        self._start, self._runner = start, None

    def run(self, program: str):
        if self._runner is None:
            if self._start is None:
                raise CodetoolError("a reference status is missing from the tree record and its query is not "
                                    "among --queries, so its program cannot be re-run; pass the queries the "
                                    "trees were built from.")
            self._runner = self._start()
        return self._runner.run(program)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()

    def __enter__(self) -> LazyRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reference_runner(task, make_executor) -> ReferenceRunner:
    """A :class:`ReferenceRunner` on ``task``'s tools (``make_executor``: ``task -> Executor``)."""
    return ReferenceRunner.for_task(task, make_executor)


def interface_fields(record: dict[str, Any], node_id: str) -> dict[str, str]:
    """What the reference PRM interface shows for ``node_id`` (``prm.format.interface:
    reference``): ``step_text`` (its reply and stop word; after a newline below depth 1, as the
    public rows split it), ``previous_steps`` (the replies above it with their stop words) and
    ``parent_result`` (the parent's reference output where the record has it, else our run's
    output in that form)."""
    nodes = record["nodes"]
    path = path_to(nodes, node_id)
    depth = len(path)
    previous = "".join((nodes[n].get("text") or "") + finished_marker(d) + "\n" for d, n in enumerate(path[:-1], 1))
    node = nodes[node_id]
    own = (node.get("text") or "") + finished_marker(depth) + "\n" if python_blocks(node.get("text")) else ""
    parent_result = ""
    if depth > 1:
        parent = path[-2]
        ref = (record.get("reference") or {}).get("nodes", {}).get(parent)
        parent_result = ref["res"] if ref is not None else reference_output(_result(nodes[parent]))
    return {"step_text": own if depth == 1 else "\n" + own, "previous_steps": previous,
            "parent_result": parent_result}


def _result(node: dict):
    from codetool.executor.result import ExecutionResult

    data = node.get("result")
    return ExecutionResult.from_dict(data) if isinstance(data, dict) else None
