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
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.decide.labelled import DecisionItem, build_items
from codetool.decide.metrics import answer_matches, first_action, trajectory_cost
from codetool.decide.records import Cost, DecisionRecord, RouteCosts
from codetool.decide.report import build_report, pct, plot_sweep, render_markdown
from codetool.decide.stage import NONE, Decision, RouterConfig, api_candidates, decide, route_for
from codetool.executor import ExecutorConfig
from codetool.jsonl import append_jsonl, write_jsonl
from codetool.search.records import Trajectory
from codetool.search.search import SearchConfig

logger = logging.getLogger(__name__)


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


def _direct_answers(policy, items: list[DecisionItem], cfg: DecisionEvalConfig) -> list[dict]:
    """A direct answer for every item in one batched call: text, tokens, seconds (an even share)."""
    from codetool.decide.stage import answer_messages

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
                                  logprobs=r.logprobs, null_logprobs=r.null_logprobs, samples=r.samples,
                                  prompt_tokens=cost.tokens, seconds=cost.seconds))
        d = r.costs.direct
        direct.append(None if d is None else {"text": r.direct_answer, **d.to_dict()})
    return decisions, direct


def _run_search(cfg: DecisionEvalConfig, items: list[DecisionItem], decisions: list[Decision], policy,
                out: Path) -> tuple[dict[str, Trajectory], dict[str, Trajectory]]:
    """Every item's fast path (items whose top option is a function, with fallback) and the
    always-search baseline on every item; returns the trajectories by item id (and writes them)."""
    from codetool.assemble import executor_factory
    from codetool.config import config_hash
    from codetool.decide.router import route_and_solve
    from codetool.search.search import SearchTask, StepwiseSearch
    from codetool.tools import ToolEnvironment, make_tool_backend

    backend = make_tool_backend(cfg.tools_backend)

    def tasks(subset):
        return [SearchTask(query_id=it.item_id, query=it.query, benchmark="stabletoolbench" if it.needs_tool
                           else "tool_free", group=it.group, extra={"gold": it.gold},
                           env=ToolEnvironment(it.apis, backend, render_style=cfg.tool_doc)) for it in subset]

    search = StepwiseSearch(policy, cfg.search, executor_factory(cfg.executor), config_hash=config_hash(cfg.search))
    paths = {"fast": out / "trajectories_fast.jsonl", "search": out / "trajectories_search.jsonl"}
    for path in paths.values():
        path.unlink(missing_ok=True)
    pairs = [(it, d) for it, d in zip(items, decisions) if d.tool is not None]
    logger.info("fast path on %d queries, then the full search on all %d", len(pairs), len(items))
    fast = route_and_solve(tasks([it for it, _ in pairs]), replace(cfg.router, t_tool=0.0), search, policy,
                           decisions=[d for _, d in pairs], on_done=lambda t: append_jsonl(paths["fast"], t.to_dict()))
    full = search.run(tasks(items), on_done=lambda t: append_jsonl(paths["search"], t.to_dict()))
    return {t.query_id: t for t in fast}, {t.query_id: t for t in full}


def _record(item: DecisionItem, d: Decision, direct: dict | None, fast: Trajectory | None,
            searched: Trajectory | None, cfg: DecisionEvalConfig) -> DecisionRecord:
    """One line of ``records.jsonl``: the label, the decision, each route's measured cost."""
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
        route=route_for(d, cfg.router),
        costs=RouteCosts(decision=decision_cost,
                         direct=None if direct is None else Cost(tokens=direct["tokens"], seconds=direct["seconds"]),
                         fast=fast_cost, search=trajectory_cost(searched)),
        direct_answer=None if direct is None else direct["text"], answer=item.answer,
        answer_correct=None if direct is None or not item.answer else answer_matches(direct["text"], item.answer),
        fast_first_action=first_action(fast),
        fast_fallback=None if fast is None else (fast.routing or {}).get("fallback"),
        search_first_action=first_action(searched))


def eval_decision_command(cfg: DecisionEvalConfig) -> int:
    """``codetool eval-decision``: decide on the labelled set, optionally run the routes, report."""
    from rich.console import Console

    from codetool.assemble import make_policy
    from codetool.models.spec import ModelSpec
    from codetool.secrets import redact_obj

    start = time.perf_counter()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    items, skipped = build_items(cfg)
    policy = make_policy(ModelSpec.parse(cfg.model, dtype=cfg.dtype, device=cfg.device))
    decider = make_policy(ModelSpec.parse(cfg.decider, dtype=cfg.dtype, device=cfg.device)) if cfg.decider else policy
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
    write_jsonl(out / "records.jsonl", [r.to_dict() for r in records])
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    plot_sweep(report, out / "decision_sweep.png")
    d, at = report["decision"], report["at_threshold"]
    Console().print(f"decision ({report['method']}): accuracy {pct(d['decision_accuracy'])}%, tool-invocation "
                    f"{pct(d['tool_invocation_accuracy'])}%, hallucination {pct(d['hallucination_rate'])}%, "
                    f"unnecessary {pct(d['unnecessary_tool_rate'])}%; routes at the threshold {at['routes']}; "
                    f"report in {out}/report.md", markup=False, highlight=False)
    return 0
