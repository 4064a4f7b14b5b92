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
from codetool.decide.compare import (
    necessity_scores,
    necessity_section,
    probe_heldout,
    probe_prompts,
)
from codetool.decide.labelled import DecisionItem, build_items
from codetool.decide.metrics import answer_matches, first_action, trajectory_cost
from codetool.decide.records import Cost, DecisionRecord, RouteCosts
from codetool.decide.report import build_report, pct, plot_sweep, render_markdown
from codetool.decide.stage import NONE, Decision, RouterConfig, api_candidates, decide, route_for
from codetool.decide.tradeoff import plot_tradeoff
from codetool.executor import ExecutorConfig
from codetool.jsonl import append_jsonl, write_jsonl
from codetool.rewards import grounded_success
from codetool.search.config import SearchConfig
from codetool.search.records import Trajectory

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
    n_restbench: int = option(0, "RestBench-TMDB queries (CodeTool's 20 candidate APIs each)")
    n_toolbench: int = option(0, "ToolBench example queries")
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
    compare: list[str] = option(default_factory=lambda: ["probe", "agreement", "logprobs"],
                                help="methods whose P(tool necessary) is compared side by side (AUROC, trade-off): "
                                "probe (needs router.probe), agreement (verbalised), logprobs")
    heldout_only: bool = option(True, "with router.probe: score the probe's held-out queries (its draw and split, "
                                "labels from its labels.jsonl) instead of this command's draw")
    tradeoff_thresholds: list[float] = option(default_factory=lambda: [round(0.1 * k, 1) for k in range(1, 10)],
                                              help="thresholds of the accuracy-vs-tool-calls sweep (When2Tool: 0.1-0.9)")
    baselines: list[str] = option(default_factory=lambda: ["force", "default", "necessary", "sparse", "no_tool"],
                                  help="prompt-only modes run as baselines (empty: none)")
    baseline_reasoning: list[str] = option(default_factory=lambda: ["direct", "reason"],
                                           help="direct and/or reason (reason-then-act) for each baseline mode")
    baseline_max_new_tokens: int = option(32, "tokens of a baseline's first reply (enough for a sentence of reasoning and the code block's first line)")
    bootstrap_samples: int = option(1000, "resamples of queries for the AUROC intervals")
    router: RouterConfig = field(default_factory=RouterConfig)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(method="spot", latent="none", w_latent=0.0,
                                                                      max_steps=3, max_new_tokens=192))
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def __post_init__(self):
        if self.n_tool < 0 or self.n_free < 0 or self.n_tool + self.n_free == 0:
            raise ConfigError(f"need n_tool >= 0, n_free >= 0 and some queries, got {self.n_tool} and {self.n_free}.")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"thresholds must lie in [0, 1], got {self.thresholds}.")
        from codetool.decide.tradeoff import MODES, REASONING

        bad = [m for m in self.baselines if m not in MODES] + [r for r in self.baseline_reasoning if r not in REASONING]
        if bad:
            raise ConfigError(f"unknown baselines {bad}: modes are {list(MODES)}, reasoning {list(REASONING)}.")
        if any(m not in ("probe", "agreement", "logprobs") for m in self.compare):
            raise ConfigError(f"compare takes probe, agreement and logprobs, got {self.compare}.")
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


def _reuse(path: str, items: list[DecisionItem]) -> tuple[list[Decision], list[dict | None], dict[str, list[float]]]:
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
                                  logprobs=r.logprobs, null_logprobs=r.null_logprobs, samples=r.samples,
                                  prompt_tokens=cost.tokens, seconds=cost.seconds, p_tool=r.p_tool))
        d = r.costs.direct
        direct.append(None if d is None else {"text": r.direct_answer, **d.to_dict()})
    records = [by_id[it.item_id] for it in items]
    methods = set.intersection(*(set(r.necessity) for r in records)) if records else set()
    return decisions, direct, {m: [r.necessity[m] for r in records] for m in sorted(methods)}


