"""Log-probabilities under the constrained distribution a step was sampled from (issue 38).

With ``rollout.constrain`` on, the local generator samples each step under a logits mask
(:mod:`codetool.models.call_mask`: only tokens that keep the step one call of a listed function).
The policy that produced the step is the masked, renormalised distribution, so GRPO's ratio and
gradient must use ``log softmax`` over the allowed tokens, not over the whole vocabulary (the
unconstrained log-probability also pushes mass off tokens the sampler could never pick, and its
ratio is not the sampled policy's).

:class:`ConstraintMasks` replays each step's constraint over its sampled ids
(:func:`~codetool.models.call_mask.allowed_along`: the same processor, the same cached masks) and
keeps, per generation batch, a table of the distinct masks and one index per completion position
(``-1``: free); :func:`masked_logps` computes the per-token log-probabilities and entropies at
GRPO's temperature with those masks, on logits the trainer's forward returns
(:func:`constrained_logps` for a plain forward; ``shared_prompt_logps`` in
:mod:`codetool.policy.trainer` on its shared-prompt forward). The vLLM generator applies no
constraint: ``train-policy`` refuses ``rollout.constrain`` with ``use_vllm``.

Limits: top-p truncation at sampling is not replayed (TRL's log-probabilities never include it);
the masked forward materialises ``(rows, tokens, vocab)`` logits, which the fused LM head avoids
(the quickstart's 4 rows x ~200 completion tokens x 49k vocabulary in float32: ~160 MB, twice that
with the log-softmax).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from codetool.models.call_mask import TokenTrie


class ConstraintMasks:
    """The masks of one tokenizer's constrained steps.

    Args:
        tokenizer: the policy's tokenizer (its token trie is built on first use).
        vocab_size (`int`): the logits' last dimension.
    """

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, int(vocab_size)
        self._trie: TokenTrie | None = None
        self._cache: OrderedDict = OrderedDict()
        self.table: list[torch.Tensor] = []
        self._index: dict[int, int] = {}

    def rows(self, episodes) -> list[list[tuple[int, int]]]:
        """Per episode, ``(completion position, table index)`` of every constrained position of its
        steps; starts a new table (one generation batch)."""
        from codetool.models.call_mask import TokenTrie, allowed_along

        self.table, self._index = [], {}
        out = []
        for ep in episodes:
            row = []
            for step in ep.steps:
                if step.constraint is None:
                    continue
                if self._trie is None:
                    self._trie = TokenTrie(self.tokenizer)
                start, end = step.span
                masks = allowed_along(self._trie, step.constraint, ep.completion_ids[start:end], self.vocab_size,
                                      self._cache)
                row += [(start + k, self._slot(m)) for k, m in enumerate(masks) if m is not None]
            out.append(row)
        return out

    def _slot(self, mask: torch.Tensor) -> int:
        key = id(mask)  # cached masks are shared objects: one slot per distinct state
        if key not in self._index:
            self._index[key] = len(self.table)
            self.table.append(mask)
        return self._index[key]


def mask_ids(rows: list[list[tuple[int, int]]], width: int) -> torch.Tensor:
    """(len(rows), width) table indices, ``-1`` where free (positions past ``width`` dropped)."""
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        for position, slot in row:
            if position < width:
                out[i, position] = slot
    return out


def masked_logps(logits: torch.Tensor, targets: torch.Tensor, ids: torch.Tensor, table: list[torch.Tensor],
                 temperature: float, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of ``targets`` at ``temperature``, each position
    with table index ``ids >= 0`` under its mask (disallowed logits set to ``-inf``).

    Args:
        logits: (rows, tokens, vocab); targets, ids: (rows, tokens).
    Returns:
        ``(logps, entropies)``, each (rows, tokens) float32 (entropies ``None`` unless asked).
    """
    scaled = logits.float() / temperature
    if bool((ids >= 0).any()):
        stacked = torch.stack(table).to(scaled.device)
        vocab = scaled.shape[-1]
        allowed = stacked[ids.clamp(min=0).to(scaled.device)][..., :vocab]
        if allowed.shape[-1] < vocab:  # spare embedding rows beyond the tokenizer: never allowed
            pad = torch.zeros(*allowed.shape[:-1], vocab - allowed.shape[-1], dtype=torch.bool, device=scaled.device)
            allowed = torch.cat([allowed, pad], dim=-1)
        allowed = allowed | (ids < 0).to(scaled.device).unsqueeze(-1)
        scaled = scaled.masked_fill(~allowed, float("-inf"))
    logp_all = torch.log_softmax(scaled, dim=-1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1).to(scaled.device)).squeeze(-1)
    ent = None
    if entropy:
        p = logp_all.exp()
        ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logps, ent


def constrained_logps(trainer, model, input_ids, attention_mask, logits_to_keep: int, ids: torch.Tensor,
                      batch_size: int | None = None, compute_entropy: bool = False):
    """``GRPOTrainer._get_per_token_logps_and_entropies`` with the masks ``ids`` (rows, logits_to_keep)
    applied: a plain forward returning logits, in chunks of ``batch_size`` rows."""
    batch_size = batch_size or input_ids.shape[0]
    logps, ents = [], []
    for start in range(0, input_ids.shape[0], batch_size):
        end = min(start + batch_size, input_ids.shape[0])
        with trainer.accelerator.autocast():
            out = model(input_ids=input_ids[start:end], attention_mask=attention_mask[start:end],
                        logits_to_keep=logits_to_keep + 1)
        logits = out.logits[:, :-1][:, -logits_to_keep:]
        lp, ent = masked_logps(logits, input_ids[start:end, -logits_to_keep:], ids[start:end],
                               trainer.constraint_masks.table, trainer.temperature, compute_entropy)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents) if compute_entropy else None, None
