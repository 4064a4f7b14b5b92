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
``(kv_heads, length, head_dim)`` tensors on the model's device and in its dtype. An entry that
extends a stored one (step t+1 of an episode extends step t; a query's first prompt extends the
system prompt and tool list its batch shares) holds only its own tokens and points at that
``base``: an episode of s steps then holds its distinct tokens once, not s growing copies (with
copies, 24-48 queries of ~800 tokens in flight overflow the 1 GiB default within one method and
evict prefixes that the next step needs: docs/TESTBED.md 5.1). Eviction is a segmented LRU over entries
that no other entry extends (leaves; a base goes once its last extension has gone): a new entry
is on probation, one that served a later prompt is protected (at most ``protected_share`` of the
budget; the least recently used protected entry goes back to probation), and probation is emptied
first, least recently used first. The budget counts each entry's own tokens, so it bounds the
memory held. A search stores one entry per prompt, but only some are ever extended (a query's
first prompt is, by every method and seed; the last step's prompt is not): those stay, the others
make room.
Only plain full-attention caches are stored (``DynamicLayer``); a model whose cache is anything
else (sliding windows, linear attention) is prefilled as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class PromptKV:
    """The KV cache of one prompt prefix: its own tokens, after those of ``base``.

    Args:
        keys, values (`list[torch.Tensor]`): per layer, ``(kv_heads, own length, head_dim)``.
        base (`PromptKV`, *optional*): the entry this one extends (its tokens come first).
    """

    keys: list[Any]
    values: list[Any]
    base: PromptKV | None = None
    extensions: int = 0  # stored entries whose base this is (PromptCache keeps it)

    @property
    def nbytes(self) -> int:
        """Bytes of the entry's own tokens (a base's are counted once, in the base)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def length(self) -> int:
        """Tokens of the whole prefix, the base's included."""
        own = self.keys[0].shape[1] if self.keys else 0
        return own + (self.base.length if self.base is not None else 0)

    def parts(self) -> list[PromptKV]:
        """The chain from the first base to this entry, in token order."""
        chain: list[PromptKV] = []
        entry: PromptKV | None = self
        while entry is not None:
            chain.append(entry)
            entry = entry.base
        return chain[::-1]


class PromptCache:
    """Segmented-LRU store of :class:`PromptKV` by token ids, bounded in bytes.

    Args:
        max_bytes (`int`): the most bytes kept; 0 turns the cache off (nothing is stored).
        protected_share (`float`, *optional*, defaults to `0.8`): the most of ``max_bytes`` that
            entries which have served a later prompt may hold.

    Counters ``hit_tokens`` and ``miss_tokens`` say how many prompt tokens were found here and how
    many had to be computed (see :meth:`note`).
    """

    def __init__(self, max_bytes: int, protected_share: float = 0.8):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}.")
        if not 0 <= protected_share <= 1:
            raise ValueError(f"protected_share must be in [0, 1], got {protected_share}.")
        self.max_bytes, self.protected_share = max_bytes, protected_share
        self._probation: OrderedDict[tuple[int, ...], PromptKV] = OrderedDict()
        self._protected: OrderedDict[tuple[int, ...], PromptKV] = OrderedDict()
        self._bytes = {"probation": 0, "protected": 0}
        self.hit_tokens = 0
        self.miss_tokens = 0

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    @property
    def nbytes(self) -> int:
        return self._bytes["probation"] + self._bytes["protected"]

    def longest(self, row: list[int], limit: int) -> tuple[int, PromptKV | None]:
        """The longest stored prefix of ``row`` with at most ``limit`` tokens: ``(length, entry)``,
        ``(0, None)`` when none is stored. A hit is protected and becomes the most recently used."""
        best: tuple[int, ...] | None = None
        for key in (*self._protected, *self._probation):
            n = len(key)
            if n <= limit and (best is None or n > len(best)) and row[n - 1] == key[-1] \
                    and tuple(row[:n]) == key:
                best = key
        if best is None:
            return 0, None
        return len(best), self._use(best)

    def get(self, key: tuple[int, ...]) -> PromptKV | None:
        """The entry stored under exactly ``key`` (a hit, as in :meth:`longest`), or ``None``."""
        return self._use(key) if key in self._protected or key in self._probation else None

    def put(self, key: tuple[int, ...], entry: PromptKV) -> None:
        """Store ``entry`` under ``key`` on probation, then evict down to the budget. A key already
        stored keeps its entry (the same tokens have the same keys and values). An entry whose
        ``base`` is no longer stored (evicted since it was found) is stored whole: the base's
        tensors are copied in, so that every byte held is counted."""
        if not key or not self.max_bytes or key in self._probation or key in self._protected:
            return
        if entry.base is not None and not self._holds(entry.base):
            import torch

            parts = entry.parts()
            entry = PromptKV([torch.cat([p.keys[i] for p in parts], dim=1) for i in range(len(entry.keys))],
                             [torch.cat([p.values[i] for p in parts], dim=1) for i in range(len(entry.values))])
        if entry.nbytes > self.max_bytes:
            return
        if entry.base is not None:
            entry.base.extensions += 1
        self._probation[key] = entry
        self._bytes["probation"] += entry.nbytes
        self._evict()

    def note(self, hit: int, miss: int) -> None:
        """Count ``hit`` prompt tokens taken from here and ``miss`` computed."""
        self.hit_tokens += hit
        self.miss_tokens += miss

    def clear(self) -> None:
        for entry in (*self._probation.values(), *self._protected.values()):
            entry.extensions = 0
        self._probation.clear()
        self._protected.clear()
        self._bytes = {"probation": 0, "protected": 0}

    def _holds(self, entry: PromptKV) -> bool:
        return any(e is entry for e in (*self._probation.values(), *self._protected.values()))

    def _pop(self, key: tuple[int, ...]) -> PromptKV | None:
        for name, segment in (("probation", self._probation), ("protected", self._protected)):
            entry = segment.pop(key, None)
            if entry is not None:
                self._bytes[name] -= entry.nbytes
                return entry
        return None

    def _use(self, key: tuple[int, ...]) -> PromptKV:
        entry = self._pop(key)
        assert entry is not None  # called for a key the cache holds
        self._protected[key] = entry
        self._bytes["protected"] += entry.nbytes
        while self._bytes["protected"] > self.protected_share * self.max_bytes and len(self._protected) > 1:
            old, demoted = self._protected.popitem(last=False)
            self._bytes["protected"] -= demoted.nbytes
            self._probation[old] = demoted
            self._bytes["probation"] += demoted.nbytes
        self._evict()
        return entry

    def _evict(self) -> None:
        """Drop least recently used leaves (probation first) until the budget holds."""
        while self.nbytes > self.max_bytes:
            key = next((k for segment in (self._probation, self._protected) for k, e in segment.items()
                        if not e.extensions), None)
            if key is None:  # every entry is extended by another: cannot happen (the newest of a chain is a leaf)
                return
            dropped = self._pop(key)
            assert dropped is not None
            if dropped.base is not None:
                dropped.base.extensions -= 1
