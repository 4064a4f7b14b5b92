"""The logits processor behind ``search.constrain: call`` in the transformers backend.

:class:`TokenTrie` holds, once per tokenizer, the text of every token and a character trie over
those texts. The set of tokens allowed in a state of a :class:`~codetool.models.constraint.CallConstraint`
is found by walking that trie together with the constraint's trie of allowed openings: only the
branches both share are visited (a few hundred nodes), and the mask is cached per state. Inside a
call's arguments (shape ``line``) nearly every token is allowed and the walk visits the whole trie
(one pass over the vocabulary), but those masks do not depend on the names and are computed once. Before a
trigger appears, the only forbidden tokens are those that would complete the trigger and continue
with a disallowed opening (found by one pass over the vocabulary per partial-trigger suffix, cached).

:class:`CallLogitsProcessor` follows every row of a batch (``prompts x samples``, any mix of
constraints, ``None`` for a free row) from the tokens appended since its last call and sets the
logits of forbidden tokens to ``-inf``. Rows are independent, so left padding, prompts of different
lengths and ``n > 1`` need nothing special: the processor only reads the generated part (from
``prompt_width`` on). The sampler's temperature and top-p must run *after* the mask (otherwise top-p
can keep only forbidden tokens); :meth:`TransformersBackend.generate` arranges that.

Limits: a token whose text is not valid UTF-8 on its own (a piece of a multi-byte character) never
fits an opening; tokens beyond the tokenizer's length (spare embedding rows) are forbidden until the
call has opened.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from codetool.models.constraint import DONE, CallConstraint

logger = logging.getLogger(__name__)

MASK_CACHE_SIZE = 256  # constraints whose masks are kept (one per query's tool list)


class TokenTrie:
    """Token texts and a character trie over them, for one tokenizer.

    Args:
        tokenizer: a Hugging Face tokenizer.

    ``texts[i]`` is the text token ``i`` adds when it follows other text (leading spaces of
    SentencePiece pieces kept); ``children[node]`` maps a character to a node; ``ids[node]`` are the
    tokens whose text ends at ``node`` (node 0 is the root: tokens with empty text).
    """

    def __init__(self, tokenizer):
        size = len(tokenizer)
        anchor_ids = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
        anchor = tokenizer.decode(anchor_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        pairs = tokenizer.batch_decode([anchor_ids + [i] for i in range(size)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        alone = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        self.texts = [p[len(anchor):] if p.startswith(anchor) else a for p, a in zip(pairs, alone)]
        self.children: list[dict[str, int]] = [{}]
        self.ids: list[list[int]] = [[]]
        for token, text in enumerate(self.texts):
            node = 0
            for ch in text:
                nxt = self.children[node].get(ch)
                if nxt is None:
                    self.children.append({})
                    self.ids.append([])
                    nxt = self.children[node][ch] = len(self.children) - 1
                node = nxt
            self.ids[node].append(token)
        self._subtree: dict[int, list[int]] = {}

    def subtree(self, node: int) -> list[int]:
        """Every token whose text starts with the text of ``node`` (cached)."""
        out = self._subtree.get(node)
        if out is None:
            out, stack = [], [node]
            while stack:
                n = stack.pop()
                out.extend(self.ids[n])
                stack.extend(self.children[n].values())
            self._subtree[node] = out
        return out

    def allowed(self, constraint: CallConstraint, state: int) -> list[int]:
        """Tokens that keep ``constraint`` alive from ``state`` (not ``DONE``): the shared walk."""
        out: list[int] = []
        stack = [(0, state)]
        while stack:
            vnode, cstate = stack.pop()
            kids = self.children[vnode]
            nxt = constraint.children(cstate)
            if nxt is None:  # inside the arguments: ask for each character
                pairs = [(vchild, constraint.step(cstate, ch)) for ch, vchild in kids.items()]
            elif len(nxt) < len(kids):
                pairs = [(kids[ch], ns) for ch, ns in nxt.items() if ch in kids]
            else:
                pairs = [(vchild, nxt[ch]) for ch, vchild in kids.items() if ch in nxt]
            for vchild, nstate in pairs:
                if nstate is None:
                    continue
                if nstate == DONE:
                    out.extend(self.subtree(vchild))
                else:
                    out.extend(self.ids[vchild])
                    stack.append((vchild, nstate))
        return out


def _border(text: str, trigger: str) -> str:
    """The longest suffix of ``text`` that is a proper prefix of ``trigger``."""
    for k in range(min(len(text), len(trigger) - 1), 0, -1):
        if trigger.startswith(text[-k:]):
            return text[-k:]
    return ""


class CallLogitsProcessor:
    """Masks the logits of each row so its reply keeps to its :class:`CallConstraint`.

    Args:
        trie (`TokenTrie`): the tokenizer's token trie.
        constraints (`list[CallConstraint | None]`): one per row of the batch (``None``: free).
        prompt_width (`int`): the padded prompt length; tokens after it are the generated ones.
        vocab_size (`int`): the logits' last dimension.
        masks (`dict`, *optional*): a cache shared across calls, ``constraint -> {state: mask}``.

    Called by ``generate`` as ``processor(input_ids, scores) -> scores`` with ``input_ids``
    (rows, width) and ``scores`` (rows, vocab) float; returns ``scores`` with forbidden entries
    set to ``-inf``.
    """

    def __init__(self, trie: TokenTrie, constraints: list[CallConstraint | None], prompt_width: int,
                 vocab_size: int, masks: OrderedDict | None = None):
        self.trie, self.constraints, self.prompt_width = trie, list(constraints), prompt_width
        self.vocab_size = vocab_size
        self.masks = masks if masks is not None else OrderedDict()
        # Per row: ("pre", border text) before the trigger, ("in", trie state), or ("free", None).
        self.states: list[tuple[str, Any]] = [
            ("free", None) if c is None else ("pre", "") if c.trigger else ("in", 0) for c in self.constraints]
        self.seen = prompt_width

    def _mask(self, constraint: CallConstraint | None, key):
        """Boolean (vocab,) tensor of allowed tokens for a state key (cached) of a constrained row."""
        import torch

        assert constraint is not None  # a row without one is free and never masked
        kind, value = key
        # argument and tail states do not depend on the names: share their masks across queries
        owner = ("shared", constraint.tail_key) if kind == "in" and value < DONE else constraint
        per = self.masks.get(owner)
        if per is None:
            per = self.masks[owner] = {}
            while len(self.masks) > MASK_CACHE_SIZE:
                self.masks.popitem(last=False)
        else:
            self.masks.move_to_end(owner)
        mask = per.get(key)
        if mask is None:
            if kind == "in":
                mask = torch.zeros(self.vocab_size, dtype=torch.bool)
                ids = [i for i in self.trie.allowed(constraint, value) if i < self.vocab_size]
                mask[ids] = True
            else:  # before the trigger: forbid only tokens that complete it and go astray
                mask = torch.ones(self.vocab_size, dtype=torch.bool)
                trigger = constraint.trigger
                bad = []
                for i, text in enumerate(self.trie.texts[:self.vocab_size]):
                    joined = value + text
                    at = joined.find(trigger)
                    if at >= 0 and constraint.advance(0, joined[at + len(trigger):]) is None:
                        bad.append(i)
                mask[bad] = False
            per[key] = mask
        return mask

    def _step(self, row: int, token: int) -> None:
        kind, value = self.states[row]
        if kind == "free":
            return
        constraint = self.constraints[row]
        assert constraint is not None  # a row without one is free
        text = self.trie.texts[token] if token < len(self.trie.texts) else ""
        if kind == "pre":
            joined = value + text
            at = joined.find(constraint.trigger)
            if at < 0:
                self.states[row] = ("pre", _border(joined, constraint.trigger))
                return
            kind, value, text = "in", 0, joined[at + len(constraint.trigger):]
        state = constraint.advance(value, text)
        if state is None:  # only reachable if a masked token was forced in; stop constraining
            logger.debug("row %d left its call constraint; the rest is unconstrained", row)
            self.states[row] = ("free", None)
        else:
            self.states[row] = ("free", None) if state == DONE else ("in", state)

    def __call__(self, input_ids, scores):
        import torch

        width = input_ids.shape[1]
        if width > self.seen:
            new = input_ids[:, self.seen:].tolist()
            for row, tokens in enumerate(new):
                for token in tokens:
                    self._step(row, token)
            self.seen = width
        rows = [r for r, (kind, _) in enumerate(self.states) if kind != "free"]
        if not rows:
            return scores
        allowed = torch.stack([self._mask(self.constraints[r], self.states[r]) for r in rows])
        allowed[~allowed.any(-1)] = True  # a state no token fits (exotic tokenizer): leave the row free
        allowed = allowed.to(scores.device)
        index = torch.tensor(rows, device=scores.device)
        part = scores[index]
        scores[index] = part.masked_fill(~allowed[:, :part.shape[-1]], float("-inf"))
        return scores


def allowed_along(trie: TokenTrie, constraint: CallConstraint | None, tokens: list[int], vocab_size: int,
                  masks: OrderedDict | None = None) -> list:
    """The mask :class:`CallLogitsProcessor` applied before each of ``tokens`` when they were
    sampled under ``constraint`` (replayed from the tokens alone): a boolean ``(vocab_size,)``
    tensor of the allowed tokens, or ``None`` where the reply was free (no constraint, after the
    call closed, or a state no token fits). Policy RL computes the trained log-probabilities under
    these masks, so they are those of the distribution each step was sampled from."""
    if constraint is None:
        return [None] * len(tokens)
    processor = CallLogitsProcessor(trie, [constraint], 0, vocab_size, masks)
    out = []
    for token in tokens:
        kind, _ = processor.states[0]
        mask = None if kind == "free" else processor._mask(constraint, processor.states[0])
        out.append(mask if mask is not None and bool(mask.any()) else None)
        processor._step(0, int(token))
    return out
