"""Local generation with transformers: chat template, batched prompts, shared prefill, stop strings.

Efficiency (DESIGN.md §7: on 2 CPU cores batch 8 decodes ~3.6x faster than batch 1): one
``generate`` call takes prompts from many queries; they are sorted by length (less padding),
left-padded and run in chunks of at most ``max_batch_size`` sequences. The ``n`` samples of a
prompt share one prefill: the prompt is run once and its KV cache repeated ``n`` times, so only
decoding is paid per sample. Prompts of one chunk that begin alike (the same system prompt and tool
list: every RestBench-TMDB query offers the same 54 functions) prefill that common prefix once; only
each prompt's own tail is computed per prompt. The last two such prefixes keep their KV cache
across calls, so the next step (or the next method on the same benchmark) does not recompute it. Greedy decoding (temperature 0) runs each prompt
once and copies the completion ``n`` times.

Guarantees: results come back in prompt order; token counts are exact (prompt tokens without
padding; completion tokens up to the token that completed a stop string or the end-of-turn token);
with ``seed`` sampling is reproducible for the same prompts, arguments and batch size, and the
global torch RNG is left untouched. Not guaranteed: bit-identical results between batched and
unbatched runs in low precision (padding changes the matmul shapes; in float32 greedy text matches).
"""

from __future__ import annotations

import logging
from typing import Any

from codetool import CodetoolError
from codetool.models.completion import (
    Completion,
    Constraints,
    Prompt,
    check_sampling,
    find_stop,
    per_prompt,
    to_messages,
)

logger = logging.getLogger(__name__)


# Prompts of one chunk that share at least this many leading tokens prefill them once.
MIN_SHARED_PREFIX = 64
# How many such prefixes (with their KV caches) are remembered across calls.
PREFIX_CACHE_SIZE = 2


