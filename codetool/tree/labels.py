"""Labels of an action tree: LR, tau, latent reward, and sibling pairs (CodeTool §3.2).

A tree is a dict ``node_id -> node`` with ids ``1``, ``1-2``, ``1-2-1``... (the children of the
query are ``1..b``; ``1-2`` is the second child of ``1``). A node record holds at least
``parent`` (``None`` for a first step), ``leaf`` (bool), ``success`` (bool, for leaves) and
``ok`` (whether its code executed). :func:`label_tree` adds, per node:

- ``lr_soft``: share of successful leaves in its subtree (a leaf: 1.0 or 0.0);
- ``lr_hard``: 1.0 if any leaf below succeeded;
- ``tau``: steps from the node to its leaves, averaged (default) or summed over the leaves
  (the public CodeTool code used the sum; field case tau-definition);
- ``latent_reward``: ``alpha^(1 - lr_soft) * beta^(tau / L)``.

:func:`leaf_success` decides whether a leaf succeeded (``trees.success``) and
:func:`sibling_pairs` turns siblings into PRM labels (``trees.label_rule``): under both of its rules
the sibling whose code ran (in its own fork: ``ok``) beats one whose code failed; then ``ours``
(our default: the public code's comparison without its quirks) compares success only (hard,
then soft LR) and ``latent`` (the paper's wording) compares the latent reward. Every pair of
siblings is compared. Pairs are counted by what decided them, drops by reason (docs/FIDELITY.md).
``label_rule: reference`` (the public code's rows exactly, its notion of a failed step included)
is :mod:`codetool.tree.reference`.

A node whose code was **not executed** (:func:`node_executed` is false: the executor could not run it
for a reason outside the code, after its retries; ``codetool.rewards.not_executed``) is a leaf that
says nothing: it is left out of its ancestors' leaves (LR, tau), its own LR and latent reward are
``None``, and every pair it is in is dropped (``not_executed``), as is every pair of a node none of
whose leaves ran. It never loses a pair for the machine's failure.
"""

from __future__ import annotations

from itertools import combinations

from codetool.executor.result import ToolCall
from codetool.rewards import grounded_success, latent_reward, not_executed
from codetool.text import step_key


def children_of(tree: dict[str, dict]) -> dict[str | None, list[str]]:
    """``parent id -> child ids`` in sibling order (``None`` holds the first steps)."""
    kids: dict[str | None, list[str]] = {}
    for node_id in sorted(tree, key=_order):
        kids.setdefault(tree[node_id].get("parent"), []).append(node_id)
    return kids


def _order(node_id: str) -> tuple[int, ...]:
    return tuple(int(x) for x in node_id.split("-"))


def label_tree(tree: dict[str, dict], *, alpha: float = 0.9, beta: float = 0.95, max_len: float = 20.0,
               tau_mode: str = "mean") -> dict[str, dict]:
    """Add ``lr_soft``, ``lr_hard``, ``tau``, ``n_leaves`` and ``latent_reward`` to every node.

    Args:
        tree (`dict[str, dict]`): nodes by id (see module docstring); modified in place.
        tau_mode (`str`, *optional*, defaults to ``"mean"``): ``mean`` or ``sum`` of the leaf depths.
    Returns:
        The same dict.
    Raises:
        ValueError: on an unknown ``tau_mode`` or an internal node without children.
    """
    if tau_mode not in ("mean", "sum"):
        raise ValueError(f"tau_mode must be 'mean' or 'sum', got {tau_mode!r}.")
    kids = children_of(tree)

    def leaf_stats(node_id: str) -> list[tuple[bool, int]]:
        """(success, depth below node_id) of every leaf in the subtree that was executed."""
        node = tree[node_id]
        if not node_executed(node):
            return []
        if node.get("leaf"):
            return [(bool(node.get("success")), 0)]
        below = kids.get(node_id, [])
        if not below:
            raise ValueError(f"node {node_id} is not a leaf but has no children.")
        return [(ok, depth + 1) for child in below for ok, depth in leaf_stats(child)]

    for node_id, node in tree.items():
        leaves = leaf_stats(node_id)
        node["n_leaves"] = len(leaves)
        if not leaves:  # not executed, or nothing below it ran: no information
            node.update(lr_soft=None, lr_hard=None, tau=None, latent_reward=None)
            continue
        wins = sum(ok for ok, _ in leaves)
        depths = [d for _, d in leaves]
        node["lr_soft"] = wins / len(leaves)
        node["lr_hard"] = 1.0 if wins else 0.0
        node["tau"] = (sum(depths) / len(depths)) if tau_mode == "mean" else float(sum(depths))
        node["latent_reward"] = latent_reward(node["lr_soft"], node["tau"], alpha=alpha, beta=beta,
                                              max_len=max_len)
    return tree


