"""``codetool eval-decision``: benchmark the decide-first stage with When2Tool-style metrics.

**The labelled set** mixes tool-needing queries (StableToolBench test groups; the gold functions
are the query's ``relevant APIs``) with tool-free queries (``codetool/resources/
tool_free_queries.jsonl``: general knowledge, arithmetic, unit conversion, writing, definitions,
reasoning, code, language, advice, maths). A tool-free query is offered the tool list of one of
the sampled tool-needing queries, so both kinds see the same tool lists.
Queries whose gold APIs are not among their offered APIs are skipped and counted, never dropped
silently.

**Metrics** (definitions in :func:`action_metrics`). The When2Tool benchmark (Sun et al., 2026,
"LLM Agents Already Know When to Call Tools") scores the trade-off between task accuracy and tool
calls per task on tool-necessary vs tool-unnecessary tasks; When2Call (Ross et al., NAACL 2025)
scores the choice between answering directly and calling a tool as a multiple-choice decision and
counts tool hallucinations. We report, per first action: tool-invocation accuracy, tool-selection
error, hallucination rate (answering without a tool when one was needed), unnecessary tool use on
tool-free queries, decision and necessity accuracy; then the cost of routing (tokens and seconds
per query) against always running the full search, over a sweep of thresholds.

**Three layers**, each computed from what was actually run:

1. the decision alone (the top option, no threshold), for every option scoring of the logprobs
   method (raw sum, per character, and both calibrated against a content-free request);
2. routing at a threshold: direct / fast / search; without search runs a query sent to the search
   is "deferred" (its first tool is unknown);
3. with ``run_search``: every query's fast path (with its fallback) and the always-search baseline
   run for real; the first action is then the first executed tool call, and tokens/seconds at any
   threshold are exact sums of measured costs (decision + the route taken at that threshold).

Outputs in ``output``: ``report.json``, ``report.md``, ``decision_sweep.png``, ``records.jsonl``
(one line per query) and, with ``run_search``, the trajectories of both runs.

Limits: seconds per query are each query's share of batched calls (``phase_seconds``), so they
depend on what ran in the same batch and on other load of the machine; tokens do not. The sweep ties ``t_none`` and
``t_tool`` together. Direct-answer accuracy is a lenient string match, not a judge.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError, option, to_dict
from codetool.eval.decision_report import pct, plot_sweep, render_markdown
from codetool.executor import ExecutorConfig
from codetool.jsonl import append_jsonl, write_jsonl
from codetool.search.decide import (
    NONE,
    Decision,
    RouterConfig,
    api_candidates,
    decide,
    option_probabilities,
    route_for,
)
from codetool.search.search import SearchConfig

logger = logging.getLogger(__name__)

SEARCH = "SEARCH"  # first action of a query deferred to the full search, when its tool is unknown


@dataclass
class DecisionEvalConfig:
    """Settings of ``codetool eval-decision``."""

    model: str = option("default", "policy model: default, a path, a Hub id, an http(s) URL or vllm:<model>")
    decider: str = option("", "a separate deciding model (default: the policy)")
    data: str = option("", "benchmark data folder (default: ./data, $CODETOOL_DATA or ../shared/data)")
    groups: list[str] = option(default_factory=lambda: ["G1_instruction"], help="StableToolBench groups to draw from")
    n_tool: int = option(20, "tool-needing queries (StableToolBench)")
    n_free: int = option(20, "tool-free queries (packaged set)")
    free_queries: str = option("", "JSONL of tool-free queries (default: the packaged set)")
    seed: int = option(0, "sampling seed of the query draw")
    output: str = option("runs/eval-decision", "folder for report.json, report.md, the PNG and records")
    answer_direct: bool = option(True, "generate a direct answer for every query (cost of the direct route, "
                                 "answer accuracy on tool-free queries)")
    run_search: bool = option(False, "run the fast path and the always-search baseline (needs the executor)")
    reuse: str = option("", "records.jsonl of an earlier run on the same draw: reuse its decisions and direct "
                        "answers instead of recomputing them")
    tools_backend: str = option("simulator", "tool backend for run_search")
    tool_doc: str = option("compact", "tool docs in the policy prompt (run_search)", choices=["full", "compact", "brief"])
    thresholds: list[float] = option(default_factory=list, help="thresholds to sweep (default: every recorded confidence)")
    dtype: str = option("auto", "model dtype", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device: auto, cpu, cuda, ...")
    router: RouterConfig = field(default_factory=RouterConfig)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(method="spot", latent="none", w_latent=0.0,
                                                                      max_steps=3, max_new_tokens=192))
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def __post_init__(self):
        if self.n_tool < 0 or self.n_free < 0 or self.n_tool + self.n_free == 0:
            raise ConfigError(f"need n_tool >= 0, n_free >= 0 and some queries, got {self.n_tool} and {self.n_free}.")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"thresholds must lie in [0, 1], got {self.thresholds}.")
        if self.run_search and self.search.latent == "prm":
            raise ConfigError("eval-decision runs the search without a PRM, but search.latent is 'prm' (a "
                              "--search.* override resets the nested defaults): add --search.latent none "
                              "--search.w_latent 0.")


@dataclass
class DecisionItem:
    """One labelled query.

    Args:
        item_id (`str`): ``stb-<group>-<query_id>`` or the tool-free id.
        query (`str`): the request.
        needs_tool (`bool`): whether answering needs a tool.
        gold (`list[str]`): function names that are a right first call (empty when tool-free).
        apis (`list[APISpec]`): the APIs offered, with function names assigned.
        group (`str`): the StableToolBench group, or ``tool_free``.
        category (`str`): the tool-free category, or the group.
        answer (`str` or `None`): the reference answer of a tool-free query, when there is one.
        tools_from (`str` or `None`): the StableToolBench query whose tools a tool-free query is offered.
    """

    item_id: str
    query: str
    needs_tool: bool
    gold: list[str]
    apis: list
    group: str
    category: str
    answer: str | None = None
    tools_from: str | None = None


def load_tool_free(path: str | Path | None = None) -> list[dict]:
    """The tool-free queries (``id``, ``query``, ``category``, optional ``answer``), packaged by default.

    Raises:
        CodetoolError: a missing file or a row without ``id``/``query``/``category``.
    """
    if path:
        if not Path(path).is_file():
            raise CodetoolError(f"free_queries: {path} not found; leave it empty to use the packaged set.")
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = resources.files("codetool").joinpath("resources/tool_free_queries.jsonl").read_text(encoding="utf-8")
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CodetoolError(f"{path or 'tool_free_queries.jsonl'} line {i}: not valid JSON ({e}).") from None
        if not isinstance(row, dict) or not all(row.get(k) for k in ("id", "query", "category")):
            raise CodetoolError(f"{path or 'tool_free_queries.jsonl'} line {i}: needs id, query and category, "
                                f"got {row!r:.120}.")
        rows.append(row)
    return rows


def build_items(cfg: DecisionEvalConfig) -> tuple[list[DecisionItem], dict[str, int]]:
    """Draw the labelled set: ``n_tool`` StableToolBench queries and ``n_free`` tool-free ones.

    Returns:
        The items (tool-needing first, then tool-free; each part in draw order) and the counts of
        skipped StableToolBench queries by reason (``no_apis``, ``gold_not_offered``).
    """
    from codetool.tools import assign_function_names, load_stabletoolbench

    root = Path(cfg.data) if cfg.data else None
    pool = [q for group in cfg.groups for q in load_stabletoolbench(group, root)]
    rng = random.Random(cfg.seed)
    rng.shuffle(pool)
    skipped: Counter = Counter()
    usable = []
    for q in pool:
        if not q.apis:
            skipped["no_apis"] += 1
            continue
        if not all(a.name for a in q.apis) or len({a.name for a in q.apis}) != len(q.apis):
            assign_function_names(q.apis)
        usable.append(q)
    items = []
    for q in usable:
        if len(items) >= cfg.n_tool:
            break
        by_key = {a.key: a.name for a in q.apis}
        gold = sorted({by_key[tuple(p)] for p in q.relevant_apis if tuple(p) in by_key})
        if not gold:
            skipped["gold_not_offered"] += 1
            continue
        items.append(DecisionItem(f"stb-{q.group}-{q.query_id}", q.query, True, gold, q.apis, q.group, q.group))
    if len(items) < cfg.n_tool:
        logger.warning("only %d usable tool-needing queries in %s (asked for %d)", len(items), cfg.groups, cfg.n_tool)
    free = load_tool_free(cfg.free_queries or None)
    rng.shuffle(free)
    if len(free) < cfg.n_free:
        logger.warning("only %d tool-free queries available (asked for %d)", len(free), cfg.n_free)
    if free[:cfg.n_free] and not usable:
        raise CodetoolError(f"no StableToolBench query with APIs in {cfg.groups}: tool-free queries need a tool list.")
    # each tool-free query is offered the tool list of a sampled tool-needing query (a matched pair
    # that shares the content-free calibration pass), or of any usable query when none is sampled
    donors = [q for q in usable if f"stb-{q.group}-{q.query_id}" in {i.item_id for i in items}] or usable
    for k, row in enumerate(free[:cfg.n_free]):
        donor = donors[k % len(donors)]
        items.append(DecisionItem(str(row["id"]), row["query"], False, [], donor.apis, "tool_free", row["category"],
                                  answer=row.get("answer"), tools_from=f"{donor.group}-{donor.query_id}"))
    return items, dict(skipped)


def action_metrics(rows: list[dict], actions: list[str | None]) -> dict[str, float | int | None]:
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
        rows (`list[dict]`): per query, ``needs_tool`` (bool) and ``gold`` (list of names).
        actions (`list`): the first action of each row.
    Returns:
        The metrics (fractions in [0, 1], ``None`` where the denominator is 0) and the counts
        ``n``, ``n_tool``, ``n_free``.
    """
    tool = [(r, a) for r, a in zip(rows, actions, strict=True) if r["needs_tool"]]
    free = [a for r, a in zip(rows, actions, strict=True) if not r["needs_tool"]]

    def share(count: int, total: int) -> float | None:
        return count / total if total else None

    right = sum(a in r["gold"] for r, a in tool)
    wrong = sum(a not in (None, NONE, SEARCH) and a not in r["gold"] for r, a in tool)
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


