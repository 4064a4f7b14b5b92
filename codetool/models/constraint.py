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
SHAPES = ("opening", "line")
ARGUMENTS = ("free", "literal")
DONE = -1  # nothing more to check: the call opened (shape opening) or the end marker came (line)
ARGS, ARGS_PAREN, TAIL = -2, -3, -20  # free arguments (the last character a ')' or not); tail trie
# Literal arguments (shape line, arguments literal): `(`, then `kw="text"`, `kw=12.5` or a bare value,
# separated by commas, then `)`. The states after `(` or a comma; in a keyword; after `=`; inside a
# double-quoted string; in a number; after a string; after the closing `)`.
L_START, L_KW, L_VALUE, L_STRING, L_NUMBER, L_AFTER, L_CLOSED = -4, -5, -6, -7, -8, -9, -10
_FREE_STATES = (ARGS, ARGS_PAREN)
_LITERAL_STATES = (L_START, L_KW, L_VALUE, L_STRING, L_NUMBER, L_AFTER, L_CLOSED)
_KW_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_KW_CHARS = _KW_START | set("0123456789")
_NUMBER_START, _NUMBER_CHARS = set("-0123456789"), set("0123456789.")
# The same language as a regex: a value, an argument, and what may follow a value.
_VALUE_RE = r'("[^"\n\\]*"|[-0-9][0-9.]*)'
_ARG_RE = rf"([A-Za-z_][A-Za-z0-9_]*=)?{_VALUE_RE}"
_REST_RE = rf"(, *{_ARG_RE})*(, *)?\)"  # after a value: more arguments, then the closing parenthesis


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
        shape (`str`, *optional*, defaults to `"opening"`): ``opening`` constrains only the opening
            ``name(``; ``line`` makes the whole step that call on one line (ending with ``)``),
            optionally followed by ``print(target)``, then ``end``.
        end (`str`, *optional*, defaults to `"```"`): what closes a ``line`` step (the closing fence;
            the search's stop string then ends the reply).
        assign (`bool`, *optional*, defaults to `False`): the call must be assigned to a target
            (``result = name(``), and a ``line`` step must then print it.
        answer_openings (`tuple[str, ...]`, *optional*, defaults to `()`): allowed beginnings of
            ``finish``'s argument (e.g. ``('"', "result")``: a text or the last result, not an
            invented variable); empty means any.
        arguments (`str`, *optional*, defaults to `"free"`): with shape ``line``, ``free`` lets the
            arguments be any text up to the line's last ``)``; ``literal`` allows only literal
            values, bare or as keywords (``city="Paris", days=3``: double-quoted strings without
            escapes or newlines, numbers), so a step cannot copy an annotated stub
            (``f(city: str)``) or leave a string open. An opening that already starts the
            argument (``finish(result``) keeps free arguments.

    Raises:
        CodetoolError: no names, or a name or target that is not an identifier.
    """

    names: tuple[str, ...]
    targets: tuple[str, ...] = ("result",)
    trigger: str = ""
    shape: str = "opening"
    end: str = "```"
    assign: bool = False
    answer_openings: tuple[str, ...] = ()
    arguments: str = "free"

    def __post_init__(self):
        object.__setattr__(self, "names", tuple(dict.fromkeys(self.names)))
        object.__setattr__(self, "targets", tuple(dict.fromkeys(self.targets)))
        if not self.names:
            raise CodetoolError("CallConstraint needs at least one function name (e.g. 'finish').")
        bad = [n for n in (*self.names, *self.targets) if not _IDENTIFIER.match(n)]
        if bad:
            raise CodetoolError(f"CallConstraint names and targets must be Python identifiers, got {bad!r:.200}.")
        if self.shape not in SHAPES:
            raise CodetoolError(f"CallConstraint shape must be one of {SHAPES}, got {self.shape!r}.")
        if self.shape == "line" and (not self.end or "\n" in self.end):
            raise CodetoolError(f"CallConstraint shape 'line' needs a one-line end marker (e.g. '```'), got {self.end!r}.")
        if self.arguments not in ARGUMENTS:
            raise CodetoolError(f"CallConstraint arguments must be one of {ARGUMENTS}, got {self.arguments!r}.")
        if self.assign and not self.targets:
            raise CodetoolError("CallConstraint(assign=True) needs at least one target name (e.g. 'result').")

    @classmethod
    def for_functions(cls, names, *, ends: bool = True, **kwargs) -> CallConstraint:
        """The listed functions plus (with ``ends``) ``finish`` and ``give_up``, the episode's ends;
        ``kwargs`` are the other fields."""
        return cls(tuple(names) + (("finish", "give_up") if ends else ()), **kwargs)

    def _calls(self) -> list[str]:
        calls = [f"{name}(" for name in self.names if name != "finish" or not self.answer_openings]
        return calls + ([f"finish({a}" for a in self.answer_openings] if "finish" in self.names else [])

    def openings(self) -> list[str]:
        """Every allowed opening of the first statement, e.g. ``["f(", "result = f(", ...]``."""
        calls = self._calls()
        return (calls if not self.assign else []) + [f"{t} = {c}" for t in self.targets for c in calls]

    def tails(self) -> list[str]:
        """What may follow the call's line with shape ``line``: the end marker, or ``print(target)``
        on its own line and then the end marker."""
        return ([] if self.assign else [self.end]) + [f"print({t})\n{self.end}" for t in self.targets]

    def regex(self) -> str:
        """The constraint as a regular expression over the whole reply (for guided decoding).

        Uses only groups, alternation, ``*``, character classes and escapes, which vLLM's
        xgrammar/guidance/outlines backends and SGLang accept. With a trigger, the text before it
        may not contain the trigger's first character (a regular language cannot say "the first
        occurrence"), and the trigger must appear; the logits processor also lets a reply end
        before it.
        """
        names = "|".join(_escape(c) for c in self._calls())
        head = f"(({'|'.join(self.targets)}) = )" if self.targets else ""
        head += "" if self.assign or not head else "?"
        call = f"{head}({names})"
        if self.shape == "opening":
            call += "(.|\\n)*"
        else:
            prints = f"(print\\(({'|'.join(self.targets)})\\)\\n)" if self.targets else ""
            prints += "" if self.assign or not prints else "?"
            if self.arguments == "literal":  # per opening: what its last character leaves to write
                alts = [_escape(c) + {"(": f"( *{_ARG_RE}{_REST_RE}| *\\))", '"': f'[^"\\n\\\\]*"{_REST_RE}'}.get(
                    c[-1], "[^\\n]*\\)") for c in self._calls()]
                call = f"{head}({'|'.join(alts)})"
            else:
                call += "[^\\n]*\\)"
            call += f"\\n{prints}{_escape(self.end)}"
        if not self.trigger:
            return call
        return f"[^{_escape(self.trigger[0])}]*{_escape(self.trigger)}{call}"

    # States: opening-trie nodes (>= 0), DONE, ARGS / ARGS_PAREN (inside the call's line, the last
    # character a ')' or not), tail-trie nodes (TAIL - j). Tail and argument states do not depend on
    # the names, so masks for them can be shared between constraints with the same tail_key.
    @staticmethod
    def _build(strings: list[str]) -> tuple[list[dict[str, int]], set[int]]:
        children: list[dict[str, int]] = [{}]
        ends: set[int] = set()
        for string in strings:
            node = 0
            for ch in string:
                nxt = children[node].get(ch)
                if nxt is None:
                    children.append({})
                    nxt = children[node][ch] = len(children) - 1
                node = nxt
            ends.add(node)
        return children, ends

    def _tries(self):
        cached = self.__dict__.get("_trie_cache")
        if cached is None:
            cached = (*self._build(self.openings()), *self._build(self.tails()))
            object.__setattr__(self, "_trie_cache", cached)
        return cached

    @property
    def tail_key(self) -> tuple:
        """What the masks of argument and tail states depend on."""
        return (self.targets, self.end, self.assign, self.arguments)

    def step(self, state: int, ch: str) -> int | None:
        """The state after character ``ch`` (``None``: not allowed)."""
        if state == DONE:
            return DONE
        opening, opening_ends, tail, tail_ends = self._tries()
        if state >= 0:
            nxt = opening[state].get(ch)
            if nxt is None or nxt not in opening_ends:
                return nxt
            if self.shape == "opening":
                return DONE
            if self.arguments == "literal" and ch in "(\"":
                return L_START if ch == "(" else L_STRING
            return ARGS
        if state in _FREE_STATES:
            if ch == "\n":
                return TAIL if state == ARGS_PAREN else None
            return ARGS_PAREN if ch == ")" else ARGS
        if state in _LITERAL_STATES:
            return _literal_step(state, ch)
        nxt = tail[TAIL - state].get(ch)
        if nxt is None:
            return None
        return DONE if nxt in tail_ends else TAIL - nxt

    def children(self, state: int) -> dict[str, int] | None:
        """The allowed next characters of a trie state and their states; ``None`` for the argument
        states, where nearly every character is allowed (ask :meth:`step`)."""
        if state in _FREE_STATES or state in _LITERAL_STATES:
            return None
        opening, _, tail, _ = self._tries()
        keys = opening[state] if state >= 0 else tail[TAIL - state]
        return {ch: nxt for ch in keys if (nxt := self.step(state, ch)) is not None}

    def advance(self, state: int | None, text: str) -> int | None:
        """The state after reading ``text`` from ``state`` (0 = start, DONE = nothing more to check,
        ``None`` = the text left the constraint)."""
        for ch in text:
            if state is None or state == DONE:
                return state
            state = self.step(state, ch)
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


def _literal_step(state: int, ch: str) -> int | None:
    """One character of literal arguments (``CallConstraint(arguments="literal")``); ``None``: not
    allowed. After the closing parenthesis only the newline (then the tail) may come."""
    if state == L_CLOSED:
        return TAIL if ch == "\n" else None
    if state == L_STRING:
        return L_AFTER if ch == '"' else None if ch in "\n\\" else L_STRING
    if state == L_KW:
        return L_KW if ch in _KW_CHARS else L_VALUE if ch == "=" else None
    if state == L_VALUE:
        return L_STRING if ch == '"' else L_NUMBER if ch in _NUMBER_START else None
    if state == L_START:
        if ch == " ":
            return L_START
        if ch == ")":
            return L_CLOSED
        if ch in _KW_START:
            return L_KW
        return L_STRING if ch == '"' else L_NUMBER if ch in _NUMBER_START else None
    if state == L_NUMBER and ch in _NUMBER_CHARS:
        return L_NUMBER
    # after a value (a closed string or a number): another argument or the end of the call
    return L_START if ch == "," else L_CLOSED if ch == ")" else None