def _run_search(cfg: DecisionEvalConfig, items: list[DecisionItem], decisions: list[Decision], policy,
                out: Path) -> tuple[dict[str, Trajectory], dict[str, Trajectory]]:
    """Every item's fast path (items whose top option is a function, with fallback) and the
    always-search baseline on every item; returns the trajectories by item id (and writes them)."""
    from codetool.assemble import executor_factory, make_search
    from codetool.config import config_hash
    from codetool.decide.router import route_and_solve
    from codetool.search.search import SearchTask
    from codetool.tools import ToolEnvironment, make_tool_backend

    backend = make_tool_backend(cfg.tools_backend)

    def tasks(subset):
        return [SearchTask(query_id=it.item_id, query=it.query, benchmark="stabletoolbench" if it.needs_tool
                           else "tool_free", group=it.group, extra={"gold": it.gold},
                           env=ToolEnvironment(it.apis, backend, render_style=cfg.tool_doc)) for it in subset]

    search = make_search(policy, cfg.search, executor_factory(cfg.executor), config_hash=config_hash(cfg.search))
    paths = {"fast": out / "trajectories_fast.jsonl", "search": out / "trajectories_search.jsonl"}
    for path in paths.values():
        path.unlink(missing_ok=True)
    # a probe decision's fast path is the steered no-tool step (t_probe 1 sends every query there)
    probe = bool(decisions) and decisions[0].method == "probe"
    pairs = [(it, d) for it, d in zip(items, decisions) if d.tool is not None or probe]
    logger.info("fast path on %d queries, then the full search on all %d", len(pairs), len(items))
    fast_cfg = replace(cfg.router, t_probe=1.0, prefill="soft") if probe else replace(cfg.router, t_tool=0.0)
    fast = route_and_solve(tasks([it for it, _ in pairs]), fast_cfg, search, policy,
                           decisions=[d for _, d in pairs], on_done=lambda t: append_jsonl(paths["fast"], t.to_dict()))
    full = search.run(tasks(items), on_done=lambda t: append_jsonl(paths["search"], t.to_dict()))
    return {t.query_id: t for t in fast}, {t.query_id: t for t in full}


def _record(item: DecisionItem, d: Decision, direct: dict | None, fast: Trajectory | None,
            searched: Trajectory | None, cfg: DecisionEvalConfig, necessity: dict[str, float]) -> DecisionRecord:
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
        search_first_action=first_action(searched), benchmark=item.benchmark, p_tool=d.p_tool, necessity=necessity,
        search_tool_calls=None if searched is None else len(searched.executed_calls()),
        search_success=None if searched is None else grounded_success(
            searched.final_answer, searched.executed_calls(), [n for n, _ in api_candidates(item.apis)]))


def _auc(summary: dict) -> str:
    ci = summary["auroc_ci95"]
    return "n/a" if summary["auroc"] is None else f"{summary['auroc']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _baselines(cfg: DecisionEvalConfig, items: list[DecisionItem], policy, tool_doc: str) -> list[dict]:
    """The prompt-only modes: one greedy first reply per query, mode and reasoning setting."""
    from codetool.decide.tradeoff import baseline_summary, mode_messages, run_baselines
    from codetool.tools import ToolEnvironment

    envs = [ToolEnvironment(it.apis, None, render_style=tool_doc) for it in items]
    prompts = {(m, r): [mode_messages(it.query, env, m, r, cfg.search.step_format) for it, env in zip(items, envs)]
               for m in cfg.baselines for r in cfg.baseline_reasoning}
    logger.info("prompt-only baselines: %d modes x %d queries", len(prompts), len(items))
    tokenizer = getattr(policy, "tokenizer", None)
    count = (lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])) if tokenizer is not None else None
    runs = run_baselines(policy, prompts, [[n for n, _ in api_candidates(it.apis)] for it in items],
                         max_new_tokens=cfg.baseline_max_new_tokens, seed=cfg.router.seed, count_tokens=count)
    return baseline_summary([int(it.needs_tool) for it in items], runs)


