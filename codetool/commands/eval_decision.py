"""``codetool eval-decision``: benchmark the decide-first stage with When2Tool-style metrics.

Draws the labelled set (:func:`codetool.decide.labelled.build_items`, or a probe's held-out
queries), decides on every query, answers directly, scores tool necessity under each compared
method and runs the prompt-only baselines, optionally runs the fast path and the always-search
baseline, then writes the report (:mod:`codetool.decide.report`). The steps and the metrics are
described in :mod:`codetool.decide.benchmark`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from codetool.config import to_dict
from codetool.decide.benchmark import (
    direct_answers,
    make_record,
    prompt_baselines,
    reuse_records,
    run_routes,
)
from codetool.decide.compare import (
    necessity_scores,
    necessity_section,
    probe_heldout,
    probe_prompts,
)
from codetool.decide.config import DecisionEvalConfig
from codetool.decide.labelled import build_items
from codetool.decide.report import build_report, pct, write_report
from codetool.decide.stage import api_candidates, decide

__all__ = ["DecisionEvalConfig", "eval_decision_command"]

logger = logging.getLogger(__name__)


def _auc(summary: dict) -> str:
    ci = summary["auroc_ci95"]
    return "n/a" if summary["auroc"] is None else f"{summary['auroc']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def eval_decision_command(cfg: DecisionEvalConfig) -> int:
    """``codetool eval-decision``: decide on the labelled set, optionally run the routes, report."""
    from rich.console import Console

    from codetool.assemble import executor_factory, make_policy, make_search, tool_backend_options
    from codetool.config import config_hash
    from codetool.secrets import redact_obj
    from codetool.tools import make_tool_backend

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
        items, skipped = build_items(cfg.groups, cfg.n_tool, cfg.n_free, seed=cfg.seed, data=cfg.data,
                                     free_queries=cfg.free_queries, n_restbench=cfg.n_restbench,
                                     n_toolbench=cfg.n_toolbench)
    policy = make_policy(cfg.model_spec)
    decider = make_policy(cfg.decider_spec) if cfg.decider_spec else policy
    probe_backend = make_policy(cfg.probe_spec) if cfg.probe_spec else decider
    step_format, tool_doc = cfg.search.step_format, (probe.info.get("tool_doc", cfg.tool_doc) if probe else cfg.tool_doc)
    logger.info("deciding on %d queries (%d tool-needing, %d tool-free)", len(items),
                sum(i.needs_tool for i in items), sum(not i.needs_tool for i in items))
    if cfg.reuse:  # the recorded decisions, answers and scores, and no baselines (nothing may call the model)
        decisions, direct, scores = reuse_records(cfg.reuse, items)
        baselines = None
    else:
        if cfg.router.method == "probe":
            from codetool.decide.probe import probe_decisions

            assert probe is not None  # loaded above for method probe
            decisions = probe_decisions(probe_backend, probe_prompts(items, tool_doc, step_format), probe, cfg.router)
        else:
            decisions = decide(decider, [(it.query, api_candidates(it.apis)) for it in items], cfg.router)
        direct = ([*direct_answers(policy, items, max_new_tokens=cfg.router.answer_max_new_tokens, seed=cfg.router.seed)]
                  if cfg.answer_direct else [None] * len(items))
        logger.info("tool necessity under %s", ", ".join(cfg.compare) or "no other method")
        scores = necessity_scores(cfg.compare, items, decider, cfg.router, primary=decisions, probe=probe,
                                  probe_backend=probe_backend, tool_doc=tool_doc, step_format=step_format)
        baselines = prompt_baselines(items, policy, modes=cfg.baselines, reasoning=cfg.baseline_reasoning,
                                     step_format=step_format, tool_doc=tool_doc, max_new_tokens=cfg.baseline_max_new_tokens,
                                     seed=cfg.router.seed) if cfg.baselines and cfg.baseline_reasoning else None
    fast: dict = {}
    searched: dict = {}
    if cfg.run_search:
        search = make_search(policy, cfg.search, executor_factory(cfg.executor), config_hash=config_hash(cfg.search))
        fast, searched = run_routes(items, decisions, search, policy, cfg.router, out=out, tool_doc=cfg.tool_doc,
                                    tool_backend=make_tool_backend(cfg.tools_backend, **tool_backend_options(
                                        cfg.tools_backend, cfg.tool_server_url, cfg.tool_cache_dir)))
    records = [make_record(it, d, dr, fast.get(it.item_id), searched.get(it.item_id), cfg.router,
                           {m: v[i] for m, v in scores.items()})
               for i, (it, d, dr) in enumerate(zip(items, decisions, direct))]
    report = build_report(records, skipped, time.perf_counter() - start, router=cfg.router, model=cfg.model,
                          decider=cfg.decider, thresholds=cfg.thresholds, run_search=cfg.run_search, config=to_dict(cfg))
    report["necessity"] = necessity_section(records, cfg.tradeoff_thresholds, baselines, samples=cfg.bootstrap_samples,
                                            seed=cfg.seed, measured=cfg.run_search,
                                            heldout=probe is not None and cfg.heldout_only, labels_from=labels_from)
    report = redact_obj(report)
    write_report(out, report, records)
    if report["necessity"]:
        shown = "; ".join(f"{m} AUROC {_auc(v)}" for m, v in report["necessity"]["methods"].items())
        Console().print(f"tool necessity on {report['necessity']['n']} queries: {shown}", markup=False, highlight=False)
    d, at = report["decision"], report["at_threshold"]
    Console().print(f"decision ({report['method']}): accuracy {pct(d['decision_accuracy'])}%, tool-invocation "
                    f"{pct(d['tool_invocation_accuracy'])}%, hallucination {pct(d['hallucination_rate'])}%, "
                    f"unnecessary {pct(d['unnecessary_tool_rate'])}%; routes at the threshold {at['routes']}; "
                    f"report in {out}/report.md", markup=False, highlight=False)
    return 0
