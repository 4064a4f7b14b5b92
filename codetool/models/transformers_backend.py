"""Local generation with transformers: chat template, batched prompts, shared prefill, stop strings.

Efficiency (decoding many sequences together pays on a CPU too; figures in docs/BENCHMARKS.md): one
``generate`` call takes prompts from many queries; they are sorted by length (less padding),
left-padded and run in chunks of at most ``max_batch_size`` sequences. The ``n`` samples of a
prompt share one prefill: the prompt is run once and its KV cache repeated ``n`` times, so only
decoding is paid per sample. Prefill is paid once per prompt prefix: the KV cache of every prompt
is kept (``prompt_cache_mb``; eviction: :mod:`codetool.models.prompt_cache`),
and a later prompt that starts the same way (the next step of an episode, another method or seed
on the same query, a tree's children) computes only its new tokens; prompts of one chunk that begin
alike (the same system prompt and tool list: every RestBench-TMDB query offers the same 54
functions) compute that common prefix once. Greedy decoding (temperature 0) runs each prompt once
and copies the completion ``n`` times.

Guarantees: results come back in prompt order; token counts are exact (prompt tokens without
padding; completion tokens up to the token that completed a stop string or the end-of-turn token);
with ``seed`` sampling is reproducible for the same prompts, arguments and batch size, and the
global torch RNG is left untouched; with one seed per prompt (a list) each sequence draws from its
own generator, seeded by its prompt's seed and sample index, so a prompt's samples do not depend on
the other prompts of the call, their order or the chunking (up to float rounding: see below). Not guaranteed: bit-identical results between batched and
unbatched runs in low precision (padding changes the matmul shapes; in float32 greedy text matches).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from codetool import CodetoolError
from codetool.models.completion import (
    Completion,
    Constraints,
    Prompt,
    Seeds,
    check_sampling,
    find_stop,
    per_prompt,
    per_prompt_seeds,
    to_messages,
)
from codetool.models.kv import cache_kwargs, output_cache
from codetool.models.memory import release_host_memory
from codetool.models.prompt_cache import PromptCache, PromptKV

if TYPE_CHECKING:
    from codetool.models.call_mask import TokenTrie

logger = logging.getLogger(__name__)


# Prompts of one chunk that share at least this many leading tokens prefill them once.
MIN_SHARED_PREFIX = 64


def _common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest common prefix of ``rows``, leaving every row at least one own token."""
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def row_seed(seed: int | None, sample: int) -> int | None:
    """The generator seed of sample ``sample`` of a prompt seeded ``seed`` (``None`` stays ``None``)."""
    return None if seed is None else (seed * 1_000_003 + sample) % (1 << 63)


