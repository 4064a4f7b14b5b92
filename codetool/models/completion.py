"""The one LLM interface every backend implements: ``generate`` -> ``Completion`` (docs/DESIGN.md §2).

A prompt is either a plain string (one user message) or a list of chat messages
(``{"role": ..., "content": ...}``); backends apply the chat template themselves. When the last
message is the assistant's, the reply continues it (the completion text excludes it): the search
uses this to start every step with an opening code fence, which small models need. ``generate``
returns one list of ``n`` completions per prompt, in prompt order. Stop strings are cut from the
returned text (like the OpenAI API) and ``finish_reason`` says why generation ended. An optional
``constraint`` (:class:`~codetool.models.constraint.CallConstraint`, one for all prompts or one per
prompt) restricts the step's first statement to a call of a listed function (issue 16). ``seed`` is
one seed for the call or one per prompt (:data:`Seeds`): with one per prompt, a prompt's samples
depend on its own seed only, not on which prompts share the call (a tree's nodes must not depend
on the trees batched with it; issue 39).

This module holds only plain data and helpers (no torch), so configs and the search can import
it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from codetool import CodetoolError

Prompt = str | list[dict[str, str]]  # chat messages; a plain str is one user message
# None, one CallConstraint for every prompt, or a list with one (or None) per prompt.
Constraints = Any
# None, one seed for the whole call, or one (or None) per prompt.
Seeds = int | list[int | None] | None
FINISH_REASONS = ("stop", "length")


@dataclass
class Completion:
    """One generated reply.

    Args:
        text (`str`): the reply, cut before the first stop string (the stop string is not included).
        prompt_tokens (`int`): tokens of the rendered prompt (chat template included, no padding).
        completion_tokens (`int`): tokens generated up to and including the one that completed
            the stop string or the end-of-turn token; padding never counts.
        finish_reason (`str`): ``"stop"`` (stop string or end of turn) or ``"length"``
            (``max_new_tokens`` reached).
        token_ids (`list[int]`, *optional*): the ``completion_tokens`` generated ids themselves,
            where the backend exposes them (the local transformers backend does; policy RL trains
            on exactly these ids, ``codetool.policy``); ``None`` otherwise.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    token_ids: list[int] | None = None


@runtime_checkable
class LLMBackend(Protocol):
    """What the search, the tree builder and the router call; see :class:`Completion`."""

    name: str
    supports_logprobs: bool

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
                 constraint: Constraints = None) -> list[list[Completion]]:
        """``n`` completions for each prompt: outer list in prompt order, inner list of length ``n``;
        ``constraint`` as :func:`per_prompt` reads it, ``seed`` as :func:`per_prompt_seeds`."""
        ...

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """(len(prompts), len(options)) log-probabilities (nats, <= 0) of each option as the reply.

        Raises:
            NotImplementedError: the backend cannot score given text.
        """
        ...


def to_messages(prompt: Prompt) -> list[dict[str, str]]:
    """A prompt as chat messages; a plain string becomes one user message.

    Raises:
        CodetoolError: a message without ``role``/``content`` or of the wrong type.
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise CodetoolError(f"a prompt must be a string or a non-empty list of chat messages, got {type(prompt).__name__}.")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise CodetoolError(f"chat message {i} must be a dict with 'role' and 'content', got {message!r:.80}.")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def find_stop(text: str, stop: list[str] | None) -> int:
    """Index of the first occurrence of any stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in (stop or []) if s) if i >= 0]
    return min(hits) if hits else -1


def check_sampling(n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    """Validate the shared ``generate`` arguments; raises CodetoolError with the allowed range."""
    if not isinstance(n, int) or n < 1:
        raise CodetoolError(f"n (samples per prompt) must be an integer >= 1, got {n!r}.")
    if temperature < 0:
        raise CodetoolError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}.")
    if not 0 < top_p <= 1:
        raise CodetoolError(f"top_p must be in (0, 1], got {top_p!r}.")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise CodetoolError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}.")


def per_prompt(constraint: Constraints, count: int) -> list:
    """``constraint`` as a list of ``count`` entries (each a CallConstraint or ``None``).

    Raises:
        CodetoolError: a list whose length is not ``count``.
    """
    if constraint is None or not isinstance(constraint, (list, tuple)):
        return [constraint] * count
    if len(constraint) != count:
        raise CodetoolError(f"constraint: got {len(constraint)} constraints for {count} prompts; pass one "
                            f"for all prompts or exactly one (or None) per prompt.")
    return list(constraint)


def per_prompt_seeds(seed: Seeds, count: int) -> list[int | None]:
    """``seed`` as a list of ``count`` seeds: one int is every prompt's seed (the call's draws then
    depend on the whole batch, as a backend drawing from one generator makes them), a list is one
    (or ``None``) per prompt.

    Raises:
        CodetoolError: a list whose length is not ``count``.
    """
    if not isinstance(seed, (list, tuple)):
        return [seed] * count
    if len(seed) != count:
        raise CodetoolError(f"seed: got {len(seed)} seeds for {count} prompts; pass one seed for the call or "
                            "exactly one per prompt.")
    return list(seed)
