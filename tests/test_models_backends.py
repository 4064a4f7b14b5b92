"""TransformersBackend, ScriptedBackend and make_backend on the tiny model."""

from __future__ import annotations

import sys

import pytest
import torch

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.models.backends import (
    BACKENDS,
    Completion,
    LLMBackend,
    OpenAIBackend,
    ScriptedBackend,
    TransformersBackend,
    make_backend,
)
from codetool.models.loading import DEFAULT_MODEL, resolve_model
from codetool.models.spec import ModelSpec

PROMPTS = ["hello", "What is the weather in Paris today? Give the answer with finish.",
           [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "print 1"}]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model's matmuls are too small to split; a second thread only waits on a busy CPU.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return TransformersBackend(str(tiny_model_dir), max_batch_size=8)


def texts(results):
    return [[c.text for c in row] for row in results]


def greedy_tokens(backend, prompt, max_new_tokens):
    """Reference: plain model.generate on one unpadded prompt."""
    ids = torch.tensor([backend.encode(prompt)])
    out = backend.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=backend.eos_ids,
                                 pad_token_id=backend.tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def test_is_an_llm_backend(backend):
    assert isinstance(backend, LLMBackend) and isinstance(ScriptedBackend(["x"]), LLMBackend)
    assert isinstance(OpenAIBackend("http://127.0.0.1:9"), LLMBackend)


def test_shapes_and_prompt_tokens(backend):
    results = backend.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=6, seed=0)
    assert [len(row) for row in results] == [3, 3, 3]
    for prompt, row in zip(PROMPTS, results):
        for c in row:
            assert isinstance(c, Completion)
            assert c.prompt_tokens == len(backend.encode(prompt))
            assert 1 <= c.completion_tokens <= 6 and c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert c.completion_tokens == 6


