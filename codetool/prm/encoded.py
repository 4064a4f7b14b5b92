"""What both PRM interfaces produce and share (:mod:`codetool.prm.format`, ours, and
:mod:`codetool.prm.reference`, the public CodeTool PRM's): the encoded prompt record and the
head-and-tail text cut (the prompt files: :mod:`codetool.prompts`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EncodedPrompt:
    """Token ids of one example: ``prefix_ids + suffix_ids`` is the model input; the label token
    is predicted at its last position.

    Args:
        prefix_ids (`list[int]`): shared by every candidate of a step.
        suffix_ids (`list[int]`): this candidate's part; never empty.
        truncated (`bool`): whether anything was cut to fit the token budgets.
        dropped_steps (`int`): history steps left out (oldest first).
    """

    prefix_ids: list[int]
    suffix_ids: list[int]
    truncated: bool = False
    dropped_steps: int = 0

    @property
    def input_ids(self) -> list[int]:
        return self.prefix_ids + self.suffix_ids


def clip_text(text: str, limit: int) -> str:
    """Keep the head and tail of ``text`` within ``limit`` characters, marking the cut."""
    text = text or ""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