def _common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest common prefix of ``rows``, leaving every row at least one own token."""
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def _stop_criteria(tokenizer, stop: list[str], prompt_len: int):
    """A StoppingCriteria that ends a sequence once its generated text contains a stop string."""
    import torch
    from transformers import StoppingCriteria

    # A token decodes to at least one character (byte-level pieces of a multi-byte character
    # excepted), so a stop string of c characters lies within the last c + 2 tokens.
    window = max(len(s) for s in stop) + 2

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            tails = input_ids[:, prompt_len:][:, -window:].tolist()
            texts = tokenizer.batch_decode(tails, skip_special_tokens=True)
            return torch.tensor([find_stop(t, stop) >= 0 for t in texts], dtype=torch.bool,
                                device=input_ids.device)

    return StopOnStrings()


class TransformersBackend:
    """An :class:`~codetool.models.completion.LLMBackend` over a local transformers causal LM.

    Args:
        model (`str` or `(model, tokenizer)`, *optional*, defaults to `"default"`): a name for
            :func:`~codetool.models.loading.load_model` or an already loaded pair.
        dtype (`str`, *optional*, defaults to `"auto"`): see ``load_model``.
        device (`str`, *optional*, defaults to `"auto"`): see ``load_model``.
        max_batch_size (`int`, *optional*, defaults to `8`): most sequences (prompts x samples)
            decoded together; one prompt's ``n`` samples always go together.
    """

    supports_logprobs = True
    share_prefill = True  # off only to test that sharing changes nothing

    def __init__(self, model: str | tuple[Any, Any] = "default", *, dtype: str = "auto",
                 device: str = "auto", max_batch_size: int = 8):
        if max_batch_size < 1:
            raise CodetoolError(f"max_batch_size must be >= 1, got {max_batch_size}.")
        if isinstance(model, tuple):
            # Used as given (neither its padding side nor train/eval mode is changed: call
            # model.eval() first if it has dropout).
            self.model, self.tokenizer = model
            self.name = f"transformers:{getattr(self.model.config, '_name_or_path', '') or 'model'}"
        else:
            from codetool.models.loading import load_model

            self.model, self.tokenizer = load_model(model, dtype=dtype, device=device)
            self.name = f"transformers:{model}"
        self.max_batch_size = max_batch_size
        self._prefixes: list[tuple[tuple[int, ...], Any]] = []  # (token ids, KV cache), newest last
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        # Padding is done here (on the left), so the tokenizer's own padding settings do not matter.
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (eos[0] if eos else 0)
        self._warned_no_template = False
        self._token_trie = None  # built on the first constrained call (codetool.models.call_mask)
        self._masks: Any = None

    @property
    def device(self):
        return self.model.device

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt`` rendered with the chat template and the assistant header; a final
        assistant message is continued (no end-of-turn after it)."""
        messages = to_messages(prompt)
        if getattr(self.tokenizer, "chat_template", None):
            if messages[-1]["role"] == "assistant":
                text = self.tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
            else:
                text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            if not self._warned_no_template:
                logger.warning("%s has no chat template; prompts are sent as plain text", self.name)
                self._warned_no_template = True
            text = "\n\n".join(m["content"] for m in messages)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _left_pad(self, rows: list[list[int]]):
        import torch

        width = max(len(r) for r in rows)
        pad = self.pad_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long,
                            device=self.device)
        return ids, mask

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: int | None = None,
                 constraint: Constraints = None) -> list[list[Completion]]:
        """``n`` completions per prompt; see :class:`~codetool.models.completion.LLMBackend`.

        Args:
            prompts (`list[Prompt]`): strings (one user message each) or chat message lists.
            n (`int`, *optional*, defaults to `1`): samples per prompt.
            temperature (`float`, *optional*, defaults to `0.0`): 0 is greedy (the ``n`` samples
                are then identical copies).
            top_p (`float`, *optional*, defaults to `1.0`): nucleus sampling mass; no top-k.
            max_new_tokens (`int`, *optional*, defaults to `256`): per completion.
            stop (`list[str]`, *optional*): stop strings, cut from the returned text.
            seed (`int`, *optional*): makes sampling reproducible.
            constraint (`CallConstraint` or `list`, *optional*): one for all prompts or one (or
                ``None``) per prompt; a logits mask keeps each reply's first statement a call of a
                listed function (:mod:`codetool.models.call_mask`).

        Returns:
            `list[list[Completion]]`: (len(prompts), n).
        """
        import torch

        check_sampling(n, temperature, top_p, max_new_tokens)
        stop = [s for s in (stop or []) if s]
        encoded = [self.encode(p) for p in prompts]
        constraints = per_prompt(constraint, len(prompts))
        greedy = temperature == 0
        samples = 1 if greedy else n
        per_chunk = max(1, self.max_batch_size // samples)
        results: list[list[Completion]] = [[] for _ in prompts]
        context = getattr(self.model.config, "max_position_embeddings", None) or 10**9
        for i, ids in enumerate(encoded):
            if len(ids) >= context:  # one oversized prompt must not sink the whole batch
                logger.warning("prompt %d has %d tokens, the model's context is %d: returning an empty "
                               "completion; shorten the prompt", i, len(ids), context)
                results[i] = [Completion("", len(ids), 0, "length") for _ in range(n)]
        order = sorted((i for i in range(len(prompts)) if not results[i]), key=lambda i: len(encoded[i]))
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(order), per_chunk):
                chunk = order[start:start + per_chunk]
                outs = self._generate_chunk([encoded[i] for i in chunk], samples, temperature, top_p,
                                            max_new_tokens, stop, [constraints[i] for i in chunk])
                for i, completions in zip(chunk, outs):
                    results[i] = completions if not greedy else [
                        Completion(**vars(completions[0])) for _ in range(n)]
        return results

    def _generate_chunk(self, rows: list[list[int]], samples: int, temperature: float, top_p: float,
                        max_new_tokens: int, stop: list[str], constraints: list | None = None
                        ) -> list[list[Completion]]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        ids, mask = self._left_pad(rows)
        width = ids.shape[1]
        context = getattr(self.model.config, "max_position_embeddings", None) or 10**9
        max_new_tokens = min(max_new_tokens, context - width)
        sampling = temperature > 0
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampling, repetition_penalty=1.0,
                                  pad_token_id=self.pad_id, eos_token_id=self.eos_ids)
        constrained = any(c is not None for c in constraints or [])
        processors = LogitsProcessorList()
        if sampling and constrained:
            # generate() runs custom processors after its own temperature and top-p: the mask must come
            # first (top-p could otherwise keep only forbidden tokens), so the warpers are ours here.
            from transformers import TemperatureLogitsWarper, TopPLogitsWarper

            config.update(temperature=1.0, top_p=1.0, top_k=0)
            processors.append(TemperatureLogitsWarper(temperature))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
        elif sampling:
            config.update(temperature=temperature, top_p=top_p, top_k=0)
        kwargs: dict[str, Any] = {}
        shared = _common_prefix(rows) if self.share_prefill else 0
        known = self._known_prefix(rows[0], shared)
        if known is not None:
            shared = len(known[0])
        if shared >= MIN_SHARED_PREFIX and (len(rows) > 1 or known is not None):
            # The prompts start alike (same system prompt and tools): that prefix runs once, each
            # prompt's own tail runs on a copy of its KV cache, then the samples share that.
            ids, mask = self._pad_after_prefix(rows, shared)
            width = ids.shape[1]
            kwargs["cache"] = self._prefill_shared(ids, mask, shared, known)
            kwargs["cache"].batch_repeat_interleave(samples)
            ids, mask = ids.repeat_interleave(samples, dim=0), mask.repeat_interleave(samples, dim=0)
        elif samples > 1 and self.share_prefill and width > 1:
            # Prefill once per prompt, then repeat the KV cache for the samples: generate() only
            # runs the last prompt token and the decoding steps.
            kwargs["cache"] = self._prefill(ids, mask).cache
            kwargs["cache"].batch_repeat_interleave(samples)
            ids, mask = ids.repeat_interleave(samples, dim=0), mask.repeat_interleave(samples, dim=0)
        else:
            config.num_return_sequences = samples
        if constrained:  # rows are prompt-major: prompt r's samples are rows r*samples .. r*samples+samples-1
            processors.insert(0, self._call_processor([c for c in constraints for _ in range(samples)], width))
        criteria = StoppingCriteriaList([_stop_criteria(self.tokenizer, stop, width)] if stop else [])
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                  stopping_criteria=criteria, logits_processor=processors, **kwargs)
        new_tokens = out[:, width:].tolist()
        return [[self._completion(new_tokens[r * samples + s], len(rows[r]), stop) for s in range(samples)]
                for r in range(len(rows))]

    def _call_processor(self, constraints: list, width: int):
        """The call-constraint logits processor for rows ``constraints`` (the token trie is built once
        per backend, ~1 s for a 49k vocabulary; masks are cached across calls)."""
        from collections import OrderedDict

        from codetool.models.call_mask import CallLogitsProcessor, TokenTrie

        if self._token_trie is None:
            self._token_trie, self._masks = TokenTrie(self.tokenizer), OrderedDict()
        vocab = self.model.get_output_embeddings().weight.shape[0]
        return CallLogitsProcessor(self._token_trie, constraints, width, vocab, self._masks)

    def _pad_after_prefix(self, rows: list[list[int]], shared: int):
        """``[shared prefix | padding | own tail]`` rows and their mask: the prefix lines up."""
        import torch

        tails = [r[shared:] for r in rows]
        width = max(len(t) for t in tails)
        ids = torch.tensor([r[:shared] + [self.pad_id] * (width - len(t)) + t for r, t in zip(rows, tails)],
                           dtype=torch.long, device=self.device)
        mask = torch.tensor([[1] * shared + [0] * (width - len(t)) + [1] * len(t) for t in tails],
                            dtype=torch.long, device=self.device)
        return ids, mask

    def _known_prefix(self, row: list[int], shared: int):
        """The longest remembered prefix (at least ``MIN_SHARED_PREFIX`` tokens) that starts ``row``
        and is no longer than ``shared`` (the chunk's common prefix), or ``None``."""
        best = None
        for key, cache in self._prefixes:
            if MIN_SHARED_PREFIX <= len(key) <= shared and tuple(row[:len(key)]) == key:
                if best is None or len(key) > len(best[0]):
                    best = (key, cache)
        return best

    def _prefill_shared(self, ids, mask, shared: int, known=None):
        """KV cache of all but the last token of each row, the first ``shared`` tokens computed once.

        That prefix's cache is remembered (the last ``PREFIX_CACHE_SIZE``): the next call whose
        prompts begin alike (the next step of the same queries, another method on the same
        benchmark) starts from a copy instead of recomputing it.
        """
        import copy

        from transformers import DynamicCache

        if known is not None:
            cache = copy.deepcopy(known[1])
        else:
            cache = self.model(input_ids=ids[:1, :shared], cache=DynamicCache(config=self.model.config),
                               use_cache=True, logits_to_keep=1).cache
            self._prefixes = [*self._prefixes, (tuple(ids[0, :shared].tolist()), copy.deepcopy(cache))
                              ][-PREFIX_CACHE_SIZE:]
        cache.batch_repeat_interleave(ids.shape[0])
        if ids.shape[1] - 1 > shared:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = self.model(input_ids=ids[:, shared:-1], attention_mask=mask[:, :-1],
                               position_ids=positions[:, shared:-1], cache=cache, use_cache=True,
                               logits_to_keep=1).cache
        return cache

    def _prefill(self, ids, mask):
        """Forward all but the last token of left-padded prompts; positions as generate() counts them."""
        from transformers import DynamicCache

        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                          cache=DynamicCache(config=self.model.config), use_cache=True, logits_to_keep=1)

    def _completion(self, tokens: list[int], prompt_tokens: int, stop: list[str]) -> Completion:
        """Trim one generated row (end of turn, padding, stop string) into a Completion."""
        finish, paid = "length", len(tokens)
        for j, token in enumerate(tokens):
            if token in self.eos_ids:  # the end-of-turn token counts but is not part of the text
                tokens, finish, paid = tokens[:j], "stop", j + 1
                break
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = find_stop(text, stop)
        if cut >= 0:
            # Smallest prefix of tokens whose text already holds a stop string: the tokens paid for.
            lo, hi = 1, len(tokens)
            while lo < hi:
                mid = (lo + hi) // 2
                if find_stop(self.tokenizer.decode(tokens[:mid], skip_special_tokens=True), stop) >= 0:
                    hi = mid
                else:
                    lo = mid + 1
            return Completion(text[:cut], prompt_tokens, lo, "stop")
        return Completion(text, prompt_tokens, paid, finish)

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """Log-probability (nats) of each option string as the start of the assistant's reply.

        Sums the log-probabilities of the option's tokens (tokenized on their own, after the
        chat template's assistant header); the prompt's KV cache is computed once and repeated
        for all options. An option that is a prefix of another scores at least as high; add an
        end marker to the options (e.g. a newline) when that matters.

        Returns:
            `list[list[float]]`: (len(prompts), len(options)), each <= 0.
        """
        import torch

        if not options:
            return [[] for _ in prompts]
        option_ids = [self.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
        if any(not ids for ids in option_ids):
            raise CodetoolError(f"option_logprobs: options must be non-empty strings, got {options!r:.200}.")
        width = max(len(ids) for ids in option_ids)
        pad = self.pad_id
        suffix = torch.tensor([ids + [pad] * (width - len(ids)) for ids in option_ids], device=self.device)
        scores: list[list[float]] = []
        with torch.inference_mode():
            for prompt in prompts:
                prefix = torch.tensor([self.encode(prompt)], device=self.device)
                out = self.model(input_ids=prefix, use_cache=True, logits_to_keep=1)
                first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # (vocab,)
                total = first[suffix[:, 0]]  # (options,)
                if width > 1:
                    cache = out.cache
                    cache.batch_repeat_interleave(len(options))
                    pos = torch.arange(prefix.shape[1], prefix.shape[1] + width - 1, device=self.device)
                    rest = self.model(input_ids=suffix[:, :-1], cache=cache, use_cache=True,
                                      position_ids=pos.expand(len(options), -1))
                    logp = torch.log_softmax(rest.logits.float(), dim=-1)  # (options, width-1, vocab)
                    picked = logp.gather(-1, suffix[:, 1:, None])[..., 0]  # (options, width-1)
                    valid = torch.tensor([[j < len(ids) for j in range(1, width)] for ids in option_ids],
                                         device=self.device)
                    total = total + torch.where(valid, picked, 0.0).sum(-1)
                scores.append(total.tolist())
        return scores