def test_string_prompt_is_one_user_message(backend):
    assert backend.encode("hi there") == backend.encode([{"role": "user", "content": "hi there"}])
    text = backend.tokenizer.decode(backend.encode("hi there"))
    assert text.startswith("<|im_start|>user\nhi there<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_greedy_matches_reference_and_counts_exactly(backend):
    for prompt in PROMPTS:
        ref = greedy_tokens(backend, prompt, 12)
        [[c]] = backend.generate([prompt], max_new_tokens=12)
        eos = [i for i, t in enumerate(ref) if t in backend.eos_ids]
        kept = ref[:eos[0]] if eos else ref
        assert c.text == backend.tokenizer.decode(kept, skip_special_tokens=True)
        assert c.completion_tokens == (eos[0] + 1 if eos else len(ref))
        assert c.finish_reason == ("stop" if eos else "length")


def test_greedy_n_gives_identical_copies(backend):
    [row] = backend.generate(["hello"], n=4, max_new_tokens=8)
    assert len({c.text for c in row}) == 1 and len({id(c) for c in row}) == 4


def test_end_of_turn_token_stops_and_counts(backend):
    first = greedy_tokens(backend, "hello", 3)[0]
    saved = backend.eos_ids
    backend.eos_ids = [first]  # make the first greedy token the end-of-turn token
    try:
        [[c]] = backend.generate(["hello"], max_new_tokens=10)
    finally:
        backend.eos_ids = saved
    assert (c.text, c.completion_tokens, c.finish_reason) == ("", 1, "stop")


def test_stop_string_cuts_text_and_counts_tokens(backend):
    [[full]] = backend.generate([PROMPTS[1]], max_new_tokens=24)
    tokens = greedy_tokens(backend, PROMPTS[1], 24)
    stop = full.text[5:7]
    assert len(stop) == 2 and full.text.find(stop) >= 0
    [[cut]] = backend.generate([PROMPTS[1]], max_new_tokens=24, stop=["NEVER-THERE", stop])
    assert cut.text == full.text[:full.text.find(stop)] and cut.finish_reason == "stop"
    # Tokens paid: the shortest prefix whose text holds the stop string.
    need = next(k for k in range(1, len(tokens) + 1)
                if stop in backend.tokenizer.decode(tokens[:k], skip_special_tokens=True))
    assert cut.completion_tokens == need


def test_stop_applies_to_every_sample(backend):
    results = backend.generate(PROMPTS[:2], n=3, temperature=1.5, max_new_tokens=16, stop=["e"], seed=3)
    for row in results:
        for c in row:
            assert "e" not in c.text
            assert c.finish_reason == "stop" or c.completion_tokens == 16


def test_batched_equals_unbatched_greedy(backend, tiny_model_dir):
    batched = backend.generate(PROMPTS, max_new_tokens=16)
    single = [backend.generate([p], max_new_tokens=16)[0] for p in PROMPTS]
    assert batched == single
    small = TransformersBackend((backend.model, backend.tokenizer), max_batch_size=1)
    assert small.generate(PROMPTS, max_new_tokens=16) == batched


def test_pair_is_used_as_given(backend):
    # A training tokenizer (right padding) shared with the backend is not modified, and padding
    # still goes on the left.
    reference = backend.generate(PROMPTS, max_new_tokens=8)
    backend.tokenizer.padding_side = "right"
    try:
        shared = TransformersBackend((backend.model, backend.tokenizer))
        assert shared.generate(PROMPTS, max_new_tokens=8) == reference
        assert backend.tokenizer.padding_side == "right"
    finally:
        backend.tokenizer.padding_side = "left"


def test_seed_reproducible_and_rng_untouched(backend):
    state = torch.get_rng_state()
    a = backend.generate(PROMPTS, n=2, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=11)
    b = backend.generate(PROMPTS, n=2, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=11)
    c = backend.generate(PROMPTS, n=2, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=12)
    assert texts(a) == texts(b) and texts(a) != texts(c)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("constrained", [False, True])
def test_per_prompt_seeds_make_each_prompt_s_samples_independent_of_its_batch(backend, constrained):
    """Issue 39: with one seed per prompt, a prompt's samples depend on its own seed only, not on
    which prompts share the call, their order, or the chunking (a tree's nodes must not depend on
    the trees batched with it)."""
    from codetool.models.constraint import CallConstraint

    kwargs = dict(n=2, temperature=1.0, top_p=0.9, max_new_tokens=8)
    if constrained:
        kwargs["constraint"] = CallConstraint(("forecast", "lookup"))
    together = backend.generate(PROMPTS, seed=[11, 12, 13], **kwargs)
    alone = [backend.generate([p], seed=[s], **kwargs)[0] for p, s in zip(PROMPTS, [11, 12, 13])]
    reordered = backend.generate(PROMPTS[::-1], seed=[13, 12, 11], **kwargs)[::-1]
    small = TransformersBackend((backend.model, backend.tokenizer), max_batch_size=2)  # other chunks
    chunked = small.generate(PROMPTS, seed=[11, 12, 13], **kwargs)
    assert texts(together) == texts(alone) == texts(reordered) == texts(chunked)
    assert texts(backend.generate(PROMPTS[:1], seed=[99], **kwargs)) != texts(together[:1])
    state = torch.get_rng_state()
    backend.generate(PROMPTS, seed=[1, 2, 3], **kwargs)
    assert torch.equal(state, torch.get_rng_state())


def test_samples_differ_when_sampling(backend):
    [row] = backend.generate(["hello"], n=4, temperature=1.0, max_new_tokens=8, seed=0)
    assert len({c.text for c in row}) > 1


def test_shared_prefill_changes_nothing(backend):
    shared = backend.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=10, seed=5)
    backend.share_prefill = False
    try:
        plain = backend.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=10, seed=5)
    finally:
        backend.share_prefill = True
    assert shared == plain


