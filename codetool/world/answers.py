"""Answer keys of world queries and the checker that scores a final answer against one.

A key is a small JSON-able dict made by the query generator (:mod:`codetool.world.queries`):

- ``{"kind": "number", "value": 7.46, "decimals": 2, "given": [12.0]}``: the answer must name
  the number (``7.46``, ``7.460``, ``1,234.5`` for ``1234.5``), to the key's precision: within half
  a unit of its last decimal;
- ``{"kind": "date", "value": "2025-04-15", "given": [...]}``: the date, written ``2025-04-15``,
  ``April 15, 2025``, ``15 April 2025`` or with a three-letter month;
- ``{"kind": "text", "value": "Tuesday", "domain": "weekday", "given": [...]}``: the words, whole
  and case-insensitive.

``given`` holds the values of the same kind that the query itself states (its numbers, its
dates, its names): an answer may repeat them.

**The checker cannot be gamed by listing candidates.** :func:`check_answer` accepts an answer
only if it names the expected value *and no other value of the same kind* beyond those the query
gave: every other number (for a number key), every other date (for a date key), every other
member of the key's domain (the world's weekdays, weather conditions, city names... for a text
key) fails it. An answer that lists many numbers therefore fails even when the right one is
among them; so does ``finish(result)`` on a whole response dict with several numbers in it.
Identifiers that mix letters and digits (``C204``, ``FL-C204-...``) are not numbers.

Limits: no arithmetic on the answer (``7.46`` passes, ``7.5`` and "about seven and a half" do
not); numbers grouped with spaces (``412 930``) read as two numbers.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from functools import lru_cache

from codetool.world.data import CONDITIONS, COUNTRIES, WEEKDAYS, world

KINDS = ("number", "date", "text")
_MONTHS = {m.lower(): i for i, m in enumerate(("January", "February", "March", "April", "May", "June", "July",
                                                "August", "September", "October", "November", "December"), 1)}
_MONTHS.update({name[:3]: i for name, i in list(_MONTHS.items())})
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_ISO = re.compile(r"(?<![\w-])(\d{4})-(\d{1,2})-(\d{1,2})(?![\w-])")
_MDY = re.compile(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.IGNORECASE)
_DMY = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RE})\.?,?\s+(\d{{4}})\b", re.IGNORECASE)
# a number not glued to a letter, digit, dot or hyphen before it (C204, FL-C204-0312-2 and x.5 are not numbers)
_NUMBER = re.compile(r"(?<![\w.\-])(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?![\d])")


@lru_cache(maxsize=1)
def domains() -> dict[str, tuple[str, ...]]:
    """``domain -> its members``: the values a text answer is told apart from."""
    w = world()
    return {"weekday": WEEKDAYS, "condition": CONDITIONS, "country": tuple(COUNTRIES),
            "city": tuple(c.name for c in w.cities.values()),
            "carrier": ("Postwing", "Rapidly", "Cargola"), "status": ("delivered", "shipped", "processing")}


def find_dates(text: str) -> tuple[list[dt.date], str]:
    """The dates written in ``text`` (ISO, month-day-year, day-month-year) and the text without them."""
    found: list[dt.date] = []

    def take(year: int, month: int, day: int) -> str:
        try:
            found.append(dt.date(year, month, day))
        except ValueError:
            return " ? "  # an impossible date still counts as a date, never as numbers
        return " "

    text = _ISO.sub(lambda m: take(int(m[1]), int(m[2]), int(m[3])), text)
    text = _MDY.sub(lambda m: take(int(m[3]), _MONTHS[m[1].lower()], int(m[2])), text)
    text = _DMY.sub(lambda m: take(int(m[3]), _MONTHS[m[2].lower()], int(m[1])), text)
    return found, text


def find_numbers(text: str) -> list[float]:
    """The numbers written in ``text`` once its dates are taken out (``1,234.5`` is one number)."""
    _, rest = find_dates(text)
    return [float(m.replace(",", "")) for m in _NUMBER.findall(rest)]


def _words(text: str) -> str:
    return " " + " ".join(re.findall(r"[a-z0-9]+", text.lower())) + " "


def _has_phrase(text_words: str, phrase: str) -> bool:
    return _words(phrase) in text_words


def _close(x: float, v: float, decimals: int) -> bool:
    return abs(x - v) <= 0.5 * 10.0 ** -decimals + 1e-9 * max(1.0, abs(v))


def check_answer(key: Mapping, answer: str | None) -> bool:
    """Whether ``answer`` gives the value of ``key`` and no competing value (module docstring).

    Args:
        key (`Mapping`): an answer key (``kind``, ``value``, and ``decimals``/``domain``/``given``).
        answer (`str`, *optional*): the final answer text; ``None`` or blank fails.
    Returns:
        `bool`.
    Raises:
        ValueError: a key of unknown kind or domain (a bug of the generator, not of the answer).
    """
    kind = key.get("kind")
    if kind not in KINDS:
        raise ValueError(f"answer key kind must be one of {KINDS}, got {kind!r}.")
    text = str(answer or "")
    if not text.strip():
        return False
    given = list(key.get("given") or [])
    if kind == "number":
        number, decimals = float(key["value"]), int(key.get("decimals", 0))
        numbers = find_numbers(text)
        if not any(_close(x, number, decimals) for x in numbers):
            return False
        allowed = [float(g) for g in given]
        return all(_close(x, number, decimals) or any(math.isclose(x, g, abs_tol=1e-9) for g in allowed)
                   for x in numbers)
    if kind == "date":
        day = dt.date.fromisoformat(str(key["value"]))
        dates, _ = find_dates(text)
        allowed_days = {dt.date.fromisoformat(str(g)) for g in given}
        return day in dates and all(d == day or d in allowed_days for d in dates)
    domain = key.get("domain")
    if domain not in domains():
        raise ValueError(f"answer key domain must be one of {sorted(domains())}, got {domain!r}.")
    words = _words(text)
    value = str(key["value"])
    if not _has_phrase(words, value):
        return False
    others = [m for m in domains()[domain] if m.lower() != value.lower() and m not in given]
    # a longer member that contains the value ("Umbria Vale" vs "Umbria") is not a second answer
    return not any(_has_phrase(words, m) and not _has_phrase(_words(m), value) for m in others)


def given_values(kind: str, query: str) -> list:
    """The values of ``kind`` that ``query`` states (``given`` of its key)."""
    if kind == "number":
        return find_numbers(query)
    if kind == "date":
        return [d.isoformat() for d in find_dates(query)[0]]
    words = _words(query)
    return sorted({m for members in domains().values() for m in members if _has_phrase(words, m)})


def episode_success(extra: Mapping | None, finish_type: str | None, final_answer: str | None) -> bool | None:
    """The outcome of one episode on a world query: it ended in ``finish`` and the answer key of
    its ``extra`` (a trajectory's or a task's) accepts the answer; ``None`` without a key."""
    key = (extra or {}).get("answer")
    if not key:
        return None
    return finish_type == "finish" and check_answer(key, final_answer)