LABEL_RULES = ("ours", "latent", "reference")
PAIR_RULES = ("ours", "latent")  # the rules of sibling_pairs; reference is codetool.tree.reference
SUCCESS_MODES = ("executed", "grounded", "judged", "answer")
DECIDED_BY = ("executability", "success_share", "latent_reward")
DROPPED_FOR = ("no_success_difference", "both_failed", "tie", "not_executed", "same_step")


def pair_counts() -> dict[str, dict[str, int]]:
    """Empty counters: ``{"decided": {reason: 0, ...}, "dropped": {reason: 0, ...}}``."""
    return {"decided": dict.fromkeys(DECIDED_BY, 0), "dropped": dict.fromkeys(DROPPED_FOR, 0)}


def sibling_pairs(tree: dict[str, dict], rule: str = "ours") -> tuple[list[tuple[str, str]], dict]:
    """Ordered ``(more promising, less promising)`` node-id pairs over all sibling groups.

    A pair with a sibling that was not executed, or none of whose leaves was, is dropped
    (``not_executed``), and so is a pair of **the same step** (``same_step``: the same code,
    whitespace aside, with the same observation; :func:`same_step`): the PRM would read one input
    under both labels, and the difference in their subtrees is the later steps' sampling, not this
    step's promise. Both rules then look at executability first: a sibling whose own code ran
    (``ok``) beats one whose code failed. Then:

    - ``ours`` (the public CodeTool code's comparison): the sibling with the strictly greater hard
      LR, or else the strictly greater soft LR, wins ("success share"). A pair with no success
      difference is dropped (``no_success_difference``): tau never decides a label.
    - ``latent`` (the paper's wording): the higher ``latent_reward`` wins, with one guard: two
      siblings that both have LR 0 (and ran alike) are dropped (``both_failed``), since tau alone
      says nothing about promise. Exact ties are dropped (``tie``).

    Args:
        tree (`dict[str, dict]`): nodes labelled by :func:`label_tree`.
        rule (`str`, *optional*, defaults to ``"ours"``): ``ours`` or ``latent``.
    Returns:
        ``(pairs, counts)``; ``counts`` as from :func:`pair_counts`: pairs by what decided them
        (``executability``, ``success_share``, ``latent_reward``) and drops by reason.
    Raises:
        ValueError: on an unknown rule.
    """
    if rule not in PAIR_RULES:
        raise ValueError(f"label rule must be one of {PAIR_RULES} here (reference: codetool.tree.reference), "
                         f"got {rule!r}.")
    pairs, counts = [], pair_counts()
    for siblings in children_of(tree).values():
        for a, b in combinations(siblings, 2):
            winner, reason = _compare(tree[a], tree[b], rule)
            if winner is None:
                counts["dropped"][reason] += 1
                continue
            pairs.append((a, b) if winner == 0 else (b, a))
            counts["decided"][reason] += 1
    return pairs, counts


def same_step(na: dict, nb: dict) -> bool:
    """Whether two sibling nodes are the same step as the PRM reads it: equal code and equal reply
    text (which holds a plan where the step format has one), each line's trailing whitespace and
    blank lines at either end aside, and equal observation. A policy that samples the same call twice
    gives two such children. Nodes that record no reply at all (hand-built trees) never are."""
    reply = [(step_key(n.get("code")), step_key(n.get("text")), n.get("observation") or "") for n in (na, nb)]
    return any(reply[0][:2]) and reply[0] == reply[1]


def node_executed(node: dict) -> bool:
    """Whether a node's code ran (``executed``, or for records written before that key, what its
    ``result`` says: ``codetool.rewards.not_executed``)."""
    if "executed" in node:
        return bool(node["executed"])
    return not not_executed(node.get("result"))