@pytest.mark.parametrize("n, temperature", [(1, 0.0), (3, 1.0)])
def test_prompt_prefixes_are_prefilled_once_and_change_nothing(backend, monkeypatch, n, temperature):
    from codetool.models import transformers_backend as tb

    system = "You may call these functions: " + " ".join(f"tool_{i}(x) returns item {i}." for i in range(40))
    prompts = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
               for q in ("sort a list", "reverse the words of a long sentence please", "hi")]
    # the next step of two of them: the prompt, one reply and one observation
    steps = [p + [{"role": "assistant", "content": "```python\nprint(1)\n```"},
                  {"role": "user", "content": "Output:\n1"}] for p in prompts[1:]]
    encoded = [backend.encode(p) for p in prompts]
    assert tb._common_prefix(encoded) >= tb.MIN_SHARED_PREFIX
    widths = []
    forward = backend.model.forward
    monkeypatch.setattr(backend.model, "forward", lambda *a, **k: widths.append(k["input_ids"].shape) or forward(*a, **k))
    backend.prompt_cache.clear()
    shared = backend.generate(prompts, n=n, temperature=temperature, max_new_tokens=6, seed=3)
    assert widths[0][0] == 1  # the common prefix, once
    assert widths[1][0] <= 3 and widths[1][1] < max(map(len, encoded)) - tb._common_prefix(encoded) + 1  # own tails
    widths.clear()
    again = backend.generate(prompts[1:], n=n, temperature=temperature, max_new_tokens=6, seed=3)
    assert widths[0][1] == 1  # whole prompts remembered: generate runs only their last token
    widths.clear()
    later = backend.generate(steps, n=n, temperature=temperature, max_new_tokens=6, seed=3)
    extension = len(backend.encode(steps[0])) - len(encoded[1])
    assert widths[0][1] <= extension + 1  # only the new reply and observation
    assert backend.prompt_cache.hit_tokens > backend.prompt_cache.miss_tokens
    backend.share_prefill = False
    try:
        plain = backend.generate(prompts, n=n, temperature=temperature, max_new_tokens=6, seed=3)
        plain_again = backend.generate(prompts[1:], n=n, temperature=temperature, max_new_tokens=6, seed=3)
        plain_later = backend.generate(steps, n=n, temperature=temperature, max_new_tokens=6, seed=3)
    finally:
        backend.share_prefill = True
    assert texts(shared) == texts(plain) and texts(again) == texts(plain_again)
    assert texts(later) == texts(plain_later)
    assert [[c.prompt_tokens for c in row] for row in shared] == [[len(e)] * n for e in encoded]


def test_prompt_cache_keeps_the_budget_and_evicts_entries_that_served_nothing_first():
    import torch

    from codetool.models.prompt_cache import PromptCache, PromptKV

    def entry(length):  # 2 layers, (kv_heads=1, length, head_dim=4) float32: 64 bytes per token
        return PromptKV([torch.zeros(1, length, 4)] * 2, [torch.zeros(1, length, 4)] * 2)

    cache = PromptCache(max_bytes=64 * 10, protected_share=0.5)
    cache.put((1, 2, 3), entry(3))
    cache.put((1, 2, 3, 4, 5), entry(5))
    assert cache.longest([1, 2, 3, 4, 5, 6], limit=5)[0] == 5  # (1..5) served a prompt: protected
    assert cache.longest([1, 2, 3, 4, 5, 6], limit=4)[0] == 3  # the last token is never taken
    assert cache.longest([9, 2, 3], limit=2) == (0, None)
    # (1, 2, 3) was used last but (1..5) is over the protected half: it goes back to probation
    cache.put((7, 8, 9), entry(3))  # 11 tokens > 10: the least recently used on probation, (1..5), goes
    assert len(cache) == 2 and cache.nbytes == 64 * 6
    assert cache.longest([1, 2, 3, 4, 5, 6], limit=5)[0] == 3
    cache.put((4, 4, 4, 4), entry(4))  # 10 tokens: fits
    cache.put((5, 5), entry(2))  # evicts from probation ((7, 8, 9), the oldest there), keeps (1, 2, 3)
    assert cache.get((1, 2, 3)) is not None and cache.get((7, 8, 9)) is None and cache.nbytes == 64 * 9
    PromptCache(0).put((1,), entry(1))  # off: stores nothing
    with pytest.raises(ValueError, match="max_bytes"):
        PromptCache(-1)


def test_common_prefix_leaves_every_row_a_token():
    from codetool.models.transformers_backend import _common_prefix

    assert _common_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2
    assert _common_prefix([[1, 2], [3, 4]]) == 0


