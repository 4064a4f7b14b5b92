"""LLM backends behind one interface, ``generate(prompts, n, ...) -> list[list[Completion]]``.

The backends (docs/DESIGN.md §2):

- :class:`TransformersBackend`: a local model (``default``, a directory, a ``.gguf``, a Hub id);
- :class:`OpenAIBackend`: any OpenAI-compatible chat completions server (vLLM, SGLang, hosted);
- :class:`VLLMBackend`: vLLM in-process on a GPU, where vLLM is installed;
- :class:`ScriptedBackend`: scripted replies for tests and demos.

:func:`make_backend` picks one from a spec string; ``BACKENDS`` is the one table of them. This
module also holds the ``codetool generate`` command (a smoke test of any backend). Importing it
does not import torch or transformers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.models.completion import (
    Completion,
    LLMBackend,
    Prompt,
    check_sampling,
    find_stop,
    to_messages,
)
from codetool.models.openai_backend import OpenAIBackend
from codetool.models.transformers_backend import TransformersBackend
from codetool.models.vllm_backend import VLLMBackend

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "Completion", "GenerateConfig", "LLMBackend", "OpenAIBackend", "Prompt",
           "ScriptedBackend", "TransformersBackend", "VLLMBackend", "generate_command", "make_backend"]


class ScriptedBackend:
    """Replies from a script, for tests and demos (no model).

    Args:
        replies (`Sequence[str]` or `Callable[[Prompt], str]`): texts handed out in order, one per
            sample across calls; or a function of the prompt called once per sample.
        cycle (`bool`, *optional*, defaults to `False`): start the list again when it runs out
            (otherwise running out raises CodetoolError).
        option_scores (`Callable[[Prompt, list[str]], list[float]]`, *optional*): what
            ``option_logprobs`` returns; without it ``option_logprobs`` raises NotImplementedError.

    Tokens are counted crudely as whitespace-separated words; ``max_new_tokens`` cuts the reply to
    that many words (finish reason ``length``); stop strings are honoured. Every call is recorded
    in ``calls`` as ``(prompts, kwargs)``.
    """

    name = "scripted"

    def __init__(self, replies: Sequence[str] | Callable[[Prompt], str], *, cycle: bool = False,
                 option_scores: Callable[[Prompt, list[str]], list[float]] | None = None):
        self.replies = replies if callable(replies) else list(replies)
        self.cycle = cycle
        self.option_scores = option_scores
        self.supports_logprobs = option_scores is not None
        self.calls: list[tuple[list[Prompt], dict]] = []
        self._next = 0

    def _reply(self, prompt: Prompt) -> str:
        if callable(self.replies):
            return str(self.replies(prompt))
        if self._next >= len(self.replies):
            if not self.cycle or not self.replies:
                raise CodetoolError(f"ScriptedBackend ran out of replies after {self._next}; script more "
                                    f"replies or pass cycle=True.")
            self._next = 0
        self._next += 1
        return self.replies[self._next - 1]

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: int | None = None,
                 constraint=None) -> list[list[Completion]]:
        """Scripted completions: (len(prompts), n); see :class:`LLMBackend` (a ``constraint`` is
        recorded, not enforced: the script decides the text)."""
        check_sampling(n, temperature, top_p, max_new_tokens)
        self.calls.append((list(prompts), {"n": n, "temperature": temperature, "top_p": top_p,
                                           "max_new_tokens": max_new_tokens, "stop": stop, "seed": seed,
                                           **({"constraint": constraint} if constraint is not None else {})}))
        results = []
        for prompt in prompts:
            prompt_tokens = sum(len(m["content"].split()) for m in to_messages(prompt))
            completions = []
            for _ in range(n):
                text, finish = self._reply(prompt), "stop"
                cut = find_stop(text, stop)
                if cut >= 0:
                    text = text[:cut]
                words = text.split()
                if len(words) > max_new_tokens:
                    text, finish = " ".join(words[:max_new_tokens]), "length"
                completions.append(Completion(text, prompt_tokens, min(len(words), max_new_tokens), finish))
            results.append(completions)
        return results

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """The scripted ``option_scores`` for each prompt; NotImplementedError without them."""
        if self.option_scores is None:
            raise NotImplementedError("ScriptedBackend has no option_scores")
        return [list(self.option_scores(p, list(options))) for p in prompts]


# The one table of backends; make_backend chooses among them from the spec's form.
BACKENDS: dict[str, type] = {
    "transformers": TransformersBackend,
    "openai": OpenAIBackend,
    "vllm": VLLMBackend,
    "scripted": ScriptedBackend,
}


def make_backend(spec: str, **kwargs) -> LLMBackend:
    """A backend from a spec string.

    Args:
        spec (`str`): ``"default"``, a model directory, a ``.gguf`` file or a Hub id ->
            TransformersBackend; ``"http://..."`` / ``"https://..."`` (an OpenAI-compatible base
            URL) -> OpenAIBackend; ``"vllm:<model>"`` -> VLLMBackend.
        **kwargs: passed to the backend's constructor (e.g. ``dtype``, ``max_batch_size``;
            ``model``, ``api_key_env``, ``timeout``, ``retries`` for HTTP).

    Raises:
        CodetoolError: an empty spec, or what the chosen backend raises.
    """
    from codetool.models.spec import ModelSpec

    parsed = ModelSpec.parse(spec)  # the one place that reads a spec's form
    if parsed.kind == "openai":
        return BACKENDS["openai"](base_url=parsed.location, **kwargs)
    if parsed.kind == "vllm":
        return BACKENDS["vllm"](parsed.location, **kwargs)
    return BACKENDS["transformers"](parsed.location, **kwargs)


@dataclass
class GenerateConfig:
    """Settings of ``codetool generate``."""

    model: str = option("default", "'default', a model directory, .gguf file, Hub id, http(s):// URL "
                        "of an OpenAI-compatible server, or vllm:<model>")
    prompt: str = option("Write a Python function that returns the square of a number.",
                         "the user message to complete")
    system: str = option("", "optional system message")
    n: int = option(1, "completions to sample")
    temperature: float = option(0.0, "sampling temperature (0 = greedy)")
    top_p: float = option(1.0, "nucleus sampling mass")
    max_new_tokens: int = option(128, "most tokens per completion")
    stop: list[str] = option(default_factory=list, help="stop strings (comma-separated)")
    seed: int | None = option(None, "random seed for sampling")
    dtype: str = option("auto", "model dtype (local backends)", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device (transformers backend): auto, cpu, cuda, cuda:1, ...")
    remote_model: str = option("", "model name sent to an http(s) server (default: the server's first model)")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable holding the API key (http backends)")

    def __post_init__(self):
        if self.n < 1 or self.max_new_tokens < 1:
            raise ConfigError(f"n and max_new_tokens must be >= 1, got n={self.n}, "
                              f"max_new_tokens={self.max_new_tokens}.")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}.")


def generate_command(cfg: GenerateConfig) -> int:
    """``codetool generate``: print the completions of one prompt and the decoding speed."""
    from rich.console import Console

    from codetool.models.spec import ModelSpec

    spec = ModelSpec.parse(cfg.model, remote_model=cfg.remote_model, api_key_env=cfg.api_key_env, dtype=cfg.dtype,
                           device=cfg.device)
    start = time.perf_counter()
    backend = make_backend(cfg.model, **spec.backend_kwargs())
    loaded = time.perf_counter()
    messages = ([{"role": "system", "content": cfg.system}] if cfg.system else []) + [
        {"role": "user", "content": cfg.prompt}]
    [completions] = backend.generate([messages], n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p,
                                     max_new_tokens=cfg.max_new_tokens, stop=cfg.stop or None, seed=cfg.seed)
    seconds = time.perf_counter() - loaded
    console = Console()
    for i, c in enumerate(completions):
        console.rule(f"completion {i + 1}/{len(completions)} ({c.completion_tokens} tokens, {c.finish_reason})")
        console.print(c.text, markup=False, highlight=False)
    tokens = sum(c.completion_tokens for c in completions)
    console.rule()
    console.print(f"{backend.name}: loaded in {loaded - start:.1f} s; {tokens} tokens in {seconds:.1f} s = "
                  f"{tokens / max(seconds, 1e-9):.1f} tokens/s (prompt {completions[0].prompt_tokens} tokens)",
                  markup=False, highlight=False)
    return 0