def first_action(traj: dict | None) -> str | None:
    """The first executed tool call of a trajectory record, ``NONE`` when it called no tool."""
    if traj is None:
        return None
    for step in traj.get("steps", []):
        cand = step["candidates"][step.get("chosen", 0)]
        for call in cand.get("result", {}).get("tool_calls", []):
            return call.get("name")
    return NONE


def _cost(traj: dict | None) -> dict[str, float] | None:
    """Tokens and seconds of a trajectory record. Seconds are the query's share of the batched
    phases (``phase_seconds``), not its wall time: episodes that share rounds each span the whole
    round, so summing wall times would count the same seconds several times."""
    if traj is None:
        return None
    phases = traj.get("phase_seconds") or {}
    seconds = sum(phases.values()) if phases else traj["wall_time_s"]
    return {"tokens": traj["prompt_tokens"] + traj["completion_tokens"], "seconds": seconds}


def route_at(record: dict, t_none: float, t_tool: float) -> str:
    """The route of a benchmark record's decision under thresholds ``t_none``/``t_tool``."""
    d = Decision(record["choice"], record["confidence"], record["method"])
    return route_for(d, RouterConfig(t_none=t_none, t_tool=t_tool))


def threshold_row(records: list[dict], t_none: float, t_tool: float) -> dict[str, Any]:
    """Metrics, route counts and cost per query of routing at one pair of thresholds.

    The first action of a query is ``NONE`` on the direct route; on the fast route the first call
    of its fast-path trajectory (the chosen function when it did not run); on the search route the
    first call of the always-search trajectory (``SEARCH`` when it did not run). Tokens and seconds
    per query are the decision's cost plus the measured cost of the route taken (``None`` when a
    needed cost was not measured); ``always_search`` is the baseline's cost without a decision.
    """
    actions, tokens, seconds, routes = [], [], [], Counter()
    for r in records:
        route = route_at(r, t_none, t_tool)
        routes[route] += 1
        costs = r["costs"]
        if route == "direct":
            actions.append(NONE)
            cost = costs.get("direct")
        elif route == "fast":
            actions.append(r.get("fast_first_action") or r["choice"])
            cost = costs.get("fast")
        else:
            actions.append(r.get("search_first_action") or SEARCH)
            cost = costs.get("search")
        base = costs["decision"]
        tokens.append(None if cost is None else base["tokens"] + cost["tokens"])
        seconds.append(None if cost is None else base["seconds"] + cost["seconds"])
    row: dict[str, Any] = {"t_none": t_none, "t_tool": t_tool, **action_metrics(records, actions),
                           "routes": {k: routes.get(k, 0) for k in ("direct", "fast", "search")}}
    complete = records and all(x is not None for x in tokens)
    row["tokens_per_query"] = sum(tokens) / len(tokens) if complete else None
    row["seconds_per_query"] = sum(seconds) / len(seconds) if complete else None
    return row


