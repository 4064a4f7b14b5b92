"""The PRM model: a causal LM, two label tokens, and their two output rows (the label head).

The generative PRM emits one of two label tokens after the prompt (CodeTool, Lu et al. 2025);
its score is ``softmax([logit_pos, logit_neg])[0]`` at the label position (docs/DESIGN.md §4). Only
those two logits matter, so :class:`PRMModel` runs the decoder, takes the hidden state at the
label position and projects it onto the two label rows of the output embedding, kept here as a
small trainable ``label_head`` of shape (2, hidden). This is the same number the full LM head
would give for those two tokens, without computing the other ~50k-150k logits, and it lets LoRA
training update the label rows without training (or saving) the whole embedding matrix.

Saving, loading and exporting a PRM folder is :mod:`codetool.prm.folder`.

Label tokens (``PRMFormat.label_mode: special``) are added as special tokens; the embedding
matrix only grows (a tokenizer smaller than the matrix, like Qwen2.5's spare rows, never shrinks
it) and the label rows are set deterministically: mean of the existing rows plus seeded noise.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from codetool import CodetoolError
from codetool.models.kv import cache_kwargs, output_cache
from codetool.prm.format import PRMFormat, label_token_ids

logger = logging.getLogger(__name__)

_NOISE_SCALE = 0.02


def _zero3() -> bool:
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
    except ImportError:
        return False
    return is_deepspeed_zero3_enabled()


def gathered(params: list[nn.Parameter], modify: bool = False):
    """Context in which ZeRO-3-partitioned ``params`` are whole (a no-op without ZeRO-3)."""
    if not _zero3():
        return contextlib.nullcontext()
    import deepspeed  # GPU path: only reached under DeepSpeed ZeRO-3

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None)


def is_tied(lm) -> bool:
    """Whether the LM head shares its weight with the input embedding (SmolLM2: yes)."""
    out = lm.get_output_embeddings()
    return out is None or out.weight is lm.get_input_embeddings().weight


@torch.no_grad()
def add_label_tokens(model, tokenizer, fmt: PRMFormat, *, seed: int = 0, init_rows: bool = True) -> tuple[int, int]:
    """Make the two label tokens exist in ``tokenizer`` and ``model``; returns their ids.

    Args:
        model (`PreTrainedModel` or `None`): its embedding matrix grows if the new ids do not fit;
            it never shrinks (spare rows are kept). `None` changes the tokenizer only.
        tokenizer (`PreTrainedTokenizerBase`): gets the label tokens as special tokens
            (``label_mode: special``); left unchanged for ``label_mode: existing``.
        fmt (`PRMFormat`): which tokens and how.
        seed (`int`, *optional*, defaults to 0): seed of the noise added to the new rows.
        init_rows (`bool`, *optional*, defaults to `True`): set the label rows (input, and output
            when untied) to ``mean(existing rows) + 0.02 * std * N(0, 1)``; ``False`` keeps trained rows.
    Returns:
        ``(positive_id, negative_id)``.
    """
    if fmt.label_mode == "existing":
        return label_token_ids(tokenizer, fmt)
    from transformers import AddedToken

    vocab = tokenizer.get_vocab()
    new = [t for t in fmt.label_tokens if t not in vocab]
    if new:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in new], special_tokens=True)
    ids = label_token_ids(tokenizer, fmt)
    if model is None:
        return ids
    embeddings = model.get_input_embeddings()
    with gathered([embeddings.weight]):
        rows = embeddings.weight.shape[0]
    if max(ids) >= rows:
        model.resize_token_embeddings(max(ids) + 1, mean_resizing=False)
        logger.info("embedding matrix grown from %d to %d rows for the label tokens", rows, max(ids) + 1)
    if init_rows:
        weights = [model.get_input_embeddings().weight]
        if not is_tied(model):
            weights.append(model.get_output_embeddings().weight)
        generator = torch.Generator().manual_seed(seed)  # CPU noise: the same rows on every device
        with gathered(weights, modify=True):
            for weight in weights:
                old = weight[: min(ids)].float()  # on the weight's device (cuda, cpu or meta)
                noise = torch.randn(2, weight.shape[1], generator=generator).to(old.device)
                rows = old.mean(0, keepdim=True) + noise * old.std() * _NOISE_SCALE
                weight[list(ids)] = rows.to(device=weight.device, dtype=weight.dtype)
    return ids


def write_label_rows(weight: torch.Tensor, label_ids: tuple[int, ...], head: torch.Tensor) -> None:
    """Copy the (2, hidden) ``head`` into rows ``label_ids`` of ``weight``, on the weight's device
    and in its dtype (a float32 CPU head into a bfloat16 CUDA weight is the usual case)."""
    with torch.no_grad():
        weight[list(label_ids)] = head.detach().to(device=weight.device, dtype=weight.dtype)


MIN_SHARED_TOKENS = 16  # shorter common runs are recomputed per row (one more pass costs more)
# share_prefix auto shares only when it saves at least this share of a batch's positions
MIN_SHARED_SAVING = 0.1
SHARE_MODES = ("auto", "packed", "trie", "none")


def _sync(device) -> None:
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


class PRMModel(nn.Module):
    """A causal LM (plain or PEFT-wrapped) plus its two label rows.

    Args:
        lm (`PreTrainedModel` or `PeftModel`): the language model, label tokens already added.
        label_ids (`tuple[int, int]`): positive and negative label token ids.
        label_head (`torch.Tensor`, *optional*): (2, hidden) rows; copied from the LM's output
            embedding at ``label_ids`` when not given.

    ``forward(input_ids, last_index, share_prefix=False)`` returns the two label logits (batch, 2),
    float32, read at ``last_index`` (batch,), the position right before the label token. Inputs
    are right-padded and need no attention mask: with causal attention, pads after a row's last
    real token cannot change that token's hidden state. ``share_prefix`` computes the token runs
    that rows have in common (a query's prompt, siblings' history) once, in one of three ways that
    all equal the unshared logits and gradients to float rounding (tested in fp32):

    - ``"packed"`` (or `True`): one forward over packed rows, each shared prefix once and its
      suffixes after it, with a block attention mask and position ids continuing from the prefix
      (``codetool.prm.packing``). One call: what pays on a GPU, and fine with activation
      checkpointing and FSDP. Needs ``sdpa`` or ``eager`` attention (else falls back to the trie).
    - ``"trie"``: a prefix trie of batch-1 passes whose KV cache the rows below read, gradients
      through the cache; each shared run of at least ``MIN_SHARED_TOKENS`` tokens is one call.
      Many small calls: good on a compute-bound CPU, launch-bound on a GPU (slower than no
      sharing there, issue 20). Not with activation checkpointing (no cache) or FSDP.
    - ``"none"`` (or `False`): one right-padded causal forward.
    - ``"auto"``: :meth:`pick_share_mode` decides on the first batch by rule (positions saved,
      attention kind, device) without running it, and keeps the mode in ``share_mode``. It is
      the default of training and scoring on every device.

    ``k`` candidates after a ``P``-token prefix cost ``P + k*S`` positions instead of ``k*(P + S)``.
    """

    def __init__(self, lm, label_ids: tuple[int, int], label_head: torch.Tensor | None = None):
        super().__init__()
        self.lm = lm
        self.label_ids = tuple(int(i) for i in label_ids)
        if label_head is None:
            out = lm.get_output_embeddings()
            out = lm.get_input_embeddings() if out is None else out
            with gathered([out.weight]):
                label_head = out.weight[list(self.label_ids)].detach().clone()
        self.label_head = nn.Parameter(label_head.float().clone())
        self.config = lm.config  # DeepSpeed "auto" sizes and FSDP read it
        self.share_mode: str | None = None  # what share_prefix "auto" picked (pick_share_mode)
        self.max_packed_tokens = 4096  # packed row width bound (attention is quadratic in it)
        self.activation_checkpointing = False
        self.no_trie = False  # set under FSDP: its wrapped layers expect one call per forward
        self.full_vocab = False  # format.interface reference in training: label log-probs over the vocabulary
        self._no_split_modules = getattr(lm, "_no_split_modules", None)

    def add_model_tags(self, tags) -> None:
        """Hub tags for the model card (TRL's trainers call this)."""
        if hasattr(self.lm, "add_model_tags"):
            self.lm.add_model_tags(tags)

    @property
    def model_tags(self):
        return getattr(self.lm, "model_tags", None)

    def decoder(self) -> nn.Module:
        """The transformer body (LoRA layers included) that returns ``last_hidden_state``."""
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        return base.get_decoder()

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """Recompute the decoder's activations in the backward pass (less memory, ~30% slower).

        transformers 5.2x names this ``activation_checkpointing_enable``, earlier releases (those
        vLLM pins) ``gradient_checkpointing_enable``: the model answers to both and calls the one
        its LM has, and the Trainer of either version finds the name it calls.
        """
        kwargs_ = activation_checkpointing_kwargs or {"use_reentrant": False}
        self.activation_checkpointing = True
        if hasattr(self.lm, "activation_checkpointing_enable"):
            self.lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs_, **kwargs)
        else:
            kwargs.pop("offload", None)  # not in the older signature
            self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs_, **kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        """The older name of :meth:`activation_checkpointing_enable` (what transformers < 5.2x's Trainer calls)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def label_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) states -> (n, 2) float32 logits of [positive, negative]; with ``full_vocab``
        set, their log-probabilities under the whole vocabulary (:meth:`vocab_log_probs`)."""
        if self.full_vocab:
            return self.vocab_log_probs(hidden)
        return (hidden.to(self.label_head.dtype) @ self.label_head.T).float()

    def vocab_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) states -> (n, 2) float32 log-probabilities of the two labels under the whole
        output vocabulary, the label rows taken from ``label_head`` (plain SFT on the answer word,
        ``format.interface: reference``). The output layer is called as a module, so ZeRO-3
        gathers its weight."""
        out = self.lm.get_output_embeddings()
        if out is None:  # no separate head: the tied input embedding
            out_logits = hidden @ self.lm.get_input_embeddings().weight.T
        else:
            out_logits = out(hidden.to(out.weight.dtype))
        ids = torch.tensor(self.label_ids, device=out_logits.device)
        pair = (hidden.to(self.label_head.dtype) @ self.label_head.T).float()
        logits = out_logits.float().index_copy(1, ids, pair)
        return torch.log_softmax(logits, dim=-1).index_select(1, ids)

    def forward(self, input_ids: torch.Tensor, last_index: torch.Tensor, share_prefix: bool | str = False) -> torch.Tensor:
        """(batch, 2) float32 label logits of right-padded ``input_ids`` read at ``last_index``.

        ``share_prefix``: ``"packed"`` (or `True`), ``"trie"``, ``"none"`` (or `False`) or
        ``"auto"`` (see :meth:`pick_share_mode`); see the class docstring.
        """
        last_index = last_index.to(input_ids.device)
        mode = self.resolve_share_mode(share_prefix)
        if mode == "auto":  # one row has nothing to share: nothing to measure either
            mode = self.pick_share_mode(input_ids, last_index) if input_ids.shape[0] > 1 else "none"
        if mode == "none" or input_ids.shape[0] < 2:
            return self.label_logits(self._full(input_ids, last_index))
        ids, ends = input_ids.tolist(), [i + 1 for i in last_index.tolist()]
        if mode == "packed":
            return self.label_logits(self._packed([row[:end] for row, end in zip(ids, ends)], input_ids.device))
        parts: list[torch.Tensor] = []
        order: list[int] = []
        self._walk(input_ids, last_index, ids, ends, list(range(len(ids))), None, 0, parts, order)
        hidden = torch.cat(parts)[torch.argsort(torch.tensor(order, device=input_ids.device))]
        return self.label_logits(hidden)

    def resolve_share_mode(self, share_prefix: bool | str) -> str:
        """Normalise a ``share_prefix`` value to one of :data:`SHARE_MODES` for this model.

        Raises:
            CodetoolError: on an unknown value.
        """
        mode = ("packed" if share_prefix else "none") if isinstance(share_prefix, bool) else str(share_prefix).lower()
        mode = {"true": "packed", "false": "none", "on": "packed", "off": "none"}.get(mode, mode)
        if mode not in SHARE_MODES:
            raise CodetoolError(f"share_prefix: got {share_prefix!r}; choose one of {list(SHARE_MODES)}.")
        if mode == "auto" and self.share_mode is not None:
            return self.share_mode
        if mode == "packed" and not self.packing_supported():
            return "trie"
        return mode

    def packing_supported(self) -> bool:
        """Whether the attention takes a 4D block mask (``sdpa`` and ``eager`` do, FlashAttention-2 does not)."""
        return getattr(self.config, "_attn_implementation", "sdpa") in ("sdpa", "eager", None)

    def pick_share_mode(self, input_ids: torch.Tensor, last_index: torch.Tensor, repeats: int = 1) -> str:
        """Decide ``share_prefix: auto`` from this batch by rule, without running it, and keep the
        mode in ``share_mode``.

        The rule counts positions: a batch whose rows computed with each shared prefix once
        (:func:`unique_positions`) save less than :data:`MIN_SHARED_SAVING` of its positions
        runs unshared (``none``); otherwise the packed forward (one call, on every device) where
        the attention takes a block mask, else the trie on a CPU (compute-bound: fewer positions
        win) and no sharing on a GPU (the trie's many small calls are launch-bound there). It
        used to time the three modes on the first batch: three forwards of a full batch, 8
        minutes for a 14-row dataset of a 7B model on CPU (issue 40). ``repeats`` is unused
        (kept for callers). Returns the mode.
        """
        ends = [i + 1 for i in last_index.tolist()]
        rows = [row[:end] for row, end in zip(input_ids.tolist(), ends)]
        total = sum(len(r) for r in rows)
        unique = unique_positions(rows)
        saving = 1 - unique / total if total else 0.0
        trie_ok = not (self.activation_checkpointing or self.no_trie)
        if saving < MIN_SHARED_SAVING:
            mode = "none"
        elif self.packing_supported():
            mode = "packed"
        else:
            mode = "trie" if trie_ok and input_ids.device.type == "cpu" else "none"
        self.share_mode = mode
        logger.info("share_prefix auto: %s (the first batch's %d positions are %d with each shared prefix once, "
                    "%.0f%% fewer; decided by rule)", mode, total, unique, 100 * saving)
        return mode

    def logits_of_rows(self, rows: list[list[int]], share_prefix: bool | str = "auto", pad_id: int = 0) -> torch.Tensor:
        """(len(rows), 2) label logits of unpadded prompts (each up to the position before the label)."""
        device = self.label_head.device
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        last = torch.tensor([len(r) - 1 for r in rows])
        return self.forward(ids.to(device), last.to(device), share_prefix=share_prefix)

    def _packed(self, rows: list[list[int]], device) -> torch.Tensor:
        """(len(rows), hidden) states at each row's last token from one packed forward."""
        from codetool.prm.packing import pack_rows

        eager = getattr(self.config, "_attn_implementation", "sdpa") == "eager"
        dtype = self.decoder().get_input_embeddings().weight.dtype
        if eager and torch.is_autocast_enabled(device.type if hasattr(device, "type") else "cpu"):
            dtype = torch.float32  # added to float32 or autocast scores: the float32 minimum is safe
        batch = pack_rows(rows, min_shared=MIN_SHARED_TOKENS, max_tokens=self.max_packed_tokens, device=device,
                          mask_dtype=dtype if eager else None)
        hidden = self.decoder()(input_ids=batch.input_ids, position_ids=batch.position_ids,
                                attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
        return hidden[batch.gather[:, 0], batch.gather[:, 1]]

    def _full(self, input_ids: torch.Tensor, last_index: torch.Tensor) -> torch.Tensor:
        """(n, hidden) states at ``last_index`` of right-padded full prompts."""
        width = int(last_index.max()) + 1
        hidden = self.decoder()(input_ids=input_ids[:, :width], use_cache=False).last_hidden_state
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last_index]

    def _walk(self, input_ids, last_index, ids, ends, rows, cache, offset, parts, order) -> None:
        """Depth-first over the prefix trie of ``rows``, which share ``ids[:offset]`` (KV in ``cache``).

        A common run of at least ``MIN_SHARED_TOKENS`` more tokens is computed once (batch 1) and
        the rows split by the token after it; rows left alone at a node run as one right-padded
        batch on the node's cache. Every row keeps at least its last token for its own pass.
        """
        if len(rows) > 1:
            limit = min(ends[r] for r in rows) - 1 - offset  # the last token stays in the row's own pass
            first = ids[rows[0]]
            common = 0
            while common < limit and all(ids[r][offset + common] == first[offset + common] for r in rows):
                common += 1
            if common >= MIN_SHARED_TOKENS:
                cache = self._extend(cache, input_ids[rows[0]: rows[0] + 1, offset: offset + common])
                offset, limit, common = offset + common, limit - common, 0
            if common < limit:  # the rows differ at offset + common: one branch per token there
                branches: dict[int, list[int]] = {}
                for r in rows:
                    branches.setdefault(ids[r][offset + common], []).append(r)
                for branch in branches.values():
                    if len(branch) > 1:
                        self._walk(input_ids, last_index, ids, ends, branch, cache, offset, parts, order)
                rows = [b[0] for b in branches.values() if len(b) == 1]
        if rows:
            parts.append(self._leaves(input_ids, last_index, rows, cache, offset))
            order.extend(rows)

    def _extend(self, cache, chunk: torch.Tensor):
        """KV (per layer ``(keys, values)``, batch 1) of ``chunk`` (1, n) on top of ``cache``."""
        from transformers import DynamicCache

        past = None if cache is None else DynamicCache(ddp_cache_data=cache, config=self.config)
        out = self.decoder()(input_ids=chunk, **cache_kwargs(past), use_cache=True)
        return [(layer.keys, layer.values) for layer in output_cache(out).layers]

    def _leaves(self, input_ids, last_index, rows: list[int], cache, offset: int) -> torch.Tensor:
        """(len(rows), hidden) states of ``rows`` from position ``offset`` on, on the shared ``cache``."""
        from transformers import DynamicCache

        index = torch.tensor(rows, device=input_ids.device)
        if cache is None:
            return self._full(input_ids[index], last_index[index])
        n = len(rows)
        repeated = DynamicCache(ddp_cache_data=[(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in cache],
                                config=self.config)
        width = int(last_index[index].max()) + 1
        hidden = self.decoder()(input_ids=input_ids[index, offset:width], **cache_kwargs(repeated),
                                use_cache=True).last_hidden_state
        return hidden[torch.arange(n, device=hidden.device), last_index[index] - offset]


def unique_positions(rows: list[list[int]]) -> int:
    """Positions of ``rows`` (token id lists) with every shared prefix counted once: the nodes of
    their token trie (sorted rows: each adds what follows its longest common prefix with the one
    before)."""
    total, previous = 0, list[int]()
    for row in sorted(rows):
        common = 0
        for a, b in zip(previous, row):
            if a != b:
                break
            common += 1
        total += len(row) - common
        previous = row
    return total
