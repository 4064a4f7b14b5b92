"""LLM backends behind one interface, ``generate(prompts, n, ...) -> list[list[Completion]]``.

The backends (docs/DESIGN.md §2):

- :class:`TransformersBackend`: a local model (``default``, a directory, a ``.gguf``, a Hub id);
- :class:`OpenAIBackend`: any OpenAI-compatible chat completions server (vLLM, SGLang, hosted);
- :class:`VLLMBackend`: vLLM in-process on a GPU, where vLLM is installed;
- :class:`ScriptedBackend`: scripted replies for tests and demos.

:func:`make_backend` picks one for a parsed :class:`~codetool.models.spec.ModelSpec` (this module
imports the spec, never the other way); ``BACKENDS`` is the one table of them. The ``codetool
generate`` command (a smoke test of any backend) is ``codetool.commands.generate``. Importing this
module does not import torch or transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.models.completion import (
    Completion,
    LLMBackend,
    Prompt,
    Seeds,
    check_sampling,
    find_stop,
    to_messages,
)
from codetool.models.openai_backend import OpenAIBackend
from codetool.models.spec import POLICY_KINDS, ModelSpec
from codetool.models.transformers_backend import TransformersBackend
from codetool.models.vllm_backend import VLLMBackend

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "Completion", "LLMBackend", "OpenAIBackend", "Prompt", "ScriptedBackend",
           "TransformersBackend", "VLLMBackend", "make_backend"]


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
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
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
BACKENDS: dict[str, Callable[..., LLMBackend]] = {  # the type checker holds each class to the LLMBackend seam
    "transformers": TransformersBackend,
    "openai": OpenAIBackend,
    "vllm": VLLMBackend,
    "scripted": ScriptedBackend,
}


def make_backend(spec: ModelSpec, **options) -> LLMBackend:
    """The backend of a parsed policy or judge spec.

    Args:
        spec (`ModelSpec`): parsed where the text entered (a config group, the command line):
            kind ``local`` -> TransformersBackend, ``openai`` (an OpenAI-compatible base URL, or
            several comma-separated) -> OpenAIBackend, ``vllm`` -> VLLMBackend.
        **options: constructor options added to the spec's own (:meth:`ModelSpec.backend_kwargs`),
            which they override (e.g. ``timeout``, ``retries`` for HTTP).

    Raises:
        TypeError: ``spec`` is not a :class:`ModelSpec` (parse the text first).
        ConfigError: a PRM spec (``none``, ``rollout``, a ``serve-prm`` URL) where a language model is needed.
        CodetoolError: what the chosen backend raises (a missing model, a missing API key variable).
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"make_backend takes a parsed ModelSpec, got {type(spec).__name__} {spec!r}; parse the "
                        "text with ModelSpec.parse where it enters.")
    if spec.kind not in POLICY_KINDS:
        raise ConfigError(f"{spec.role} {spec.text!r} is a {spec.kind} PRM spec, not a language model.")
    kwargs = {**spec.backend_kwargs(), **options}
    if spec.kind == "openai":
        return BACKENDS["openai"](base_url=spec.location, **kwargs)
    if spec.kind == "vllm":
        return BACKENDS["vllm"](spec.location, **kwargs)
    return BACKENDS["transformers"](spec.location, **kwargs)