def baseline_row(records: list[dict]) -> dict[str, Any] | None:
    """Always running the full search: its metrics and cost per query (``None`` when not run)."""
    if not records or any(r["costs"].get("search") is None for r in records):
        return None
    actions = [r.get("search_first_action") or SEARCH for r in records]
    n = len(records)
    return {**action_metrics(records, actions),
            "tokens_per_query": sum(r["costs"]["search"]["tokens"] for r in records) / n,
            "seconds_per_query": sum(r["costs"]["search"]["seconds"] for r in records) / n}


def sweep_thresholds(records: list[dict], thresholds: list[float] | None = None) -> list[dict[str, Any]]:
    """:func:`threshold_row` at ``t_none = t_tool = t`` for each ``t`` (default: 0, every recorded
    confidence, and 1), in increasing order."""
    grid = thresholds or [0.0, 1.0] + [round(r["confidence"], 4) for r in records]
    return [threshold_row(records, t, t) for t in sorted(set(grid))]


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


def _argmax_choices(records: list[dict], scoring: str) -> list[str | None]:
    """The top option of each logprobs record under another scoring: ``sum`` or ``chars`` of the
    raw log-probs, or ``pmi-sum``/``pmi-chars`` of the calibrated ones (needs ``null_logprobs``)."""
    out = []
    for r in records:
        raw = r["logprobs"]
        if scoring.startswith("pmi-"):
            raw = [a - b for a, b in zip(raw, r["null_logprobs"], strict=True)]
        probs = option_probabilities(raw, r["options"], scoring.removeprefix("pmi-"))
        out.append(r["options"][max(range(len(probs)), key=lambda j: (probs[j], -j))])
    return out