class _RowDraws:
    """A logits processor that draws each row's next token from the (already warped) distribution
    with that row's own ``torch.Generator`` and leaves only that token possible, so ``generate``
    (run greedy) takes it. A row's draws then depend on its seed alone, not on the rows beside it.
    A row seeded ``None`` draws from a generator seeded by the global RNG (not reproducible)."""

    def __init__(self, seeds: list[int | None], device):
        import torch

        self.generators = []
        for seed in seeds:
            generator = torch.Generator(device=device)
            generator.manual_seed(int(torch.randint(0, 1 << 62, ()).item()) if seed is None else seed)
            self.generators.append(generator)

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(scores.float(), dim=-1)  # (rows, vocab)
        picks = torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.generators)])
        chosen = torch.full_like(scores, float("-inf"))
        chosen[torch.arange(len(picks), device=scores.device), picks] = 0.0
        return chosen


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
        prompt_cache_mb (`float`, *optional*, defaults to `1024`): memory (MiB, on the model's
            device) for the KV caches of earlier prompts, reused by later prompts that start the
            same way (:mod:`codetool.models.prompt_cache`); 0 turns it off. The embedded 135M
            model in float32 needs 46 KiB per token, a 7B model in bfloat16 about 56 KiB.
    """

    supports_logprobs = True
    share_prefill = True  # off only to test that sharing changes nothing

    def __init__(self, model: str | tuple[Any, Any] = "default", *, dtype: str = "auto",
                 device: str = "auto", max_batch_size: int = 8, prompt_cache_mb: float = 1024):
        if max_batch_size < 1:
            raise CodetoolError(f"max_batch_size must be >= 1, got {max_batch_size}.")
        if prompt_cache_mb < 0:
            raise CodetoolError(f"prompt_cache_mb must be >= 0 (0: no prompt cache), got {prompt_cache_mb}.")
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
        self.prompt_cache = PromptCache(int(prompt_cache_mb * 2**20))
        self._plain_cache: bool | None = None  # whether the model's KV cache can be stored (see _cacheable)
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        # Padding is done here (on the left), so the tokenizer's own padding settings do not matter.
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (eos[0] if eos else 0)
        self._warned_no_template = False
        self._token_trie: TokenTrie | None = None  # built on the first constrained call (codetool.models.call_mask)
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
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
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
            seed (`int` or `list`, *optional*): makes sampling reproducible; one per prompt makes
                each prompt's samples independent of the rest of the call.
            constraint (`CallConstraint` or `list`, *optional*): one for all prompts or one (or
                ``None``) per prompt; a logits mask keeps each reply's first statement a call of a
                listed function (:mod:`codetool.models.call_mask`).

        Returns:
            `list[list[Completion]]`: (len(prompts), n).
        """
        return self.generate_ids([self.encode(p) for p in prompts], n=n, temperature=temperature, top_p=top_p,
                                 max_new_tokens=max_new_tokens, stop=stop, seed=seed, constraint=constraint)

    def generate_ids(self, prompts: list[list[int]], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                     max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
                     constraint: Constraints = None) -> list[list[Completion]]:
        """:meth:`generate` from prompts given as token ids (no chat template applied): what policy
        RL needs, whose episode rows grow by the exact ids sampled (``codetool.policy.rollout``).
        Each :class:`Completion` carries its ``token_ids``; arguments as :meth:`generate`."""
        import torch

        check_sampling(n, temperature, top_p, max_new_tokens)
        stop = [s for s in (stop or []) if s]
        encoded = [list(p) for p in prompts]
        constraints = per_prompt(constraint, len(prompts))
        greedy = temperature == 0
        # One seed per prompt: each sequence samples from its own generator (None: the call's draws).
        row_seeds = per_prompt_seeds(seed, len(prompts)) if isinstance(seed, (list, tuple)) and not greedy else None
        if row_seeds is not None:
            seed = None
        samples = 1 if greedy else n
        per_chunk = max(1, self.max_batch_size // samples)
        results: list[list[Completion]] = [[] for _ in prompts]
        context = getattr(self.model.config, "max_position_embeddings", None) or 10**9
        for i, ids in enumerate(encoded):
            if len(ids) >= context:  # one oversized prompt must not sink the whole batch
                logger.warning("prompt %d has %d tokens, the model's context is %d: returning an empty "
                               "completion; shorten the prompt", i, len(ids), context)
                results[i] = [Completion("", len(ids), 0, "length", []) for _ in range(n)]
        order = sorted((i for i in range(len(prompts)) if not results[i]), key=lambda i: len(encoded[i]))
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(order), per_chunk):
                chunk = order[start:start + per_chunk]
                outs = self._generate_chunk([encoded[i] for i in chunk], samples, temperature, top_p,
                                            max_new_tokens, stop, [constraints[i] for i in chunk],
                                            None if row_seeds is None else [row_seeds[i] for i in chunk])
                for i, completions in zip(chunk, outs):
                    results[i] = completions if not greedy else [
                        Completion(**{**vars(completions[0]), "token_ids": list(completions[0].token_ids or [])})
                        for _ in range(n)]
        if self.device.type == "cpu":
            release_host_memory()  # decoding fragments the heap (see codetool.models.memory)
        return results

    def _generate_chunk(self, rows: list[list[int]], samples: int, temperature: float, top_p: float,
                        max_new_tokens: int, stop: list[str], constraints: list | None = None,
                        seeds: list[int | None] | None = None) -> list[list[Completion]]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        ids, mask = self._left_pad(rows)
        width = ids.shape[1]
        context = getattr(self.model.config, "max_position_embeddings", None) or 10**9
        max_new_tokens = min(max_new_tokens, context - width)
        sampling = temperature > 0
        own_draws = sampling and seeds is not None  # per-row generators pick the token; generate() is greedy
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampling and not own_draws,
                                  repetition_penalty=1.0, pad_token_id=self.pad_id, eos_token_id=self.eos_ids)
        constrained = any(c is not None for c in constraints or [])
        processors = LogitsProcessorList()
        if sampling and (constrained or own_draws):
            # generate() runs custom processors after its own temperature and top-p: the mask must come
            # first (top-p could otherwise keep only forbidden tokens), so the warpers are ours here.
            from transformers import TemperatureLogitsWarper, TopPLogitsWarper

            if not own_draws:
                config.update(temperature=1.0, top_p=1.0, top_k=0)
            processors.append(TemperatureLogitsWarper(temperature))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
        elif sampling:
            config.update(temperature=temperature, top_p=top_p, top_k=0)
        kwargs: dict[str, Any] = {}
        if self.share_prefill and self._cacheable():
            # Each prompt starts from its longest remembered prefix (an earlier step, another method
            # or seed on the same query) or from the chunk's common prefix, run once; only the rest
            # is computed, and the samples of a prompt share its KV cache.
            ids, mask, cache = self._prefill(rows)
            kwargs.update(cache_kwargs(cache))
            width = ids.shape[1]
            if samples > 1:
                cache.batch_repeat_interleave(samples)
                ids, mask = ids.repeat_interleave(samples, dim=0), mask.repeat_interleave(samples, dim=0)
        else:
            config.num_return_sequences = samples
        if constrained:  # rows are prompt-major: prompt r's samples are rows r*samples .. r*samples+samples-1
            processors.insert(0, self._call_processor([c for c in constraints or [] for _ in range(samples)], width))
        if own_draws and seeds is not None:
            processors.append(_RowDraws([row_seed(s, i) for s in seeds for i in range(samples)], self.device))
        criteria = StoppingCriteriaList([_stop_criteria(self.tokenizer, stop, width)] if stop else [])
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                  stopping_criteria=criteria, logits_processor=processors, **kwargs)
        new_tokens = out[:, width:].tolist()
        return [[self._completion(new_tokens[r * samples + s], len(rows[r]), stop) for s in range(samples)]
                for r in range(len(rows))]

    def _call_processor(self, constraints: list, width: int):
        """The call-constraint logits processor for rows ``constraints`` (the token trie is built once
        per backend; masks are cached across calls)."""
        from collections import OrderedDict

        from codetool.models.call_mask import CallLogitsProcessor, TokenTrie

        trie = self._token_trie
        if trie is None:
            trie = self._token_trie = TokenTrie(self.tokenizer)
            self._masks = OrderedDict()
        vocab = self.model.get_output_embeddings().weight.shape[0]
        return CallLogitsProcessor(trie, constraints, width, vocab, self._masks)

    def _cacheable(self) -> bool:
        """Whether this model's KV cache is a plain full-attention one (prompt caching applies)."""
        if self._plain_cache is None:
            from transformers import DynamicCache
            from transformers.cache_utils import DynamicLayer

            layers = DynamicCache(config=self.model.config).layers
            self._plain_cache = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
        return self._plain_cache

    def _prefix_kv(self, tokens: list[int]):
        """The :class:`PromptKV` of ``tokens`` (one forward of one row), stored in the prompt cache."""
        import torch
        from transformers import DynamicCache

        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        cache = output_cache(self.model(input_ids=ids, **cache_kwargs(DynamicCache(config=self.model.config)),
                                        use_cache=True, logits_to_keep=1))
        entry = PromptKV([layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers])
        self.prompt_cache.put(tuple(tokens), entry)
        return entry

    def _prefill(self, rows: list[list[int]]):
        """Left-padded ``ids``/``mask`` of ``rows`` and the KV cache of all but their last token.

        Row i reuses the longest prefix ``c_i`` found in :attr:`prompt_cache` (or the chunk's
        common prefix, computed once when it is longer) and computes only its own tail. Layout per
        row: ``[padding | c_i cached tokens | padding | tail]``, the cached parts ending at one
        column P and the tails at the right edge; the mask hides both paddings and positions count
        real tokens only, so every row sees what an unpadded run would see. Each row's whole prompt
        (but its last token, which ``generate`` runs) is then stored for later calls.
        """
        import torch
        from transformers import DynamicCache

        store = self.prompt_cache
        hits = [store.longest(r, len(r) - 1) for r in rows]
        shared = _common_prefix(rows) if len(rows) > 1 else 0
        if shared >= MIN_SHARED_PREFIX and any(n < shared for n, _ in hits):
            key = tuple(rows[0][:shared])
            entry = store.get(key) or self._prefix_kv(rows[0][:shared])
            hits = [(shared, entry) if n < shared else (n, e) for n, e in hits]
        cached = max(n for n, _ in hits)
        tail = max(len(r) - n for r, (n, _) in zip(rows, hits))
        pad = self.pad_id
        ids = torch.tensor([[pad] * (cached - n) + r[:n] + [pad] * (tail - len(r) + n) + r[n:]
                            for r, (n, _) in zip(rows, hits)], dtype=torch.long, device=self.device)
        mask = torch.tensor([[0] * (cached - n) + [1] * n + [0] * (tail - len(r) + n) + [1] * (len(r) - n)
                             for r, (n, _) in zip(rows, hits)], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)
        if cached:
            some = next(e for _, e in hits if e is not None)
            chains = [e.parts() if n and e is not None else [] for n, e in hits]
            for layer in range(len(some.keys)):
                shape = (len(rows), some.keys[layer].shape[0], cached, some.keys[layer].shape[-1])
                k = some.keys[layer].new_zeros(shape)
                v = some.values[layer].new_zeros(shape)
                for i, ((n, _), chain) in enumerate(zip(hits, chains)):
                    at = cached - n  # an entry found is a whole prefix: its chain's tokens are its n tokens
                    for part in chain:
                        size = part.keys[layer].shape[1]
                        k[i, :, at:at + size] = part.keys[layer]
                        v[i, :, at:at + size] = part.values[layer]
                        at += size
                cache.update(k, v, layer)
        width = ids.shape[1]
        if width - 1 > cached:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = output_cache(self.model(input_ids=ids[:, cached:-1], attention_mask=mask[:, :-1],
                                            position_ids=positions[:, cached:-1], **cache_kwargs(cache),
                                            use_cache=True, logits_to_keep=1))
        hit = sum(n for n, _ in hits)
        store.note(hit, sum(len(r) for r in rows) - hit)
        if store.max_bytes and width > 1:  # (one-token prompts leave nothing to store)
            for i, (r, (n, e)) in enumerate(zip(rows, hits)):
                if n == len(r) - 1:
                    continue  # the whole prompt (but its last token) is stored already
                # Only the row's own tail is new: the entry extends the one it was found from.
                own = slice(width - (len(r) - n), width - 1)
                entry = PromptKV([layer.keys[i][:, own].clone() for layer in cache.layers],
                                 [layer.values[i][:, own].clone() for layer in cache.layers], base=e if n else None)
                store.put(tuple(r[:-1]), entry)
        return ids, mask, cache

    def _completion(self, tokens: list[int], prompt_tokens: int, stop: list[str]) -> Completion:
        """Trim one generated row (end of turn, padding, stop string) into a Completion."""
        finish, paid = "length", len(tokens)
        tokens_all = tokens  # paid ids: up to and including the end-of-turn token
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
            return Completion(text[:cut], prompt_tokens, lo, "stop", tokens[:lo])
        return Completion(text, prompt_tokens, paid, finish, list(tokens_all[:paid]))

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
                    cache = output_cache(out)
                    cache.batch_repeat_interleave(len(options))
                    pos = torch.arange(prefix.shape[1], prefix.shape[1] + width - 1, device=self.device)
                    rest = self.model(input_ids=suffix[:, :-1], **cache_kwargs(cache), use_cache=True,
                                      position_ids=pos.expand(len(options), -1))
                    logp = torch.log_softmax(rest.logits.float(), dim=-1)  # (options, width-1, vocab)
                    picked = logp.gather(-1, suffix[:, 1:, None])[..., 0]  # (options, width-1)
                    valid = torch.tensor([[j < len(ids) for j in range(1, width)] for ids in option_ids],
                                         device=self.device)
                    total = total + torch.where(valid, picked, 0.0).sum(-1)
                scores.append(total.tolist())
        return scores
