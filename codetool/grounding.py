"""Whether a final answer uses what a successful tool call returned (the ``grounded`` check, issue 37).

The ``grounded`` outcome (policy RL's outcome reward, the trees' default leaf success) paid for any
non-empty answer after a successful tool call, so an answer invented after a dummy call earned it.
:func:`answer_uses_results` adds the missing condition: the answer must *use* at least one salient
item of a successful call's response, where

- an item is a word of three letters or more (lower-cased, Unicode-normalised, a stop word or a
  generic API word such as ``result``, ``status``, ``error`` is not one) or a number, normalised so
  ``1,000``, ``1_000``, ``1 000`` (no-break space) and ``1000.0`` are all ``1000`` (an integer below
  10 is not salient: too common to tell anything);
- a response's items are those of its *values*: JSON/Python-dict keys (``"result":``) are removed
  first;
- items the answer could have without the tools are removed: those of the query text, of the tool
  names (``checkhealth_for_squake`` gives ``checkhealth`` and ``squake``) and of what the code sent:
  a call's own arguments (an API that echoes its input would otherwise ground an answer the code
  made up and passed in), and every item the code sent to a tool before any response held it (a
  stateful service that stores what one call sent and returns it from another);
- a call whose arguments the record holds only in part (their JSON passed ``ARGUMENT_PREVIEW_CHARS``,
  so its preview was cut: its ``arguments_sha256`` differs from the preview's) grounds nothing: its
  response may echo the part of the arguments the record lost;
- the answer must not be a guess list: at most :data:`MAX_UNUSED_PER_USED` (9) of its items may be
  found in no response for each item that is (an answer stuffed with every number from 10 to 1,000,
  or with a vocabulary, shares an item with almost any response without reading it). Calibrated on
  the answers with full responses in ToolBench's and StableToolBench's answer examples
  (``data_example/answer``, ChatGPT runs): of 14 final answers, the 12 that use a
  response (two say the search failed) use 1 item in 8 at the least (``tests/test_grounding.py``).

Everything is read from what the host recorded (``ToolCall.response``, ``arguments``,
``arguments_sha256``), never from what the step printed.

Limits (docs/FIDELITY.md, docs/REWARD_HACKING.md): the check says the answer *uses* a result, not
that it answers the query (the judge's job): an answer that forwards a whole raw response
(``finish(str(result))``) is grounded, invented claims beside it included, and an answer of at most
ten items needs only one right guess (against the simulator's 27-word vocabulary, nine guessed words
hit a two-word name about half the time); an item past the first ``RESPONSE_PREVIEW_CHARS`` (1,000)
characters of a response is not seen (the record keeps that much); a word the answer paraphrases
(``twelve`` for ``12``, a translation) does not match, nor does what a tool computed from the code's
input (a service that reverses or slugifies its argument returns new items); an answer in a script
without word separators (Chinese, Japanese) matches only through numbers and whole runs of letters.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

# Function words and words every API response and answer is full of: never evidence of use.
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can cannot could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how if in into is it its itself just let me more most my
myself no nor not now of off on once only or other our ours ourselves out over own same she should so some
such than that the their theirs them themselves then there these they this those through to too under until
up very was we were what when where which while who whom why will with would you your yours yourself
yourselves yes none null true false nan inf ok okay please thanks thank answer answers final result results
response responses data value values status success successful error errors message messages info
information api apis tool tools call called calling function query request requests input output item items
list type name id ids key code count total page text string number object array field fields json http https
www com org net html unknown available found get got retrieved return returned returns following
""".split())

_KEY = re.compile(r"""(["'])(?:(?!\1)[^\\\n]|\\.){0,200}\1\s*:""")           # "key": / 'key':
_GROUPED = re.compile(r"(?<=\d)[_\u00a0\u202f'](?=\d{3}(?!\d))")              # 1_000, 1 000 -> 1,000
_TOKEN = re.compile(r"\d+(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?|[^\W\d_]+")


def _number(text: str) -> str | None:
    """The normalised form of a number token, or ``None`` when it is not salient (an integer below 10)."""
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return None if abs(value) < 10 else str(int(value))
    return format(value.normalize(), "f")


