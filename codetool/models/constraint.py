"""Constrained step decoding: the step's first statement calls a listed function (issue 16).

A 135M policy asked to call one of ten listed functions mostly writes broken ``def`` bodies or
calls invented names; forcing the first statement to be ``name(`` or ``result = name(`` with
``name`` one of the listed functions, ``finish`` or ``give_up`` makes every candidate call a real
tool, so the simulator accepts some and rejects others: the signal the trees and the PRM need.

:class:`CallConstraint` is the backend-neutral description, handed to ``generate(..., constraint=)``:

- as a character trie of allowed prefixes (:meth:`CallConstraint.advance`), which the transformers
  backend walks together with a trie of its vocabulary's token strings to build a logits mask per
  state (:class:`CallLogitsProcessor`; masks are cached per state, so a step costs one tensor
  ``masked_fill`` beyond plain sampling);
- as a regular expression (:meth:`CallConstraint.regex`) for servers with guided decoding / structured
  outputs (vLLM ``StructuredOutputsParams(regex=...)``, the OpenAI-compatible
  ``structured_outputs``/``guided_regex``/``regex`` request fields).

The constraint applies from the start of the generated text, or, with a ``trigger`` (for instance
an opening code fence that the model writes itself after a plan line), from the first occurrence
of the trigger on. Everything after the opening parenthesis is free: the arguments, later
statements, the closing fence. Not guaranteed: that the call is well formed or that its arguments
are right (that is what the executor and the rewards judge), nor that a reply cut by
``max_new_tokens`` completes the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from codetool import CodetoolError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SPECIAL = set("\\^$.|?*+()[]{}-/")
DONE = -1  # the trie state once the call has opened: everything after it is free


def _escape(text: str) -> str:
    """``text`` as a literal in the common regex dialect (``\\n`` for a newline, not a raw one)."""
    out = []
    for ch in text:
        if ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        else:
            out.append("\\" + ch if ch in _SPECIAL else ch)
    return "".join(out)


@dataclass(frozen=True)
class CallConstraint:
    """The first statement of a step calls one of ``names`` (issue 16's ``search.constrain: call``).

    Args:
        names (`tuple[str, ...]`): the callable function names (the listed tools plus ``finish`` and
            ``give_up``); each must be a Python identifier.
        targets (`tuple[str, ...]`, *optional*, defaults to `("result",)`): variable names the call
            may be assigned to (``result = name(``); empty means a bare call only.
        trigger (`str`, *optional*, defaults to `""`): text after which the constraint applies
            (e.g. ``"```python\\n"`` when the model writes a plan line before opening the fence);
            empty means from the first generated character (the fence is part of the prompt).

    Raises:
        CodetoolError: no names, or a name or target that is not an identifier.
    """

    names: tuple[str, ...]
    targets: tuple[str, ...] = ("result",)
    trigger: str = ""

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(dict.fromkeys(self.names)))
        object.__setattr__(self, "targets", tuple(dict.fromkeys(self.targets)))
        if not self.names:
            raise CodetoolError("CallConstraint needs at least one function name (e.g. 'finish').")
        bad = [n for n in (*self.names, *self.targets) if not _IDENTIFIER.match(n)]
        if bad:
            raise CodetoolError(f"CallConstraint names and targets must be Python identifiers, got {bad!r:.200}.")

    @classmethod
    def for_functions(cls, names, *, targets: tuple[str, ...] = ("result",), trigger: str = "") -> CallConstraint:
        """The listed functions plus ``finish`` and ``give_up`` (the episode's ends)."""
        return cls(tuple(names) + ("finish", "give_up"), tuple(targets), trigger)

    def openings(self) -> list[str]:
        """Every allowed opening of the first statement, e.g. ``["f(", "result = f(", ...]``."""
        calls = [f"{name}(" for name in self.names]
        return calls + [f"{t} = {c}" for t in self.targets for c in calls]

    def regex(self) -> str:
        """The constraint as a regular expression over the whole reply (for guided decoding).

        Uses only groups, alternation, ``*`` and escapes, which vLLM's xgrammar/guidance/outlines
        backends and SGLang accept. With a trigger, the text before it may not contain the
        trigger's first character (a regular language cannot say "the first occurrence"), and the
        trigger must appear; the logits processor also lets a reply end before it.
        """
        names = "|".join(self.names)  # identifiers: nothing to escape
        head = f"({'|'.join(self.targets)}) = " if self.targets else ""
        call = (f"({head})?" if head else "") + f"({names})\\((.|\\n)*"
        if not self.trigger:
            return call
        return f"[^{_escape(self.trigger[0])}]*{_escape(self.trigger)}{call}"

    # The character trie of allowed openings; states are node indices, DONE once a call opened.
    def _trie(self) -> tuple[list[dict[str, int]], set[int]]:
        cached = self.__dict__.get("_trie_cache")
        if cached is None:
            children: list[dict[str, int]] = [{}]
            ends: set[int] = set()
            for opening in self.openings():
                node = 0
                for ch in opening:
                    nxt = children[node].get(ch)
                    if nxt is None:
                        children.append({})
                        nxt = children[node][ch] = len(children) - 1
                    node = nxt
                ends.add(node)
            cached = (children, ends)
            object.__setattr__(self, "_trie_cache", cached)
        return cached

    def advance(self, state: int | None, text: str) -> int | None:
        """The trie state after reading ``text`` from ``state`` (0 = start, DONE = call opened,
        ``None`` = the text left every allowed opening)."""
        children, ends = self._trie()
        for ch in text:
            if state is None or state == DONE:
                return state
            state = children[state].get(ch)
            if state is not None and state in ends:
                state = DONE
        return state

    def allows(self, text: str) -> bool:
        """Whether generated ``text`` is consistent with the constraint so far (a prefix of an allowed
        reply; before the trigger appears everything is)."""
        if self.trigger:
            at = text.find(self.trigger)
            if at < 0:
                return True
            text = text[at + len(self.trigger):]
        return self.advance(0, text) is not None

    def children(self, state: int) -> dict[str, int]:
        """The allowed next characters of a trie state and the states they lead to."""
        children, ends = self._trie()
        return {ch: (DONE if node in ends else node) for ch, node in children[state].items()}
