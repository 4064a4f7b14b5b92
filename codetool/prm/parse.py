"""The body of ``POST /score`` (:mod:`codetool.prm.server`) checked and turned into
:class:`~codetool.rewards.PRMItem` objects, with a one-line reason and an HTTP status for each
way a body can be wrong.

Guarantees: the accepted fields are exactly those :mod:`codetool.prm.schema` declares (an unknown
one, such as a typo, is a 422 naming it and the closest known field); text comes back cleaned
(:func:`codetool.jsonl.clean_text`: lone surrogates become U+FFFD, so no item can make the
tokenizer raise); a large body is parsed in pieces (:func:`codetool.fairness.loads_without_stalling`)
and JSON nested too deeply for the parser is a 400, never a ``RecursionError``. Limits: types are
checked, lengths are not (the scheduler's budget bounds the work an item costs).
"""

from __future__ import annotations

from codetool.fairness import loads_without_stalling
from codetool.jsonl import clean_text
from codetool.prm.schema import HISTORY_FIELDS, ITEM_FIELDS, REQUEST_FIELDS, unknown_field
from codetool.rewards import PRMItem

_TEXT_FIELDS = ("query", "tools", "candidate", "candidate_output", "candidate_plan", "step_text", "previous_steps",
                "parent_result")


class _Reject(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def parse_items(body: bytes, max_items: int, max_history_steps: int = 1000) -> list[PRMItem]:
    """Validate a ``/score`` body; raises ``_Reject`` with a 4xx status and a one-line reason.
    Text fields come back cleaned (``codetool.jsonl.clean_text``). JSON nested too deeply for the
    parser (e.g. a 100,000-deep array; a valid body nests 5 levels) is a 400."""
    try:
        data = loads_without_stalling(body)  # a large body in pieces: other threads run between them
    except RecursionError:
        raise _Reject(400, "JSON nested too deeply; a /score body nests at most 5 levels") from None
    except (ValueError, UnicodeDecodeError):
        raise _Reject(400, "body is not valid JSON; send {\"items\": [...]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise _Reject(400, "body must be a JSON object with an 'items' list")
    _refuse_unknown(data, REQUEST_FIELDS, "")
    if len(data["items"]) > max_items:
        raise _Reject(413, f"{len(data['items'])} items in one request; the limit is {max_items}")
    items = []
    for i, raw in enumerate(data["items"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("query"), str):
            raise _Reject(400, f"items[{i}] must be an object with a text 'query'")
        _refuse_unknown(raw, ITEM_FIELDS, f"items[{i}].")
        for name in _TEXT_FIELDS[1:]:
            if not isinstance(raw.get(name, ""), str):
                raise _Reject(400, f"items[{i}].{name} must be text")
        history = raw.get("history", [])
        if isinstance(history, list) and len(history) > max_history_steps:  # a work budget per item
            raise _Reject(413, f"items[{i}].history has {len(history)} steps; the limit is {max_history_steps}")
        if not isinstance(history, list) or not all(
                isinstance(h, dict) and all(isinstance(h.get(k, ""), str) for k in ("code", "output", "plan"))
                for h in history):
            raise _Reject(400, f"items[{i}].history must be a list of {{'code', 'output'}} text objects")
        for j, step in enumerate(history):
            _refuse_unknown(step, HISTORY_FIELDS, f"items[{i}].history[{j}].")
        items.append(PRMItem(
            query=clean_text(raw["query"]), tools=clean_text(raw.get("tools", "")),
            history=[{"code": clean_text(h.get("code", "")), "output": clean_text(h.get("output", "")),
                      **({"plan": clean_text(h["plan"])} if h.get("plan") else {})} for h in history],
            candidate=clean_text(raw.get("candidate", "")), candidate_output=clean_text(raw.get("candidate_output", "")),
            candidate_plan=clean_text(raw.get("candidate_plan", "")),
            **{name: clean_text(raw.get(name, "")) for name in _TEXT_FIELDS[5:]}))
    return items


def _refuse_unknown(obj: dict, known: tuple[str, ...], where: str) -> None:
    if (reason := unknown_field(obj, known)) is not None:  # a typo is refused, never silently ignored
        raise _Reject(422, where + reason)