def _direct_answers(policy, items: list[DecisionItem], cfg: DecisionEvalConfig) -> list[dict]:
    """A direct answer for every item in one batched call: text, tokens, seconds (an even share)."""
    from codetool.search.decide import answer_messages

    start = time.perf_counter()
    outputs = policy.generate([answer_messages(it.query) for it in items], n=1, temperature=0.0,
                              max_new_tokens=cfg.router.answer_max_new_tokens, seed=cfg.router.seed)
    share = (time.perf_counter() - start) / max(1, len(items))
    return [{"text": c.text.strip(), "tokens": c.prompt_tokens + c.completion_tokens, "seconds": share}
            for [c] in outputs]


def _reuse(path: str, items: list[DecisionItem]) -> tuple[list[Decision], list[dict | None]]:
    """Decisions and direct answers of ``items`` from an earlier ``records.jsonl``.

    A record counts only when its item id and offered functions match. The first ``n`` items of a
    draw do not depend on ``n`` (same seed), so a smaller draw can reuse a bigger one's records
    while ``n_free <= n_tool`` (tool-free queries borrow the tool lists of the tool-needing ones).

    Raises:
        CodetoolError: the file is missing or lacks one of the items (a different draw).
    """
    from codetool.jsonl import read_jsonl

    if not Path(path).is_file():
        raise CodetoolError(f"reuse: {path} not found; point it at the records.jsonl of an earlier run.")
    by_id = {r["id"]: r for r in read_jsonl(path) if "id" in r}
    missing = [it.item_id for it in items if it.item_id not in by_id
               or by_id[it.item_id].get("options") != [NONE, *(n for n, _ in api_candidates(it.apis))]]
    if missing:
        raise CodetoolError(f"reuse: {path} has no record of {missing[:3]} ({len(missing)} in all) with the same "
                            f"functions offered; use the same groups, seed and free_queries as that run, and "
                            f"n_free <= n_tool or the same n_tool and n_free.")
    decisions, direct = [], []
    for it in items:
        r = by_id[it.item_id]
        cost = r["costs"]["decision"]
        decisions.append(Decision(r["choice"], r["confidence"], r["method"], scores=dict(r["top"]),
                                  logprobs=r["logprobs"], null_logprobs=r["null_logprobs"], samples=r["samples"],
                                  prompt_tokens=cost["tokens"], seconds=cost["seconds"]))
        d = r["costs"]["direct"]
        direct.append(None if d is None else {"text": r["direct_answer"], **d})
    return decisions, direct