def eval_decision_command(cfg: DecisionEvalConfig) -> int:
    """``codetool eval-decision``: decide on the labelled set, optionally run the routes, report."""
    from rich.console import Console

    from codetool.assemble import make_policy
    from codetool.models.spec import ModelSpec
    from codetool.secrets import redact_obj

    start = time.perf_counter()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    probe, labels_from = None, "by construction (StableToolBench needs a tool, tool-free queries do not)"
    if cfg.router.probe:
        from codetool.decide.probe import Probe

        probe = Probe.load(cfg.router.probe)
    if probe is not None and cfg.heldout_only:
        items, skipped = probe_heldout(probe, cfg.router.probe)
        labels_from = f"the no-tool run of codetool train-probe ({cfg.router.probe}/labels.jsonl: " + ", ".join(
            f"{b} {r}" for b, r in sorted(probe.info.get("rules", {}).items())) + ")"
        logger.info("scoring the probe's %d held-out queries (its draw; eval-decision's n_* settings are not used)",
                    len(items))
    else:
        items, skipped = build_items(cfg)
    policy = make_policy(ModelSpec.parse(cfg.model, dtype=cfg.dtype, device=cfg.device))
    decider = make_policy(ModelSpec.parse(cfg.decider, dtype=cfg.dtype, device=cfg.device)) if cfg.decider else policy
    probe_backend = make_policy(ModelSpec.parse(cfg.router.probe_model, dtype=cfg.dtype, device=cfg.device)
                                ) if cfg.router.probe_model else decider
    step_format, tool_doc = cfg.search.step_format, (probe.info.get("tool_doc", cfg.tool_doc) if probe else cfg.tool_doc)
    logger.info("deciding on %d queries (%d tool-needing, %d tool-free)", len(items),
                sum(i.needs_tool for i in items), sum(not i.needs_tool for i in items))
    recorded = None
    if cfg.reuse:
        decisions, direct, recorded = _reuse(cfg.reuse, items)
    else:
        if cfg.router.method == "probe":
            from codetool.decide.probe import probe_decisions

            decisions = probe_decisions(probe_backend, probe_prompts(items, tool_doc, step_format), probe, cfg.router)
        else:
            decisions = decide(decider, [(it.query, api_candidates(it.apis)) for it in items], cfg.router)
        direct = _direct_answers(policy, items, cfg) if cfg.answer_direct else [None] * len(items)
    if recorded is not None:  # reuse: the recorded scores, and no baselines (nothing may call the model)
        scores, baselines = recorded, None
    else:
        logger.info("tool necessity under %s", ", ".join(cfg.compare) or "no other method")
        scores = necessity_scores(cfg.compare, items, decider, cfg.router, primary=decisions, probe=probe,
                                  probe_backend=probe_backend, tool_doc=tool_doc, step_format=step_format)
        baselines = _baselines(cfg, items, policy, tool_doc) if cfg.baselines and cfg.baseline_reasoning else None
    fast, searched = _run_search(cfg, items, decisions, policy, out) if cfg.run_search else ({}, {})
    records = [_record(it, d, dr, fast.get(it.item_id), searched.get(it.item_id), cfg,
                       {m: v[i] for m, v in scores.items()})
               for i, (it, d, dr) in enumerate(zip(items, decisions, direct))]
    report = build_report(cfg, records, skipped, time.perf_counter() - start)
    report["necessity"] = necessity_section(records, cfg.tradeoff_thresholds, baselines, samples=cfg.bootstrap_samples,
                                            seed=cfg.seed, measured=cfg.run_search,
                                            heldout=probe is not None and cfg.heldout_only, labels_from=labels_from)
    report = redact_obj(report)
    write_jsonl(out / "records.jsonl", [r.to_dict() for r in records])
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    plot_sweep(report, out / "decision_sweep.png")
    if report["necessity"]:
        plot_tradeoff(report["necessity"], out / "decision_tradeoff.png")
        shown = "; ".join(f"{m} AUROC {_auc(v)}" for m, v in report["necessity"]["methods"].items())
        Console().print(f"tool necessity on {report['necessity']['n']} queries: {shown}", markup=False, highlight=False)
    d, at = report["decision"], report["at_threshold"]
    Console().print(f"decision ({report['method']}): accuracy {pct(d['decision_accuracy'])}%, tool-invocation "
                    f"{pct(d['tool_invocation_accuracy'])}%, hallucination {pct(d['hallucination_rate'])}%, "
                    f"unnecessary {pct(d['unnecessary_tool_rate'])}%; routes at the threshold {at['routes']}; "
                    f"report in {out}/report.md", markup=False, highlight=False)
    return 0
