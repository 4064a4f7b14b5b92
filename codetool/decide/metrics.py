"""When2Tool-style metrics of the decide-first benchmark, computed from its per-query records
(:class:`~codetool.decide.records.DecisionRecord`, the rows of ``records.jsonl``).

The When2Tool benchmark (Sun et al., 2026, "LLM Agents Already Know When to Call Tools") scores the
trade-off between task accuracy and tool calls per task on tool-necessary vs tool-unnecessary
tasks; When2Call (Ross et al., NAACL 2025) scores the choice between answering directly and
calling a tool as a multiple-choice decision and counts tool hallucinations. Definitions in
:func:`action_metrics`; routing at thresholds in :func:`threshold_row`; the always-search baseline
in :func:`baseline_row`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from codetool.decide.records import Cost, DecisionRecord
from codetool.decide.stage import NONE, Decision, RouterConfig, option_probabilities, route_for

if TYPE_CHECKING:
    from codetool.search.records import Trajectory

SEARCH = "SEARCH"  # first action of a query deferred to the full search, when its tool is unknown


def action_metrics(rows: Sequence[DecisionRecord], actions: Sequence[str | None]) -> dict[str, float | int | None]:
    """When2Tool-style metrics of the first actions taken on a labelled set.

    Let T be the tool-needing queries (gold functions G(q)) and F the tool-free ones. The first
    action a(q) is ``"NONE"`` (answer without a tool), a function name, ``"SEARCH"`` (handed to the
    full search, its first call unknown) or ``None`` (no decision; also handed to the search).

    - ``tool_invocation_accuracy`` = |{q in T : a(q) in G(q)}| / |T| (first action is a right tool).
    - ``tool_selection_error`` = |{q in T : a(q) is a function not in G(q)}| / |T|.
    - ``hallucination_rate`` = |{q in T : a(q) = NONE}| / |T| (answers without the tool it needed).
    - ``deferred_rate`` = |{q in T : a(q) in {SEARCH, None}}| / |T|; the four shares sum to 1.
    - ``unnecessary_tool_rate`` = |{q in F : a(q) != NONE}| / |F| (tools, or the tool-using
      search, started on a query that needed none).
    - ``decision_accuracy`` = (|{q in T : a(q) in G(q)}| + |{q in F : a(q) = NONE}|) / (|T| + |F|).
    - ``necessity_accuracy`` = (|{q in T : a(q) != NONE}| + |{q in F : a(q) = NONE}|) / (|T| + |F|):
      the binary "is a tool needed" decision that When2Tool studies.

    Args:
        rows (`list[DecisionRecord]`): per query, ``needs_tool`` (bool) and ``gold`` (list of names)
            are read (a ``DecisionItem`` has them too).
        actions (`list`): the first action of each row.
    Returns:
        The metrics (fractions in [0, 1], ``None`` where the denominator is 0) and the counts
        ``n``, ``n_tool``, ``n_free``.
    """
    tool = [(r, a) for r, a in zip(rows, actions, strict=True) if r.needs_tool]
    free = [a for r, a in zip(rows, actions, strict=True) if not r.needs_tool]

    def share(count: int, total: int) -> float | None:
        return count / total if total else None

    right = sum(a in r.gold for r, a in tool)
    wrong = sum(a not in (None, NONE, SEARCH) and a not in r.gold for r, a in tool)
    halluc = sum(a == NONE for _, a in tool)
    free_none = sum(a == NONE for a in free)
    n = len(tool) + len(free)
    return {"n": n, "n_tool": len(tool), "n_free": len(free),
            "tool_invocation_accuracy": share(right, len(tool)), "tool_selection_error": share(wrong, len(tool)),
            "hallucination_rate": share(halluc, len(tool)),
            "deferred_rate": share(len(tool) - right - wrong - halluc, len(tool)),
            "unnecessary_tool_rate": share(len(free) - free_none, len(free)),
            "decision_accuracy": share(right + free_none, n),
            "necessity_accuracy": share(len(tool) - halluc + free_none, n)}


def first_action(traj: Trajectory | None) -> str | None:
    """The first executed tool call of a trajectory, ``NONE`` when it called no tool."""
    if traj is None:
        return None
    calls = traj.executed_calls()
    return calls[0].name if calls else NONE


def trajectory_cost(traj: Trajectory | None) -> Cost | None:
    """Tokens and seconds of a trajectory. Seconds are the query's share of the batched
    phases (``phase_seconds``), not its wall time: episodes that share rounds each span the whole
    round, so summing wall times would count the same seconds several times."""
    if traj is None:
        return None
    phases = traj.phase_seconds or {}
    seconds = sum(phases.values()) if phases else traj.wall_time_s
    return Cost(tokens=traj.prompt_tokens + traj.completion_tokens, seconds=seconds)


def route_at(record: DecisionRecord, t_none: float, t_tool: float, prefill: str = "soft") -> str:
    """The route of a benchmark record's decision under thresholds ``t_none``/``t_tool`` (a probe
    decision reads ``t_tool`` as ``t_probe``, with ``prefill``)."""
    d = Decision(record.choice, record.confidence, record.method, p_tool=record.p_tool)
    return route_for(d, RouterConfig(t_none=t_none, t_tool=t_tool, t_probe=t_tool, prefill=prefill))


def threshold_row(records: list[DecisionRecord], t_none: float, t_tool: float, prefill: str = "soft") -> dict[str, Any]:
    """Metrics, route counts and cost per query of routing at one pair of thresholds.

    The first action of a query is ``NONE`` on the direct route; on the fast route the first call
    of its fast-path trajectory (the chosen function when it did not run); on the search route the
    first call of the always-search trajectory (``SEARCH`` when it did not run). Tokens and seconds
    per query are the decision's cost plus the measured cost of the route taken (``None`` when a
    needed cost was not measured); ``always_search`` is the baseline's cost without a decision.
    """
    actions: list[str | None] = []
    tokens: list[int | None] = []
    seconds: list[float | None] = []
    routes: Counter[str] = Counter()
    for r in records:
        route = route_at(r, t_none, t_tool, prefill)
        routes[route] += 1
        if route == "direct":
            actions.append(NONE)
        elif route == "fast":
            actions.append(r.fast_first_action or r.choice)
        else:
            actions.append(r.search_first_action or SEARCH)
        cost, base = r.costs.route(route), r.costs.decision
        tokens.append(None if cost is None else base.tokens + cost.tokens)
        seconds.append(None if cost is None else base.seconds + cost.seconds)
    row: dict[str, Any] = {"t_none": t_none, "t_tool": t_tool, **action_metrics(records, actions),
                           "routes": {k: routes.get(k, 0) for k in ("direct", "fast", "search")}}
    complete = records and all(x is not None for x in tokens)
    row["tokens_per_query"] = sum(t for t in tokens if t is not None) / len(tokens) if complete else None
    row["seconds_per_query"] = sum(s for s in seconds if s is not None) / len(seconds) if complete else None
    return row


def baseline_row(records: list[DecisionRecord]) -> dict[str, Any] | None:
    """Always running the full search: its metrics and cost per query (``None`` when not run)."""
    searched = [r.costs.search for r in records if r.costs.search is not None]
    if not records or len(searched) < len(records):
        return None
    actions = [r.search_first_action or SEARCH for r in records]
    n = len(records)
    return {**action_metrics(records, actions),
            "tokens_per_query": sum(c.tokens for c in searched) / n,
            "seconds_per_query": sum(c.seconds for c in searched) / n}


def sweep_thresholds(records: list[DecisionRecord], thresholds: list[float] | None = None,
                     prefill: str = "soft") -> list[dict[str, Any]]:
    """:func:`threshold_row` at ``t_none = t_tool = t`` for each ``t`` (default: 0, every recorded
    confidence (a probe's P(tool necessary)), and 1), in increasing order."""
    grid = thresholds or [0.0, 1.0] + [round(r.p_tool if r.method == "probe" and r.p_tool is not None else r.confidence, 4)
                                       for r in records]
    return [threshold_row(records, t, t, prefill) for t in sorted(set(grid))]


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def answer_matches(reply: str, answer: str) -> bool:
    """Lenient check of a direct answer against a reference (an indicator, not a judge).

    The reference's core (text before `` (``, without a leading "about"/"the"/"a"/"an") must appear
    in the reply as whole words, case-insensitively; or, when the core holds a number, that number
    must appear among the reply's numbers (thousands separators ignored).
    """
    core = answer.split(" (")[0].strip().lower()
    core = re.sub(r"^(about|roughly|the|a|an)\s+", "", core).rstrip(".")
    text = " ".join(reply.lower().split())
    if core and re.search(rf"(?<![\w]){re.escape(core)}(?![\w])", text):
        return True
    numbers = _NUMBER.findall(core.replace(",", ""))
    if numbers:
        said = {float(x) for x in _NUMBER.findall(reply.replace(",", ""))}
        return float(numbers[0]) in said
    return False


SCORINGS = ("sum", "chars", "pmi-sum", "pmi-chars")


def argmax_choices(records: list[DecisionRecord], scoring: str) -> list[str | None]:
    """The top option of each logprobs record under another scoring: ``sum`` or ``chars`` of the
    raw log-probs, or ``pmi-sum``/``pmi-chars`` of the calibrated ones (needs ``null_logprobs``)."""
    out: list[str | None] = []
    for r in records:
        raw = r.logprobs
        assert raw is not None, "a logprobs record"
        if scoring.startswith("pmi-"):
            assert r.null_logprobs is not None, "pmi scoring needs null_logprobs (calibrate)"
            raw = [a - b for a, b in zip(raw, r.null_logprobs, strict=True)]
        probs = option_probabilities(raw, r.options, scoring.removeprefix("pmi-"))
        out.append(r.options[max(range(len(probs)), key=lambda j: (probs[j], -j))])
    return out
