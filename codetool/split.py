"""The one held-out split of the package: which query ids are kept out of PRM training.

Tree export (``codetool.tree.dataset``: ``validation.jsonl``), ``codetool train-prm`` (its eval
rows when no ``--eval_dataset`` is given) and ``codetool eval-prm`` (the held-out rows it rebuilds
from the checkpoint's ``split`` settings) all call :func:`heldout_query_ids`, so with the same
fraction and seed they hold out the same queries (issue 18). ``codetool train-probe`` and
``codetool eval-decision`` split the decide-first queries the same way (:func:`split_query_ids`).

The split is by query id, never by row, so no query leaks across it. Ids are ranked by
``sha256(f"{seed}:{query_id}")`` and the first ``k`` are held out, with
``k = round(n * fraction)`` clamped to ``[1, min(ceil(n * fraction), n - 1)]`` when
``fraction > 0`` and there are two or more ids (``0`` otherwise): a tiny dataset still holds out
one query, never more than ``ceil(n * fraction)``, and always keeps one for training. The ranking
depends on the id alone, so it is the same on every machine and in any row order; adding
queries moves a query into the held-out part only when it ranks above the cut.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable


def heldout_count(n: int, fraction: float) -> int:
    """How many of ``n`` distinct query ids are held out for ``fraction`` (see the module docstring).

    Example: ``heldout_count(10, 0.2) == 2``, ``heldout_count(2, 0.1) == 1``, ``heldout_count(1, 0.5) == 0``.
    """
    if fraction <= 0 or n < 2:
        return 0
    return max(1, min(round(n * fraction), math.ceil(n * fraction), n - 1))


def _rank(query_id: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}:{query_id}".encode()).digest()


def heldout_query_ids(query_ids: Iterable[str], fraction: float, seed: int = 0) -> set[str]:
    """The query ids held out for validation/evaluation.

    Args:
        query_ids (`Iterable[str]`): the ids of every row (repeats and order do not matter).
        fraction (`float`): the share of distinct ids to hold out, in ``[0, 1)``.
        seed (`int`, *optional*, defaults to 0): picks another, equally sized split.
    Returns:
        ``heldout_count(n, fraction)`` ids, those with the smallest ``sha256(f"{seed}:{id}")``.
    """
    ids = sorted({str(q) for q in query_ids})
    k = heldout_count(len(ids), fraction)
    return set(sorted(ids, key=lambda q: _rank(q, seed))[:k])


def split_query_ids(query_ids: Iterable[str], fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: the distinct ids in first-seen order, split by :func:`heldout_query_ids`."""
    ids = list(dict.fromkeys(str(q) for q in query_ids))
    held = heldout_query_ids(ids, fraction, seed)
    return [q for q in ids if q not in held], [q for q in ids if q in held]