def _run_search(cfg: DecisionEvalConfig, items: list[DecisionItem], decisions: list[Decision], policy,
                out: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Every item's fast path (items whose top option is a function, with fallback) and the
    always-search baseline on every item; returns trajectory records by item id."""
    from codetool.config import config_hash
    from codetool.executor import Executor
    from codetool.search.router import route_and_solve
    from codetool.search.search import SearchTask, StepwiseSearch
    from codetool.tools import ToolEnvironment, make_tool_backend

    backend = make_tool_backend(cfg.tools_backend)

    def tasks(subset):
        return [SearchTask(query_id=it.item_id, query=it.query, benchmark="stabletoolbench" if it.needs_tool
                           else "tool_free", group=it.group, extra={"gold": it.gold},
                           env=ToolEnvironment(it.apis, backend, render_style=cfg.tool_doc)) for it in subset]

    def make_executor(task):
        return Executor(cfg.executor, tools=task.env.functions())

    search = StepwiseSearch(policy, cfg.search, make_executor, config_hash=config_hash(cfg.search))
    paths = {"fast": out / "trajectories_fast.jsonl", "search": out / "trajectories_search.jsonl"}
    for path in paths.values():
        path.unlink(missing_ok=True)
    pairs = [(it, d) for it, d in zip(items, decisions) if d.tool is not None]
    logger.info("fast path on %d queries, then the full search on all %d", len(pairs), len(items))
    fast = route_and_solve(tasks([it for it, _ in pairs]), replace(cfg.router, t_tool=0.0), search, policy,
                           decisions=[d for _, d in pairs], on_done=lambda t: append_jsonl(paths["fast"], t.to_dict()))
    full = search.run(tasks(items), on_done=lambda t: append_jsonl(paths["search"], t.to_dict()))
    return {t.query_id: t.to_dict() for t in fast}, {t.query_id: t.to_dict() for t in full}


def _record(item: DecisionItem, d: Decision, direct: dict | None, fast: dict | None, searched: dict | None,
            cfg: DecisionEvalConfig) -> dict[str, Any]:
    """One line of ``records.jsonl``: the label, the decision, each route's measured cost."""
    names = [n for n, _ in api_candidates(item.apis)]
    decision_cost = {"tokens": d.prompt_tokens + d.completion_tokens + d.scored_tokens, "seconds": d.seconds}
    fast_cost = _cost(fast)
    if fast_cost is not None:  # the fast trajectory includes the decision it was given; keep the route alone
        fast_cost = {"tokens": fast_cost["tokens"] - decision_cost["tokens"],
                     "seconds": max(0.0, fast_cost["seconds"] - d.seconds)}
    return {"id": item.item_id, "query": item.query, "needs_tool": item.needs_tool, "gold": item.gold,
            "group": item.group, "category": item.category, "tools_from": item.tools_from,
            "n_functions": len(names), "options": [NONE, *names], "choice": d.choice,
            "confidence": d.confidence, "method": d.method, "logprobs": d.logprobs,
            "null_logprobs": d.null_logprobs, "samples": d.samples,
            "top": sorted(d.scores.items(), key=lambda kv: -kv[1])[:5],
            "route": route_for(d, cfg.router),
            "costs": {"decision": decision_cost,
                      "direct": None if direct is None else {"tokens": direct["tokens"], "seconds": direct["seconds"]},
                      "fast": fast_cost, "search": _cost(searched)},
            "direct_answer": None if direct is None else direct["text"], "answer": item.answer,
            "answer_correct": None if direct is None or not item.answer else answer_matches(direct["text"], item.answer),
            "fast_first_action": first_action(fast), "fast_fallback": (fast or {}).get("routing", {}).get("fallback"),
            "search_first_action": first_action(searched)}


def build_report(cfg: DecisionEvalConfig, records: list[dict], skipped: dict[str, int], seconds: float) -> dict:
    """``report.json``: counts, the decision layer, routing at the configured thresholds, the
    always-search baseline and saving, the sweep, per-category accuracy, direct-answer accuracy."""
    method = records[0]["method"] if records else None
    at = threshold_row(records, cfg.router.t_none, cfg.router.t_tool)
    at["fast_fallbacks"] = sum(1 for r in records if route_at(r, cfg.router.t_none, cfg.router.t_tool) == "fast"
                               and r["fast_fallback"])
    base = baseline_row(records)
    saving = None
    if base and at["tokens_per_query"] is not None:
        saving = {"tokens": 1 - at["tokens_per_query"] / max(base["tokens_per_query"], 1e-9),
                  "seconds": 1 - at["seconds_per_query"] / max(base["seconds_per_query"], 1e-9)}
    by_category = {}
    for cat in sorted({r["category"] for r in records}):
        rows = [r for r in records if r["category"] == cat]
        by_category[cat] = {"n": len(rows), **{k: v for k, v in action_metrics(rows, [r["choice"] for r in rows]).items()
                                                if k in ("decision_accuracy", "necessity_accuracy")}}
    judged = [r for r in records if r["answer_correct"] is not None]
    notes = ["Each tool-free query is offered the tool list of a sampled tool-needing query (tools_from).",
             "Direct-answer accuracy is a lenient string match against the reference, not a judge."]
    if not cfg.run_search:
        notes.append("run_search was off: the fast and search routes were not run, so their first tool is "
                     "unknown ('deferred') and tokens/seconds against always-search are not available.")
    n = max(1, len(records))
    return {
        "benchmark": "decision", "model": cfg.model, "decider": cfg.decider or cfg.model, "method": method,
        "scoring": (("pmi-" if cfg.router.calibrate else "") + cfg.router.length_norm) if method == "logprobs" else None,
        "thresholds": {"t_none": cfg.router.t_none, "t_tool": cfg.router.t_tool},
        "counts": {"tool": sum(r["needs_tool"] for r in records), "free": sum(not r["needs_tool"] for r in records),
                   "groups": dict(Counter(r["group"] for r in records)),
                   "categories": dict(Counter(r["category"] for r in records)),
                   "mean_functions_offered": sum(r["n_functions"] for r in records) / n},
        "skipped": skipped,
        "decision": action_metrics(records, [r["choice"] for r in records]),
        "decision_by_scoring": {k: action_metrics(records, _argmax_choices(records, k)) for k in SCORINGS
                                if not k.startswith("pmi-") or all(r["null_logprobs"] for r in records)}
        if method == "logprobs" else None,
        "decision_cost": {"tokens_per_query": sum(r["costs"]["decision"]["tokens"] for r in records) / n,
                          "seconds_per_query": sum(r["costs"]["decision"]["seconds"] for r in records) / n},
        "at_threshold": at, "always_act": threshold_row(records, 0.0, 0.0), "always_search": base, "saving": saving,
        "sweep": sweep_thresholds(records, cfg.thresholds or None), "by_category": by_category,
        "direct_answers": {"with_reference": len(judged), "correct": sum(r["answer_correct"] for r in judged),
                           "accuracy": sum(r["answer_correct"] for r in judged) / len(judged) if judged else None},
        "seconds_total": seconds, "notes": notes, "config": to_dict(cfg),
    }


def eval_decision_command(cfg: DecisionEvalConfig) -> int:
    """``codetool eval-decision``: decide on the labelled set, optionally run the routes, report."""
    from rich.console import Console

    from codetool.models.backends import make_backend
    from codetool.secrets import redact_obj

    start = time.perf_counter()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    items, skipped = build_items(cfg)
    kwargs = {} if cfg.model.startswith(("http://", "https://")) else {"dtype": cfg.dtype, **(
        {} if cfg.model.startswith("vllm:") else {"device": cfg.device})}
    policy = make_backend(cfg.model, **kwargs)
    decider = make_backend(cfg.decider, **kwargs) if cfg.decider else policy
    logger.info("deciding on %d queries (%d tool-needing, %d tool-free)", len(items),
                sum(i.needs_tool for i in items), sum(not i.needs_tool for i in items))
    if cfg.reuse:
        decisions, direct = _reuse(cfg.reuse, items)
    else:
        decisions = decide(decider, [(it.query, api_candidates(it.apis)) for it in items], cfg.router)
        direct = _direct_answers(policy, items, cfg) if cfg.answer_direct else [None] * len(items)
    fast, searched = _run_search(cfg, items, decisions, policy, out) if cfg.run_search else ({}, {})
    records = [_record(it, d, dr, fast.get(it.item_id), searched.get(it.item_id), cfg)
               for it, d, dr in zip(items, decisions, direct)]
    report = redact_obj(build_report(cfg, records, skipped, time.perf_counter() - start))
    write_jsonl(out / "records.jsonl", records)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    plot_sweep(report, out / "decision_sweep.png")
    d, at = report["decision"], report["at_threshold"]
    Console().print(f"decision ({report['method']}): accuracy {pct(d['decision_accuracy'])}%, tool-invocation "
                    f"{pct(d['tool_invocation_accuracy'])}%, hallucination {pct(d['hallucination_rate'])}%, "
                    f"unnecessary {pct(d['unnecessary_tool_rate'])}%; routes at the threshold {at['routes']}; "
                    f"report in {out}/report.md", markup=False, highlight=False)
    return 0