def test_option_logprobs_sums_option_tokens(backend):
    options = ["def", "import math", "x = 1\n"]
    prompts = ["hello", PROMPTS[2]]
    scores = backend.option_logprobs(prompts, options)
    assert len(scores) == 2 and all(len(row) == 3 for row in scores)
    for prompt, row in zip(prompts, scores):
        head = backend.encode(prompt)
        for option, score in zip(options, row):
            tail = backend.tokenizer(option, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([head + tail])
            with torch.no_grad():
                logp = torch.log_softmax(backend.model(ids).logits[0].float(), dim=-1)
            manual = sum(logp[len(head) + j - 1, t].item() for j, t in enumerate(tail))
            assert score == pytest.approx(manual, abs=1e-4) and score < 0


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n "), ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_arguments(backend, kwargs, message):
    with pytest.raises(CodetoolError, match=message):
        backend.generate(["hi"], **kwargs)


def test_prompt_longer_than_context(backend, caplog):
    long = "x " * 5000  # the tiny model's context is 4096 positions
    results = backend.generate(["hello", long], n=2, max_new_tokens=4)
    assert results[0][0].completion_tokens > 0 and results[0][0].text == backend.generate(["hello"], max_new_tokens=4)[0][0].text
    assert [(c.text, c.completion_tokens, c.finish_reason) for c in results[1]] == [("", 0, "length")] * 2
    assert "shorten the prompt" in caplog.text


def test_bad_message_is_clear(backend):
    with pytest.raises(CodetoolError, match="'role' and 'content'"):
        backend.generate([[{"text": "hi"}]])


def test_scripted_backend_in_order_with_stop_and_length():
    b = ScriptedBackend(["one two three", "alpha\n```\nbeta", "x"])
    [[c1, c2]] = b.generate(["p1"], n=2, stop=["```"])
    [[c3]] = b.generate(["p2"], max_new_tokens=5)
    assert (c1.text, c1.completion_tokens, c1.finish_reason) == ("one two three", 3, "stop")
    assert c2.text == "alpha\n" and c3.text == "x"
    assert len(b.calls) == 2 and b.calls[0][1]["n"] == 2
    with pytest.raises(CodetoolError, match="ran out"):
        b.generate(["p3"])
    [[short]] = ScriptedBackend(["a b c d"]).generate(["p"], max_new_tokens=2)
    assert (short.text, short.completion_tokens, short.finish_reason) == ("a b", 2, "length")


def test_scripted_backend_function_cycle_and_options():
    b = ScriptedBackend(lambda p: f"echo {p}")
    assert texts(b.generate(["a", "b"])) == [["echo a"], ["echo b"]]
    cyc = ScriptedBackend(["x", "y"], cycle=True)
    assert texts(cyc.generate(["p"], n=3)) == [["x", "y", "x"]]
    with pytest.raises(NotImplementedError):
        cyc.option_logprobs(["p"], ["a"])
    scored = ScriptedBackend(["x"], option_scores=lambda p, opts: [-float(i) for i in range(len(opts))])
    assert scored.supports_logprobs and scored.option_logprobs(["p"], ["a", "b"]) == [[0.0, -1.0]]


def test_make_backend_dispatch(tiny_model_dir, monkeypatch):
    assert isinstance(make_backend(ModelSpec.parse(str(tiny_model_dir))), TransformersBackend)
    http = make_backend(ModelSpec.parse("http://127.0.0.1:9", remote_model="m"), retries=0)
    assert isinstance(http, OpenAIBackend) and http.base_url == "http://127.0.0.1:9/v1" and http.model == "m"
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(CodetoolError, match="pip install 'codetool\\[vllm\\]'") as e:
        make_backend(ModelSpec.parse("vllm:default"))
    assert "\n" not in str(e.value)


def test_make_backend_takes_a_parsed_spec_of_a_language_model():
    with pytest.raises(TypeError, match="parsed ModelSpec"):
        make_backend("default")
    with pytest.raises(ConfigError, match="not a language model"):
        make_backend(ModelSpec.parse("rollout", role="prm"))
    with pytest.raises(ConfigError, match="not a language model"):
        make_backend(ModelSpec.parse("http://h:8600", role="prm"))


def test_make_backend_options_extend_and_override_the_spec(monkeypatch):
    seen = []
    monkeypatch.setitem(BACKENDS, "transformers", lambda location, **kw: seen.append((location, kw)) or "T")
    spec = ModelSpec.parse("some/model", dtype="bfloat16", max_batch_size=4)
    assert make_backend(spec, max_batch_size=8, prompt_cache_mb=0) == "T"
    assert seen == [("some/model", {"dtype": "bfloat16", "max_batch_size": 8, "prompt_cache_mb": 0})]


@pytest.mark.slow
def test_real_default_model_generates():
    try:
        resolve_model(DEFAULT_MODEL)
    except CodetoolError:
        pytest.skip("the default model is not cached; run `codetool setup`")
    backend = make_backend(ModelSpec.parse(DEFAULT_MODEL))
    [[c]] = backend.generate(["What is 2 + 2? Answer with one number."], max_new_tokens=16)
    assert "4" in c.text and c.completion_tokens > 0 and c.prompt_tokens > 10
    [row] = backend.generate(["Write a haiku."], n=2, temperature=0.9, top_p=0.95, max_new_tokens=12, seed=0)
    assert len(row) == 2 and all(c.text for c in row)


def test_host_memory_is_handed_back_without_error():
    from codetool.models.memory import release_host_memory

    blocks = [bytearray(1 << 20) for _ in range(64)]  # 64 MiB of small-ish heap blocks, then freed
    del blocks
    assert isinstance(release_host_memory(collect=True), bool)


def test_prefill_of_one_token_prompts_stores_nothing(backend):
    ids, mask, cache = backend._prefill([[5], [7]])
    assert ids.shape == (2, 1) and mask.tolist() == [[1], [1]] and cache.get_seq_length() == 0


def test_an_entry_that_extends_another_holds_its_own_tokens_and_its_base_outlives_it():
    from codetool.models.prompt_cache import PromptCache, PromptKV

    def entry(length, base=None):  # 1 layer, (kv_heads=1, length, head_dim=4) float32: 32 bytes per token
        return PromptKV([torch.arange(length * 4.0).reshape(1, length, 4)], [torch.zeros(1, length, 4)], base=base)

    cache = PromptCache(max_bytes=32 * 8, protected_share=0.5)
    root = entry(3)
    cache.put((1, 2, 3), root)
    child = entry(2, base=root)
    cache.put((1, 2, 3, 4, 5), child)
    assert cache.nbytes == 32 * 5 and child.length == 5 and child.parts() == [root, child]
    assert cache.longest([1, 2, 3, 4, 5, 6], limit=5) == (5, child)
    cache.put((9, 9, 9), entry(3))  # 8 tokens: fits
    cache.put((8,), entry(1))  # 9 > 8: the oldest leaf goes, (9, 9, 9); the root, extended, stays
    assert cache.get((9, 9, 9)) is None and cache.get((1, 2, 3)) is root and cache.nbytes == 32 * 6
    cache.put((7, 7, 7), entry(3))  # 9 > 8: leaves by age: (8,) first (the root and child were used since)
    assert cache.get((8,)) is None and cache.nbytes == 32 * 8
    cache.put((6, 6), entry(2))  # the child is the oldest leaf on probation (the root was used since): it goes
    assert cache.get((1, 2, 3, 4, 5)) is None and root.extensions == 0 and len(cache) == 3 and cache.nbytes == 32 * 8
    cache.clear()
    cache.put((1, 2, 3, 4, 5, 6), entry(1, base=child))  # its base is gone: stored whole, the chain copied in
    kept = cache.get((1, 2, 3, 4, 5, 6))
    assert kept is not None and kept.base is None and kept.length == 6 and cache.nbytes == 32 * 6
    assert torch.equal(kept.keys[0][:, :3], root.keys[0]) and torch.equal(kept.keys[0][:, 3:5], child.keys[0])


@pytest.fixture
def fresh(tiny_model_dir):
    return TransformersBackend(str(tiny_model_dir), max_batch_size=8)


def test_episodes_in_flight_hold_each_token_once_and_recompute_only_new_tokens(fresh):
    """Three episodes of three steps (each prompt the last one plus a reply and an observation)
    under a budget that holds their distinct tokens but not a copy of every step's prompt: every
    step computes only its new tokens, and greedy text is what an uncached run gives."""
    system = "You may call these functions: " + " ".join(f"tool_{i}(x) returns item {i}." for i in range(30))
    episodes = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
                for q in ("sort a list", "reverse the words of a long sentence please", "hi")]
    steps = [[e + [m for s in range(t) for m in ({"role": "assistant", "content": f"```python\nprint({s})\n```"},
                                                  {"role": "user", "content": f"Output:\n{s} and more"})]
              for e in episodes] for t in range(3)]
    encoded = [[fresh.encode(p) for p in step] for step in steps]
    distinct = len(set(tuple(r[:i]) for step in encoded for r in step for i in range(1, len(r))))
    per_token = fresh._prefix_kv([1, 2]).nbytes // 2  # keys and values of one token, every layer
    fresh.prompt_cache = type(fresh.prompt_cache)(max_bytes=per_token * distinct)
    cached = []
    for t, step in enumerate(steps):
        before = fresh.prompt_cache.miss_tokens
        cached.append(texts(fresh.generate(step, max_new_tokens=5)))
        if t:  # only what was added since the last step (and that step's last token, which is never stored)
            added = sum(len(a) - len(b) + 1 for a, b in zip(encoded[t], encoded[t - 1]))
            assert fresh.prompt_cache.miss_tokens - before == added
    assert fresh.prompt_cache.nbytes <= per_token * distinct
    fresh.share_prefill = False
    assert cached == [texts(fresh.generate(step, max_new_tokens=5)) for step in steps]
