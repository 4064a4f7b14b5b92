"""Scoring with a PRM: ``PRMScorer.score(items) -> list[float]`` (``codetool score`` runs it on a file).

The score of a candidate step is ``softmax([logit_pos, logit_neg])[0]`` at the label position
(DESIGN.md §4), a float in [0, 1]; a PRM trained with ``format.interface: reference`` scores as
the public CodeTool server does, ``logit_yes / (logit_yes + logit_no)`` on the raw logits
(:func:`codetool.prm.reference.label_scores`). :class:`LocalPRMScorer` computes it fast on one
machine:

- items are encoded with the one prompt renderer (``codetool.prm.format``); candidates whose
  prefix ids are equal (the K candidates of one search step) form a group;
- the prompts of a call run through ``PRMModel`` with the same prefix sharing as training
  (``share_prefix``; ``codetool.prm.packing``): packed, each shared prefix once and its
  suffixes after it in one forward with a block attention mask, and only each prompt's last
  hidden state is projected onto the two label rows. For 16 candidates of ~100 tokens after a
  1,500-token prefix this computes ~3,100 token positions instead of ~25,600;
- lone items (no sibling in the call) run as plain causal rows in the same forward.

The result equals an unbatched float32 forward of each full prompt to within float rounding
(tested at 1e-4). :func:`load_scorer` turns the search's ``--prm`` value into a scorer: a
checkpoint folder, an ``http(s)://`` PRM server, ``vllm:FOLDER`` (vLLM in-process), or ``none``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.models.spec import ModelSpec
from codetool.prm.client import HTTPScorer
from codetool.prm.reference import label_scores
from codetool.prm.vllm_backend import VLLMScorer
from codetool.rewards import PRMItem, PRMScorer

logger = logging.getLogger(__name__)


class LocalPRMScorer:
    """A :class:`codetool.rewards.PRMScorer` running a :class:`PRMModel` in this process.

    Args:
        model (`PRMModel`): in eval mode, on its device.
        tokenizer: the checkpoint's tokenizer (with the label tokens).
        fmt (`PRMFormat`): the prompt format the model was trained with.
        max_batch_tokens (`int`, *optional*, defaults to 16384): bound on the token positions of
            one forward, a shared prefix counted once (a packed row is further bounded by
            ``model.max_packed_tokens``).
        share_prefix (`bool` or `str`, *optional*, defaults to ``"auto"``): the same modes as
            training (``PRMModel.forward``): ``packed`` (one forward, block mask), ``trie``,
            ``none`` (`False`), or ``auto``: timed on the first call with something to share,
            then kept (``model.share_mode``).

    ``score(items)`` returns one float in [0, 1] per item, in order; ``stats`` counts calls,
    items, prefix groups and truncated prompts.
    """

    def __init__(self, model, tokenizer, fmt, *, max_batch_tokens: int = 16384, share_prefix: bool | str = "auto"):
        from codetool.prm.format import PromptEncoder

        self.model = model.eval()
        self.model.full_vocab = False  # scoring reads the two raw label logits
        self.encoder = PromptEncoder(tokenizer, fmt)
        self.max_batch_tokens = max(int(max_batch_tokens), 1)
        self.share_prefix = model.resolve_share_mode(share_prefix)
        self.device = next(model.parameters()).device
        self.stats = {"calls": 0, "items": 0, "groups": 0, "truncated": 0}
        self.meta: dict[str, Any] = {}  # what a checkpoint was trained on (from_checkpoint)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str = "auto", dtype: str = "auto",
                        merge: bool = True, **kwargs) -> LocalPRMScorer:
        """Load a ``codetool train-prm`` output folder (see ``codetool.prm.folder.load_prm``)."""
        from codetool.prm.folder import load_prm

        model, tokenizer, fmt, meta = load_prm(path, device=device, dtype=dtype, merge=merge)
        scorer = cls(model, tokenizer, fmt, **kwargs)
        scorer.meta = meta  # what it was trained on (label rules, interface): for the comparability block
        return scorer

    def score(self, items: list[PRMItem]) -> list[float]:
        import torch

        if not items:
            return []
        encoded = [self.encoder.encode(item) for item in items]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, enc in enumerate(encoded):
            groups.setdefault(tuple(enc.prefix_ids), []).append(i)
        order = [i for members in groups.values() for i in members]  # siblings side by side
        first = {members[0] for members in groups.values()}
        cost = [len(encoded[i].input_ids) if i in first or self.share_prefix == "none" else len(encoded[i].suffix_ids)
                for i in order]  # positions computed: a group's prefix once
        scores: list[float] = [0.0] * len(items)
        with torch.inference_mode():
            for batch in self._batches(cost):
                rows = [encoded[order[k]].input_ids for k in batch]
                logits = self.model.logits_of_rows(rows, share_prefix=self.share_prefix)  # (n, 2) float32
                for k, value in zip(batch, label_scores(logits, self.encoder.fmt.interface)):
                    scores[order[k]] = value
        self.stats["calls"] += 1
        self.stats["items"] += len(items)
        self.stats["groups"] += len(groups)
        cut = sum(e.truncated for e in encoded)
        self.stats["truncated"] += cut
        if cut:
            logger.debug("%d of %d PRM prompts were cut to fit max_length %d", cut, len(items),
                         self.encoder.fmt.max_length)
        return scores

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Consecutive index runs of at most ``max_batch_tokens`` positions (at least one row each)."""
        batches: list[list[int]] = []
        current: list[int] = []
        total = 0
        for i, n in enumerate(lengths):
            if current and total + n > self.max_batch_tokens:
                batches.append(current)
                current, total = [], 0
            current.append(i)
            total += n
        return batches + [current] if current else batches


