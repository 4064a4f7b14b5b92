"""The per-query record of the decide-first benchmark: :class:`DecisionRecord`, one line of
``records.jsonl`` (``codetool eval-decision``).

In memory a record is typed (its route costs are :class:`RouteCosts` of :class:`Cost`); it
becomes JSON only in :meth:`DecisionRecord.to_dict` and comes back through
:meth:`DecisionRecord.from_dict`, in the same format as always (``reuse`` reads earlier files).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Cost:
    """What one route (or the decision) cost on one query.

    Args:
        tokens (`int`): prompt + completion tokens (plus PRM-scored tokens for a decision).
        seconds (`float`): the query's share of the batched calls, in seconds.
    """

    tokens: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Cost | None:
        return None if data is None else cls(tokens=data["tokens"], seconds=data["seconds"])


@dataclass(frozen=True, slots=True)
class RouteCosts:
    """The measured cost of deciding and of each route; ``None`` for a route that was not run.

    Args:
        decision (`Cost`): the decision itself.
        direct (`Cost`, *optional*): the direct answer (``answer_direct``).
        fast (`Cost`, *optional*): the fast path alone, without the decision it was given (``run_search``).
        search (`Cost`, *optional*): the always-search baseline (``run_search``).
    """

    decision: Cost
    direct: Cost | None = None
    fast: Cost | None = None
    search: Cost | None = None

    def route(self, name: str) -> Cost | None:
        """The cost of route ``name`` (``direct``, ``fast`` or ``search``)."""
        return {"direct": self.direct, "fast": self.fast, "search": self.search}[name]

    def to_dict(self) -> dict[str, Any]:
        return {k: None if c is None else c.to_dict() for k, c in
                (("decision", self.decision), ("direct", self.direct), ("fast", self.fast), ("search", self.search))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RouteCosts:
        decision = data["decision"]
        return cls(decision=Cost(tokens=decision["tokens"], seconds=decision["seconds"]), direct=Cost.from_dict(data.get("direct")),
                   fast=Cost.from_dict(data.get("fast")), search=Cost.from_dict(data.get("search")))


_ADDED = ("benchmark", "p_tool", "necessity", "search_tool_calls", "search_success")  # issue 30


@dataclass
class DecisionRecord:
    """One query of the decision benchmark: its label, the decision, each route's measured cost.

    Args:
        item_id (`str`): the query id (``id`` on disk).
        query (`str`): the user query.
        needs_tool (`bool`): a tool-needing (StableToolBench) query, else a tool-free one.
        gold (`list[str]`): the gold functions (StableToolBench ``relevant APIs``); empty when tool-free.
        group (`str`), category (`str`): StableToolBench group / tool-free category.
        tools_from (`str`, *optional*): for a tool-free query, whose tool list it was offered.
        n_functions (`int`): functions offered.
        options (`list[str]`): ``NONE`` and the function names, in the order scored.
        choice (`str`): the top option; confidence (`float`): its probability in [0, 1];
            method (`str`): how the confidence was computed (``logprobs``, ``samples``, ``prm``...).
        logprobs, null_logprobs (`list[float]`): per option, raw and content-free log-probabilities.
        samples (`list`): sampled choices (``samples`` method).
        top (`list`): the five best ``[option, score]`` pairs.
        route (`str`): the route at the configured thresholds (``direct``, ``fast`` or ``search``).
        costs (`RouteCosts`): measured costs.
        direct_answer (`str`, *optional*), answer (`str`, *optional*): the direct reply and the reference.
        answer_correct (`bool`, *optional*): lenient match of the two (``None`` without both).
        fast_first_action, search_first_action (`str`, *optional*): first executed call of each
            route's trajectory (``NONE`` when it called none; ``None`` when not run).
        fast_fallback (`str`, *optional*): why the fast path fell back to the search.
        benchmark (`str`): where the query comes from (``stabletoolbench``, ``tool_free``, ...).
        p_tool (`float`, *optional*): the decision's P(tool necessary).
        necessity (`dict[str, float]`): P(tool necessary) under each compared method.
        search_tool_calls (`int`, *optional*), search_success (`bool`, *optional*): executed tool
            calls and grounded success of the always-search trajectory (``run_search``).
    """

    item_id: str = ""
    query: str = ""
    needs_tool: bool = False
    gold: list[str] = field(default_factory=list)
    group: str = ""
    category: str = ""
    tools_from: str | None = None
    n_functions: int = 0
    options: list[str] = field(default_factory=list)
    choice: str | None = None
    confidence: float = 0.0
    method: str = ""
    logprobs: list[float] | None = None
    null_logprobs: list[float] | None = None
    samples: list[Any] | None = None
    top: list[Any] = field(default_factory=list)
    route: str = ""
    costs: RouteCosts = field(default_factory=lambda: RouteCosts(Cost(0, 0.0)))
    direct_answer: str | None = None
    answer: str | None = None
    answer_correct: bool | None = None
    fast_first_action: str | None = None
    fast_fallback: str | None = None
    search_first_action: str | None = None
    benchmark: str = ""
    p_tool: float | None = None
    necessity: dict[str, float] = field(default_factory=dict)
    search_tool_calls: int | None = None
    search_success: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The line of ``records.jsonl`` (keys and order as in earlier files: ``id`` first)."""
        data = {("id" if f.name == "item_id" else f.name): getattr(self, f.name) for f in dataclasses.fields(self)}
        data["costs"] = self.costs.to_dict()
        for key in _ADDED:  # left out while unset, so earlier lines read back unchanged
            if data[key] in ("", None, {}):
                del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecisionRecord:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["item_id"] = data["id"]
        values["costs"] = RouteCosts.from_dict(data["costs"])
        return cls(**values)