def _compare(na: dict, nb: dict, rule: str) -> tuple[int | None, str]:
    """``(0 or 1, reason)`` for the winning sibling, or ``(None, drop reason)``."""
    if na.get("lr_soft") is None or nb.get("lr_soft") is None:  # not executed, or nothing below it ran
        return None, "not_executed"
    if same_step(na, nb):
        return None, "same_step"
    if bool(na.get("ok")) != bool(nb.get("ok")):
        return (0 if na.get("ok") else 1), "executability"
    if rule == "ours":
        for key in ("lr_hard", "lr_soft"):
            if na[key] != nb[key]:
                return (0 if na[key] > nb[key] else 1), "success_share"
        return None, "no_success_difference"
    if na["lr_soft"] == 0.0 and nb["lr_soft"] == 0.0:
        return None, "both_failed"
    if na["latent_reward"] == nb["latent_reward"]:
        return None, "tie"
    return (0 if na["latent_reward"] > nb["latent_reward"] else 1), "latent_reward"


def add_counts(total: dict, counts: dict) -> dict:
    """Add the pair ``counts`` of one tree into ``total`` (both as from :func:`pair_counts`)."""
    for part in ("decided", "dropped"):
        for reason, n in counts.get(part, {}).items():
            total[part][reason] = total[part].get(reason, 0) + n
    return total


def leaf_success(tree: dict[str, dict], node_id: str, mode: str, *, tool_names=None, query: str | None = None,
                 answer_key=None) -> bool | None:
    """Whether the leaf ``node_id`` succeeded, for the modes ``executed``, ``grounded`` and ``answer``.

    - ``executed`` (the public CodeTool code): every step on the path ran without an exception or
      a tool error (each node's ``ok``).
    - ``grounded`` (our default): the leaf ended in ``finish``, from a step that ran to its end, with
      a non-empty answer that uses what a successful call of a listed tool on the path returned
      (``codetool.rewards.grounded_success``). A finish without a
      tool call is never a success on a query that offers tools; on a query without tools a
      non-empty finish suffices.
    - ``judged`` is ``grounded`` plus a judge's verdict; the caller adds the verdict.
    - ``answer`` (the synthetic world, issue 41): the leaf ended in ``finish`` with an answer that
      the query's answer key accepts (:func:`codetool.world.check_answer`: the right value and no
      competing one).

    A leaf that was not executed has no success (``None``).

    Args:
        tree (`dict[str, dict]`): nodes with ``ok``, ``ended``, ``final_answer`` and ``result``
            (its ``tool_calls``, each with ``name``, ``status``, ``response`` and ``arguments``).
        tool_names (`Collection[str]`, *optional*): the functions the query offers; ``None``
            counts any recorded call as listed (the executor records only tool functions).
        query (`str`, *optional*): the query (its words do not ground an answer).
        answer_key (`dict`, *optional*): the query's answer key (mode ``answer``).
    Raises:
        ValueError: on an unknown mode, or mode ``answer`` without an answer key.
    """
    if mode not in SUCCESS_MODES:
        raise ValueError(f"success mode must be one of {SUCCESS_MODES}, got {mode!r}.")
    if mode == "answer" and not answer_key:
        raise ValueError("success mode 'answer' needs the query's answer key; only the synthetic world's "
                         "queries carry one (trees.queries world:train).")
    path = path_to(tree, node_id)
    if not node_executed(tree[node_id]):
        return None
    if mode == "answer":
        from codetool.world import check_answer

        node = tree[node_id]
        return node.get("ended") == "finish" and check_answer(answer_key, node.get("final_answer"))
    if mode == "executed":
        return all(bool(tree[n].get("ok")) for n in path)
    node = tree[node_id]
    if node.get("ended") != "finish" or not (node.get("result") or {}).get("ok", True):
        return False  # no answer, or one from a step that then failed (finish called from a __del__)
    calls = (ToolCall.from_dict(c) for n in path for c in (tree[n].get("result") or {}).get("tool_calls", []))
    return grounded_success(node.get("final_answer"), calls, tool_names, query=query)


def path_to(tree: dict[str, dict], node_id: str) -> list[str]:
    """Node ids from the first step down to ``node_id`` (inclusive)."""
    path = []
    current: str | None = node_id
    while current is not None:
        path.append(current)
        current = tree[current].get("parent")
    return path[::-1]
