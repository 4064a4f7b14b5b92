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

:func:`sibling_pairs` turns siblings into PRM labels: the executed sibling beats a failed one;
otherwise the higher latent reward is "more promising" (label 1) and the other "less
promising" (0); exact ties are dropped and counted.
"""

from __future__ import annotations

from itertools import combinations

from codetool.rewards import latent_reward


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
        """(success, depth below node_id) of every leaf in the subtree."""
        node = tree[node_id]
        if node.get("leaf"):
            return [(bool(node.get("success")), 0)]
        below = kids.get(node_id, [])
        if not below:
            raise ValueError(f"node {node_id} is not a leaf but has no children.")
        return [(ok, depth + 1) for child in below for ok, depth in leaf_stats(child)]

    for node_id, node in tree.items():
        leaves = leaf_stats(node_id)
        wins = sum(ok for ok, _ in leaves)
        depths = [d for _, d in leaves]
        node["n_leaves"] = len(leaves)
        node["lr_soft"] = wins / len(leaves)
        node["lr_hard"] = 1.0 if wins else 0.0
        node["tau"] = (sum(depths) / len(depths)) if tau_mode == "mean" else float(sum(depths))
        node["latent_reward"] = latent_reward(node["lr_soft"], node["tau"], alpha=alpha, beta=beta,
                                              max_len=max_len)
    return tree


def sibling_pairs(tree: dict[str, dict]) -> tuple[list[tuple[str, str]], int]:
    """Ordered ``(more promising, less promising)`` node-id pairs over all sibling groups.

    Executability decides first (a node whose code ran beats one whose code failed); otherwise the
    higher ``latent_reward`` wins. Returns the pairs and the number of exact ties dropped.
    Requires :func:`label_tree` to have run.
    """
    pairs, ties = [], 0
    for siblings in children_of(tree).values():
        for a, b in combinations(siblings, 2):
            na, nb = tree[a], tree[b]
            if bool(na.get("ok")) != bool(nb.get("ok")):
                pairs.append((a, b) if na.get("ok") else (b, a))
            elif na["latent_reward"] > nb["latent_reward"]:
                pairs.append((a, b))
            elif nb["latent_reward"] > na["latent_reward"]:
                pairs.append((b, a))
            else:
                ties += 1
    return pairs, ties


def path_to(tree: dict[str, dict], node_id: str) -> list[str]:
    """Node ids from the first step down to ``node_id`` (inclusive)."""
    path = []
    current: str | None = node_id
    while current is not None:
        path.append(current)
        current = tree[current].get("parent")
    return path[::-1]