def salient_items(text: Any) -> set[str]:
    """The salient items of ``text`` (see the module docstring): normalised words and numbers.

    Args:
        text (`Any`): a string, or any JSON value (dumped first).
    Returns:
        A set of strings: words lower-cased, numbers without separators (``"1000"``, ``"3.5"``).
    """
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False, default=str)
    text = unicodedata.normalize("NFKC", _GROUPED.sub(",", text)).casefold()  # before NFKC turns no-break spaces into spaces
    items: set[str] = set()
    for token in _TOKEN.findall(text):
        if token[0].isdigit():
            number = _number(token)
            if number is not None:
                items.add(number)
        elif len(token) >= 3 and token not in STOP_WORDS:
            items.add(token)
    return items


def response_items(response: Any) -> set[str]:
    """The salient items of a tool response's values (its JSON or Python-dict keys removed)."""
    if not isinstance(response, str):
        response = json.dumps(response, ensure_ascii=False, default=str)
    return salient_items(_KEY.sub(" ", response))


MAX_UNUSED_PER_USED = 9  # an answer's items found in no response, per item found in one (module docstring)
CUT_MARK = "...[cut]"    # what the executor's argument preview ends a cut value with


def sent_items(arguments: Any) -> set[str]:
    """The salient items of what the code sent in a call: of its arguments' JSON and, so that an
    escape (``\\n``) cannot glue two words into one, of each string value on its own."""
    items = salient_items(arguments)
    stack = [arguments]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            items |= salient_items(value)
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return items


def arguments_whole(call: Any) -> bool:
    """Whether the record holds ``call``'s arguments in full: the SHA-256 of the preview's canonical
    JSON equals ``arguments_sha256`` (the executor's hash of what the code sent), or, in a record
    without a hash, no value carries the preview's cut mark."""
    arguments = getattr(call, "arguments", None) or {}
    text = json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)
    digest = getattr(call, "arguments_sha256", "") or ""
    if digest:
        return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest() == digest
    return CUT_MARK not in text


def used_items(answer: str, calls: Iterable, *, query: str = "", tool_names: Iterable[str] = ()) -> tuple[set[str], set[str]]:
    """``(wanted, used)``: the answer's salient items less those it could have without the tools, and
    those of them that some call's response supplied (module docstring).

    Args:
        answer (`str`): the final answer.
        calls (`Iterable[ToolCall]`): the successful calls, in the order they were made.
        query (`str`, *optional*), tool_names (`Iterable[str]`, *optional*): as for :func:`answer_uses_results`.
    """
    calls = list(calls)
    names = " ".join(list(tool_names) + [str(getattr(c, "name", "")) for c in calls]).replace("_", " ")
    known = salient_items(query or "") | salient_items(names)
    wanted = salient_items(answer) - known
    used: set[str] = set()
    returned: set[str] = set()  # every item a response held so far
    invented: set[str] = set()  # items the code sent before any response held them
    for c in calls:
        sent = sent_items(getattr(c, "arguments", None) or {})
        invented |= sent - returned
        items = response_items(getattr(c, "response", "") or "")
        returned |= items
        if arguments_whole(c):
            used |= wanted & (items - sent - invented)
    return wanted, used


def answer_uses_results(answer: str, calls: Iterable, *, query: str = "",
                        tool_names: Iterable[str] = ()) -> bool:
    """Whether ``answer`` uses what ``calls`` returned: it shares a salient item with the response of at
    least one of them, beyond what the query, the tool names and the code's own arguments held, and
    at most :data:`MAX_UNUSED_PER_USED` of its items are found in no response per item that is
    (module docstring).

    Args:
        answer (`str`): the final answer (``finish``'s argument, as the host recorded it).
        calls (`Iterable[ToolCall]`): the successful calls to look in, in the order they were made
            (``response``, ``arguments`` and ``arguments_sha256`` are read; the caller picks which
            calls count).
        query (`str`, *optional*): the user query; its items are not evidence.
        tool_names (`Iterable[str]`, *optional*): the offered functions; their name parts are not evidence.
    Returns:
        ``True`` when the answer uses some response's items and is not a guess list.
    """
    wanted, used = used_items(answer, calls, query=query, tool_names=tool_names)
    return bool(used) and len(wanted - used) <= MAX_UNUSED_PER_USED * len(used)