def reference_scores(model, encoder, items: list[PRMItem]) -> list[float]:
    """The plain way, for tests and benchmarks: one full forward of the whole causal LM per item,
    logits at the last position only (``logits_to_keep=1``), the score of the two label logits
    (:func:`~codetool.prm.reference.label_scores`)."""
    import torch

    pos, neg = encoder.label_ids
    out = []
    with torch.inference_mode():
        for item in items:
            ids = torch.tensor([encoder.encode(item).input_ids], device=next(model.parameters()).device)
            logits = model.lm(input_ids=ids, logits_to_keep=1).logits[0, -1]
            out.append(label_scores(logits[[pos, neg]].float()[None], encoder.fmt.interface)[0])
    return out


# The one table of PRM scorers (each a codetool.rewards.PRMScorer): a --prm spec's kind -> the
# class load_scorer builds for it, as models.backends.BACKENDS is for the policy.
SCORERS: dict[str, Callable[..., PRMScorer]] = {  # the type checker holds each class to the PRMScorer seam
    "local": LocalPRMScorer,  # a train-prm checkpoint folder, in this process
    "server": HTTPScorer,     # one or more codetool serve-prm URLs
    "vllm": VLLMScorer,       # vllm:FOLDER, the checkpoint served by vLLM in this process
}


def load_scorer(spec: ModelSpec, *, device: str = "auto", dtype: str = "auto", **kwargs):
    """The PRM scorer of a parsed PRM spec (the search's ``--prm`` value, parsed where it entered:
    ``ModelSpec.parse(text, role="prm")``).

    Args:
        spec (`ModelSpec`): kind ``none``: no PRM, returns `None`; ``server``: a ``codetool
            serve-prm`` server (:class:`codetool.prm.client.HTTPScorer`); ``vllm``: the checkpoint
            served by vLLM in-process (exported once to ``FOLDER/vllm``;
            :mod:`codetool.prm.vllm_backend`); ``local``: a checkpoint folder written by
            ``codetool train-prm``.
        device, dtype (`str`, *optional*): for local checkpoints (see ``codetool.models.loading.load_model``).
    Returns:
        A :class:`~codetool.rewards.PRMScorer` of :data:`SCORERS`, or `None` for ``none``.
    Raises:
        TypeError: ``spec`` is not a PRM :class:`ModelSpec`.
        CodetoolError: if the folder is not a PRM checkpoint.
    """
    if not isinstance(spec, ModelSpec) or spec.role != "prm":
        raise TypeError(f"load_scorer takes a parsed PRM ModelSpec, got {spec!r}; parse the text with "
                        "ModelSpec.parse(text, role='prm') where it enters (a config's __post_init__).")
    text = spec.text
    if spec.kind == "none":
        return None
    if spec.kind == "server":
        return SCORERS["server"](text, **kwargs)
    if spec.kind == "vllm":
        return SCORERS["vllm"](text[len("vllm:"):], dtype=dtype, **kwargs)
    if not Path(text).is_dir():
        raise CodetoolError(f"--prm {text!r}: no such PRM folder. Pass the output_dir of 'codetool train-prm' "
                            "(the quickstart recipe writes checkpoints/prm/quickstart; `make demo` writes "
                            "runs/quickstart/train/prm), an http(s)://host:port of 'codetool serve-prm', or "
                            "none where a PRM is optional.")
    return LocalPRMScorer.from_checkpoint(text, device=device, dtype=dtype, **kwargs)  # SCORERS["local"]
