"""Text every writer can encode: lone surrogates replaced before text is written, sent or tokenised.

Models and tools can emit lone UTF-16 surrogates (``"\\ud800"``), which UTF-8 cannot encode: a
JSONL append, an HTTP body, a tokenizer or a log handler would raise ``UnicodeEncodeError`` on
them. :func:`clean_text` replaces each with U+FFFD (a valid surrogate pair becomes its character)
and :func:`clean_obj` does the same inside a JSON-like object; :func:`clip` cuts a text to a
length with a visible marker; :func:`step_key` is the form in which two sampled steps are the same. This module imports nothing of
codetool, so the lowest modules (``codetool.jsonl``, ``codetool.secrets``) can both use it.
"""

from __future__ import annotations

from typing import Any


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (a valid surrogate pair becomes its
    character), so it can be encoded as UTF-8, tokenised, logged and written."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_obj(obj: Any) -> Any:
    """Recursively apply :func:`clean_text` to the strings (keys too) of a JSON-like object;
    tuples become lists, other values are returned as they are."""
    if isinstance(obj, str):
        return clean_text(obj)
    if isinstance(obj, dict):
        return {clean_obj(k): clean_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_obj(v) for v in obj]
    return obj


def clip(text: str | None, limit: int) -> str:
    """``text`` cut to its first ``limit`` characters, followed by a marker that says how many
    were cut (``None`` reads as empty text)."""
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} characters cut]"


def step_key(text: str | None) -> str:
    """``text`` without each line's trailing whitespace and without blank lines at either end: two
    sampled replies or codes with the same key are the same step (``trees.distinct_draws``, the
    ``same_step`` label rule)."""
    return "\n".join(line.rstrip() for line in (text or "").strip().splitlines())
