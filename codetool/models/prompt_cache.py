"""Prompt KV caches kept across ``generate`` calls, found by token prefix (prefix caching on CPU).

A search asks the policy again and again for prompts that begin like earlier ones: step t+1 of an
episode is step t's prompt plus one reply and one observation; every method and search seed of a
comparison opens each query with the same first prompt; a tree's children extend their parent's
prompt; and every RestBench-TMDB prompt starts with the same 54 functions. vLLM and SGLang skip
the prefill of such prefixes on GPUs (automatic prefix caching, RadixAttention); a local
transformers model on a CPU pays for each prefilled token (a 135M model prefills a few hundred
tokens per second on 2 cores), so :class:`~codetool.models.transformers_backend.TransformersBackend`
keeps the KV cache of each prompt it ran here and starts later prompts from the longest stored
prefix.

An entry holds, per layer, the keys and values of one prompt's tokens (no padding):
``(kv_heads, length, head_dim)`` tensors on the model's device and in its dtype. Entries are
evicted least-recently-used first once their bytes exceed the budget; a hit counts as a use.
Only plain full-attention caches are stored (``DynamicLayer``); a model whose cache is anything
else (sliding windows, linear attention) is prefilled as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class PromptKV:
    """The KV cache of one prompt prefix.

    Args:
        keys, values (`list[torch.Tensor]`): per layer, ``(kv_heads, length, head_dim)``.
    """

    keys: list[Any]
    values: list[Any]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class PromptCache:
    """Least-recently-used store of :class:`PromptKV` by token ids, bounded in bytes.

    Args:
        max_bytes (`int`): the most bytes kept; 0 turns the cache off (nothing is stored).

    Counters ``hit_tokens`` and ``miss_tokens`` say how many prompt tokens were found here and how
    many had to be computed (see :meth:`note`).
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}.")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], PromptKV] = OrderedDict()
        self._bytes = 0
        self.hit_tokens = 0
        self.miss_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def longest(self, row: list[int], limit: int) -> tuple[int, PromptKV | None]:
        """The longest stored prefix of ``row`` with at most ``limit`` tokens: ``(length, entry)``,
        ``(0, None)`` when none is stored. A hit becomes the most recently used entry."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            n = len(key)
            if n <= limit and (best is None or n > len(best)) and row[n - 1] == key[-1] \
                    and tuple(row[:n]) == key:
                best = key
        if best is None:
            return 0, None
        self._entries.move_to_end(best)
        return len(best), self._entries[best]

    def get(self, key: tuple[int, ...]) -> PromptKV | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple[int, ...], entry: PromptKV) -> None:
        """Store ``entry`` under ``key`` (replacing an older one), then evict down to the budget."""
        if not key or not self.max_bytes or entry.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[key] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes

    def note(self, hit: int, miss: int) -> None:
        """Count ``hit`` prompt tokens taken from here and ``miss`` computed."""
        self.hit_tokens += hit
        self.miss_tokens += miss

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
