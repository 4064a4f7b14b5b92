"""Prefix-shared packing: each shared prefix once, its suffixes after it, one forward per batch.

The rows of a PRM batch (training) or of one scorer call share long prompt prefixes: the query and
tool prompt of one query, the history of sibling candidates. :func:`plan_groups` finds, among the
rows, groups with a common prefix of at least ``min_shared`` tokens (sorted rows, adjacent
common-prefix lengths, and a split wherever splitting computes fewer positions);
:func:`pack_rows` lays each group out as ``prefix, suffix_1, suffix_2, ...`` in a packed row with

- a block attention mask: a prefix token sees the earlier prefix tokens, a suffix token sees the
  whole prefix and the earlier tokens of its own suffix, never a sibling suffix or another group;
- position ids that restart at 0 for each group and continue from the prefix in each suffix.

So every row's last hidden state equals that of its own unshared causal forward (to float
rounding; tested in fp32 on Qwen2- and Llama-shaped models), gradients included, while ``k``
candidates after a ``P``-token prefix cost ``P + k*S`` positions instead of ``k*(P + S)``. It is
one forward call, so it suits GPUs (few kernel launches), gradient checkpointing and FSDP.

The mask is 4D, which transformers (5.x, ``masking_utils._preprocess_mask_arguments``) passes to
the attention as-is: boolean (True: attend) for ``sdpa``, additive (0 or the dtype's minimum) for
``eager``. FlashAttention-2 takes no 4D mask; callers use another sharing mode there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _common(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def plan_groups(rows: list[list[int]], min_shared: int = 16) -> list[tuple[int, list[int]]]:
    """Split row indices into groups that share a prefix.

    Args:
        rows (`list[list[int]]`): token ids of each row (the whole prompt up to its last position).
        min_shared (`int`, *optional*, defaults to 16): shorter common prefixes are not shared.
    Returns:
        ``[(prefix_length, [row indices])]`` covering every row once; ``prefix_length`` is 0 for
        rows computed alone, and always leaves each row at least its last token as suffix.
    """
    if not rows:
        return []
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    lcp = [_common(rows[a], rows[b], min(len(rows[a]), len(rows[b])) - 1) for a, b in zip(order, order[1:])]

    def best(lo: int, hi: int) -> tuple[int, list[tuple[int, list[int]]]]:
        members = order[lo:hi]
        alone = sum(len(rows[i]) for i in members)
        if hi - lo == 1:
            return alone, [(0, members)]
        shared = min(lcp[lo: hi - 1])
        cost, plan = alone, [(0, [i]) for i in members]
        if shared >= min_shared:
            cost, plan = alone - shared * (len(members) - 1), [(shared, members)]
        split_plan: list[tuple[int, list[int]]] = []
        split_cost, start = 0, lo  # split where the common prefix is shortest
        for k in range(lo, hi - 1):
            if lcp[k] == shared:
                c, p = best(start, k + 1)
                split_cost, split_plan, start = split_cost + c, split_plan + p, k + 1
        c, p = best(start, hi)
        if start > lo and split_cost + c < cost:
            return split_cost + c, split_plan + p
        return cost, plan

    return best(0, len(rows))[1]


@dataclass
class PackedBatch:
    """Model inputs of packed rows: ``input_ids`` and ``position_ids`` (batch, width) long,
    ``attention_mask`` (batch, 1, width, width) bool (True: attend) or additive float, and
    ``gather`` (n, 2): (packed row, position) of each original row's last token, in input order."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    gather: torch.Tensor

    @property
    def positions(self) -> int:
        """Token positions computed (width x packed rows, padding included)."""
        return int(self.input_ids.numel())


def pack_rows(rows: list[list[int]], *, min_shared: int = 16, max_tokens: int = 4096, pad_id: int = 0,
              device: torch.device | str = "cpu", mask_dtype: torch.dtype | None = None) -> PackedBatch:
    """Pack ``rows`` (see the module docstring) into as few packed rows as ``max_tokens`` allows.

    Args:
        rows (`list[list[int]]`): token ids of each row, up to and including the position whose
            hidden state is wanted (the one before the label token).
        min_shared (`int`, *optional*, defaults to 16): see :func:`plan_groups`.
        max_tokens (`int`, *optional*, defaults to 4096): packed row width bound (attention is
            quadratic in it); a group longer than that gets a packed row of its own.
        pad_id (`int`, *optional*, defaults to 0): id of the padding after shorter packed rows.
        device: where the tensors are built.
        mask_dtype (`torch.dtype`, *optional*): `None` for a boolean mask (``sdpa``), else an
            additive mask in that dtype (``eager``: the model's compute dtype).
    """
    groups = plan_groups(rows, min_shared)
    packed: list[list[tuple[int, int, int]]] = []  # per packed row: (row index, start, end) pieces
    widths: list[int] = []
    for shared, members in groups:
        size = shared + sum(len(rows[i]) - shared for i in members)
        if not packed or widths[-1] + size > max_tokens:
            packed.append([])
            widths.append(0)
        packed[-1].append((-1, shared, len(members)))  # a group header: prefix length, member count
        packed[-1].extend((i, shared, len(rows[i])) for i in members)
        widths[-1] += size
    width = max(widths)
    ids, pos, group, segment = ([[fill] * width for _ in packed] for fill in (pad_id, 0, -1, -2))
    gather = [[0, 0] for _ in rows]
    for b, pieces in enumerate(packed):
        at, g = 0, -1
        for k, (i, start, end) in enumerate(pieces):
            if i == -1:  # group header: lay the prefix out once (from the next piece's row)
                g += 1
                i, start, end, k = pieces[k + 1][0], 0, start, -1
            n = end - start
            ids[b][at: at + n] = rows[i][start:end]
            pos[b][at: at + n] = range(start, end)
            group[b][at: at + n], segment[b][at: at + n] = [g] * n, [k] * n
            if k >= 0:
                gather[i] = [b, at + n - 1]
            at += n
        pos[b][at:] = range(width - at)
    group_t = torch.tensor(group, device=device)  # the (batch, width, width) mask is built on the device
    segment_t = torch.tensor(segment, device=device)
    index = torch.arange(width, device=device)
    allowed = ((group_t[:, :, None] == group_t[:, None, :]) & (index[None, None, :] <= index[None, :, None])
               & ((segment_t[:, None, :] == -1) | (segment_t[:, None, :] == segment_t[:, :, None])))
    allowed |= (index[:, None] == index[None, :])[None]  # padding sees itself: no fully masked row
    mask = allowed[:, None]
    if mask_dtype is not None:
        mask = torch.zeros(mask.shape, dtype=mask_dtype, device=device).masked_fill(~mask, torch.finfo(mask_dtype).min)
    return PackedBatch(torch.tensor(ids, device=device), torch.tensor(pos, device=device), mask,
                       torch.tensor(gather, device=device))
