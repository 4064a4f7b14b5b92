"""The steps of the decide-first benchmark (``codetool eval-decision``, :mod:`codetool.commands.eval_decision`).

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

import logging
import time
from dataclasses import replace
from pathlib import Path

from codetool import CodetoolError
from codetool.decide.labelled import DecisionItem
from codetool.decide.metrics import answer_matches, first_action, trajectory_cost
from codetool.decide.records import Cost, DecisionRecord, RouteCosts
from codetool.decide.stage import NONE, Decision, RouterConfig, api_candidates, route_for
from codetool.jsonl import append_jsonl
from codetool.rewards import grounded_success
from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)


def direct_answers(policy, items: list[DecisionItem], *, max_new_tokens: int, seed: int | None) -> list[dict]:
    """A direct answer for every item in one batched greedy call (``prompts/decide_answer.txt``).

    Returns:
        Per item ``{"text", "tokens", "seconds"}``; seconds are an even share of the call.
    """
    from codetool.decide.stage import answer_messages

    start = time.perf_counter()
    outputs = policy.generate([answer_messages(it.query) for it in items], n=1, temperature=0.0,
                              max_new_tokens=max_new_tokens, seed=seed)
    share = (time.perf_counter() - start) / max(1, len(items))
    return [{"text": c.text.strip(), "tokens": c.prompt_tokens + c.completion_tokens, "seconds": share}
            for [c] in outputs]


def reuse_records(path: str, items: list[DecisionItem]) -> tuple[list[Decision], list[dict | None], dict[str, list[float]]]:
    """Decisions, direct answers and necessity scores of ``items`` from an earlier ``records.jsonl``
    (the scores of the methods every record carries).

    A record counts only when its item id and offered functions match. The first ``n`` items of a
    draw do not depend on ``n`` (same seed), so a smaller draw can reuse a bigger one's records
    while ``n_free <= n_tool`` (tool-free queries borrow the tool lists of the tool-needing ones).

    Raises:
        CodetoolError: the file is missing or lacks one of the items (a different draw).
    """
    from codetool.jsonl import read_jsonl

    if not Path(path).is_file():
        raise CodetoolError(f"reuse: {path} not found; point it at the records.jsonl of an earlier run.")
    by_id = {r.item_id: r for r in map(DecisionRecord.from_dict, (r for r in read_jsonl(path) if "id" in r))}
    missing = [it.item_id for it in items if it.item_id not in by_id
               or by_id[it.item_id].options != [NONE, *(n for n, _ in api_candidates(it.apis))]]
    if missing:
        raise CodetoolError(f"reuse: {path} has no record of {missing[:3]} ({len(missing)} in all) with the same "
                            f"functions offered; use the same groups, seed and free_queries as that run, and "
                            f"n_free <= n_tool or the same n_tool and n_free.")
    decisions, direct = [], []
    for it in items:
        r = by_id[it.item_id]
        cost = r.costs.decision
        decisions.append(Decision(r.choice, r.confidence, r.method, scores=dict(r.top),
                                  logprobs=r.logprobs or [], null_logprobs=r.null_logprobs or [], samples=r.samples or [],
                                  prompt_tokens=cost.tokens, seconds=cost.seconds, p_tool=r.p_tool))
        d = r.costs.direct
        direct.append(None if d is None else {"text": r.direct_answer, **d.to_dict()})
    records = [by_id[it.item_id] for it in items]
    methods = set.intersection(*(set(r.necessity) for r in records)) if records else set()
    return decisions, direct, {m: [r.necessity[m] for r in records] for m in sorted(methods)}


def run_routes(items: list[DecisionItem], decisions: list[Decision], search, policy, router: RouterConfig, *,
               tool_backend, tool_doc: str, out: Path) -> tuple[dict[str, Trajectory], dict[str, Trajectory]]:
    """Every item's fast path (items whose top option is a function, with fallback) and the
    always-search baseline on every item; writes ``trajectories_fast.jsonl`` and
    ``trajectories_search.jsonl`` into ``out``.

    Args:
        search (`Search`): the search both routes run; tool_backend: the backend the
            items' tools answer from; tool_doc (`str`): how the tools are shown in the prompt.

    Returns:
        The fast and the full search's trajectories, by item id.
    """
    from codetool.decide.router import route_and_solve
    from codetool.search.search import SearchTask
    from codetool.tools import ToolEnvironment

    def tasks(subset):
        return [SearchTask(query_id=it.item_id, query=it.query, benchmark="stabletoolbench" if it.needs_tool
                           else "tool_free", group=it.group, extra={"gold": it.gold},
                           env=ToolEnvironment(it.apis, tool_backend, render_style=tool_doc)) for it in subset]

    paths = {"fast": out / "trajectories_fast.jsonl", "search": out / "trajectories_search.jsonl"}
    for path in paths.values():
        path.unlink(missing_ok=True)
    # a probe decision's fast path is the steered no-tool step (t_probe 1 sends every query there)
    probe = bool(decisions) and decisions[0].method == "probe"
    pairs = [(it, d) for it, d in zip(items, decisions) if d.tool is not None or probe]
    logger.info("fast path on %d queries, then the full search on all %d", len(pairs), len(items))
    fast_cfg = replace(router, t_probe=1.0, prefill="soft") if probe else replace(router, t_tool=0.0)
    fast = route_and_solve(tasks([it for it, _ in pairs]), fast_cfg, search, policy,
                           decisions=[d for _, d in pairs], on_done=lambda t: append_jsonl(paths["fast"], t.to_dict()))
    full = search.run(tasks(items), on_done=lambda t: append_jsonl(paths["search"], t.to_dict()))
    return {t.query_id: t for t in fast}, {t.query_id: t for t in full}


def make_record(item: DecisionItem, d: Decision, direct: dict | None, fast: Trajectory | None,
                searched: Trajectory | None, router: RouterConfig, necessity: dict[str, float]) -> DecisionRecord:
    """One line of ``records.jsonl``: the label, the decision (its route under ``router``'s
    thresholds), each route's measured cost, and the P(tool necessary) of each compared method."""
    names = [n for n, _ in api_candidates(item.apis)]
    decision_cost = Cost(tokens=d.prompt_tokens + d.completion_tokens + d.scored_tokens, seconds=d.seconds)
    fast_cost = trajectory_cost(fast)
    if fast_cost is not None:  # the fast trajectory includes the decision it was given; keep the route alone
        fast_cost = Cost(tokens=fast_cost.tokens - decision_cost.tokens, seconds=max(0.0, fast_cost.seconds - d.seconds))
    return DecisionRecord(
        item_id=item.item_id, query=item.query, needs_tool=item.needs_tool, gold=item.gold, group=item.group,
        category=item.category, tools_from=item.tools_from, n_functions=len(names), options=[NONE, *names],
        choice=d.choice, confidence=d.confidence, method=d.method, logprobs=d.logprobs,
        null_logprobs=d.null_logprobs, samples=d.samples, top=sorted(d.scores.items(), key=lambda kv: -kv[1])[:5],
        route=route_for(d, router),
        costs=RouteCosts(decision=decision_cost,
                         direct=None if direct is None else Cost(tokens=direct["tokens"], seconds=direct["seconds"]),
                         fast=fast_cost, search=trajectory_cost(searched)),
        direct_answer=None if direct is None else direct["text"], answer=item.answer,
        answer_correct=None if direct is None or not item.answer else answer_matches(direct["text"], item.answer),
        fast_first_action=first_action(fast),
        fast_fallback=None if fast is None else (fast.routing or {}).get("fallback"),
        search_first_action=first_action(searched), benchmark=item.benchmark, p_tool=d.p_tool, necessity=necessity,
        search_tool_calls=None if searched is None else len(searched.executed_calls()),
        search_success=None if searched is None else grounded_success(
            searched.final_answer, searched.executed_calls(), [n for n, _ in api_candidates(item.apis)],
            query=item.query))


def prompt_baselines(items: list[DecisionItem], policy, *, modes: list[str], reasoning: list[str], step_format: str,
                     tool_doc: str, max_new_tokens: int, seed: int | None) -> list[dict]:
    """The prompt-only modes (:data:`codetool.decide.tradeoff.MODES`): one greedy first reply per
    query, mode and reasoning setting; returns :func:`codetool.decide.tradeoff.baseline_summary`."""
    from codetool.decide.tradeoff import baseline_summary, mode_messages, run_baselines
    from codetool.tools import ToolEnvironment

    envs = [ToolEnvironment(it.apis, None, render_style=tool_doc) for it in items]
    prompts = {(m, r): [mode_messages(it.query, env, m, r, step_format) for it, env in zip(items, envs)]
               for m in modes for r in reasoning}
    logger.info("prompt-only baselines: %d modes x %d queries", len(prompts), len(items))
    tokenizer = getattr(policy, "tokenizer", None)
    count = (lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])) if tokenizer is not None else None
    runs = run_baselines(policy, prompts, [[n for n, _ in api_candidates(it.apis)] for it in items],
                         max_new_tokens=max_new_tokens, seed=seed, count_tokens=count)
    return baseline_summary([int(it.needs_tool) for it in items], runs)
