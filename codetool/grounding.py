"""Whether a final answer uses what a successful tool call returned (the ``grounded`` check, issue 37).

The ``grounded`` outcome (policy RL's outcome reward, the trees' default leaf success) paid for any
non-empty answer after a successful tool call, so an answer invented after a dummy call earned it.
:func:`answer_uses_results` adds the missing condition: the answer must share at least one *salient
item* with the content of at least one successful call's response, where

- an item is a word of three letters or more (lower-cased, Unicode-normalised, a stop word or a
  generic API word such as ``result``, ``status``, ``error`` is not one) or a number, normalised so
  ``1,000``, ``1_000``, ``1 000`` (no-break space) and ``1000.0`` are all ``1000`` (an integer below
  10 is not salient: too common to tell anything);
- a response's items are those of its *values*: JSON/Python-dict keys (``"result":``) are removed
  first;
- items the answer could have without the tool are removed: those of the query text, of the tool
  names (``checkhealth_for_squake`` gives ``checkhealth`` and ``squake``) and of the arguments the
  code sent in that call (an API that echoes its input would otherwise ground an answer the code
  made up and passed in).

Everything is read from what the host recorded (``ToolCall.response``, ``arguments``), never from
what the step printed.

Limits (docs/FIDELITY.md, docs/REWARD_HACKING.md): one shared item suffices, so the check says the
answer *uses* a result, not that it answers the query (the judge's job); an answer that forwards a
whole raw response (``finish(str(result))``) is grounded; an item past the first
``RESPONSE_PREVIEW_CHARS`` (1,000) characters of a response is not seen (the record keeps that
much); a word the answer paraphrases (``twelve`` for ``12``, a translation) does not match; an
answer in a script without word separators (Chinese, Japanese) matches only through numbers and
whole runs of letters.
"""

from __future__ import annotations

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


def answer_uses_results(answer: str, calls: Iterable, *, query: str = "",
                        tool_names: Iterable[str] = ()) -> bool:
    """Whether ``answer`` shares a salient item with the response of at least one of ``calls``,
    items the answer could have without the tools left out (module docstring).

    Args:
        answer (`str`): the final answer (``finish``'s argument, as the host recorded it).
        calls (`Iterable[ToolCall]`): the successful calls to look in (``response`` and
            ``arguments`` are read; the caller picks which calls count).
        query (`str`, *optional*): the user query; its items are not evidence.
        tool_names (`Iterable[str]`, *optional*): the offered functions; their name parts are not evidence.
    Returns:
        ``True`` when some call's response items (less its own arguments' items) meet the answer's.
    """
    calls = list(calls)
    names = " ".join(list(tool_names) + [str(getattr(c, "name", "")) for c in calls]).replace("_", " ")
    known = salient_items(query or "") | salient_items(names)
    wanted = salient_items(answer) - known
    if not wanted:
        return False
    for c in calls:
        echoed = salient_items(getattr(c, "arguments", None) or {})
        if wanted & (response_items(getattr(c, "response", "") or "") - echoed):
            return True
    return False
