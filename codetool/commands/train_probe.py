"""``codetool train-probe``: label queries by a run without tools, then fit When2Tool's probe.

    codetool train-probe --output runs/probe                       # the embedded model, weak local judge
    codetool train-probe --model Qwen/Qwen2.5-7B-Instruct --judge.model http://host:8000/v1 ...
    codetool train-probe --when2tool tasks_v1_train.json --when2tool_envs when2tool/envs --n_tool 0 ...

1. Draw the queries (:func:`codetool.decide.necessity.draw_items`): StableToolBench, RestBench-TMDB,
   ToolBench examples, our tool-free queries, When2Tool tasks when given.
2. Label each by its benchmark's rule (:mod:`codetool.decide.necessity`): StableToolBench,
   RestBench and ToolBench by a judge of the no-tool answer (``--label_benchmarks given``: tool-
   necessary by construction, no run); When2Tool tasks by a grounded check of the no-tool answer
   against their reference answer; our tool-free queries by construction (``--label_tool_free
   reference``: checked against their answers where they have one). ``labels.jsonl`` resumes.
3. Read the hidden states at the last token of each query's first-step policy prompt, every layer
   (or ``--layers``), split by query id (:func:`codetool.split.split_query_ids`), fit the probe
   (scikit-learn ``StandardScaler`` + ``LogisticRegression``) on the training part.
4. Report the held-out AUROC with a bootstrap 95% interval; write the probe (``probe.json`` +
   ``probe.safetensors``), ``labels.jsonl``, ``report.json`` and ``report.md`` into ``--output``.

``codetool eval-decision --router.probe OUTPUT`` then compares the probe with the verbalised and
log-prob confidences on the same held-out queries, and ``codetool run --router --router.method
probe --router.probe OUTPUT`` routes with it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from codetool.config import ConfigError, to_dict
from codetool.decide.config import TrainProbeConfig

__all__ = ["TrainProbeConfig", "train_probe_command"]

logger = logging.getLogger(__name__)


def _report_md(report: dict) -> str:
    h = report["heldout"]
    ci = h["auroc_ci95"]
    lines = ["# Tool-necessity probe (When2Tool)", "",
             f"Model `{report['model']}`, {len(report['layers'])} hidden states x {report['hidden_size']} "
             f"= {report['features']} features, C = {report['C']}; {report['counts']['train']} training and "
             f"{report['counts']['heldout']} held-out queries (split by query id).", "",
             f"**Held-out AUROC {h['auroc']:.3f}**" + (f" (95% bootstrap interval {ci[0]:.3f}-{ci[1]:.3f}, "
                                                     f"{report['bootstrap_samples']} resamples)" if ci else "")
             + f"; accuracy at p = 0.5: {h['accuracy_at_0_5']:.3f}; training AUROC {report['train_auroc']:.3f}."
             if h["auroc"] is not None else "Held-out AUROC: n/a (one class among the held-out labels).", "",
             "| benchmark | rule | queries | tool-necessary | held-out | held-out AUROC |", "|---|---|---|---|---|---|"]
    for name, row in report["by_benchmark"].items():
        auc = row["heldout_auroc"]
        lines.append(f"| {name} | {row['rule']} | {row['n']} | {row['needs_tool']} | {row['heldout']} | "
                     f"{'n/a' if auc is None else f'{auc:.3f}'} |")
    judge = report.get("judge")
    lines += ["", f"Judge: {judge['name']}" + (f" ({judge['note']})" if judge.get("note") else "") if judge
              else "Judge: none (no judge-rule labels).", "", f"Seconds: {report['seconds']}", ""]
    return "\n".join(lines)


def train_probe_command(cfg: TrainProbeConfig) -> int:
    """``codetool train-probe``; see the module docstring."""
    from rich.console import Console

    from codetool.assemble import make_judge, make_policy
    from codetool.decide.necessity import DRAW_KEYS, draw_items, label_items, rule_for
    from codetool.decide.probe import (
        auroc,
        auroc_interval,
        fit_probe,
        last_token_states,
        probe_messages,
        resolve_layers,
    )
    from codetool.split import split_query_ids
    from codetool.tools import ToolEnvironment

    start = time.perf_counter()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    items, skipped = draw_items(cfg)
    if not items:
        raise ConfigError("no queries drawn: raise n_tool, n_restbench, n_toolbench or n_free, or give --when2tool.")
    rules = {b: cfg.label_benchmarks for b in ("stabletoolbench", "restbench-tmdb", "toolbench")}
    rules["tool_free"] = cfg.label_tool_free
    policy = make_policy(cfg.model_spec)
    needs_judge = any(rule_for(it, rules) == "judge" for it in items)
    judge = make_judge(cfg.judge, cache_path=str(out / "judge_cache.jsonl")) if needs_judge else None
    logger.info("labelling %d queries by a run without tools", len(items))
    labels = label_items(items, policy, judge, out / "labels.jsonl", rules=rules,
                         max_new_tokens=cfg.answer_max_new_tokens)
    t_label = time.perf_counter() - start

    logger.info("reading hidden states of %d prompts", len(items))
    prompts = [probe_messages(it.query, ToolEnvironment(it.apis, None, render_style=cfg.tool_doc), cfg.step_format)
               for it in items]
    n_states = policy.model.config.num_hidden_layers + 1
    layers = resolve_layers(cfg.layers or "all", n_states)
    features = last_token_states(policy, prompts, layers)
    y = np.array([int(labels[it.item_id].needs_tool) for it in items])
    t_features = time.perf_counter() - start - t_label

    ids = [it.item_id for it in items]
    train_ids, held_ids = split_query_ids(ids, cfg.heldout_fraction, cfg.split_seed)
    tr = np.array([i in set(train_ids) for i in ids])
    draw = {k: getattr(cfg, k) for k in DRAW_KEYS}
    probe = fit_probe(features[tr], y[tr], C=cfg.C, seed=cfg.split_seed, layers=layers, n_states=n_states,
                      hidden_size=policy.model.config.hidden_size, model=cfg.model, step_format=cfg.step_format,
                      info={"draw": draw, "tool_doc": cfg.tool_doc,
                            "split": {"fraction": cfg.heldout_fraction, "seed": cfg.split_seed, "heldout": held_ids},
                            "rules": rules})
    p_held, y_held = probe.predict(features[~tr]), y[~tr]
    held_auc = auroc(p_held, y_held)
    ci = auroc_interval(p_held, y_held, samples=cfg.bootstrap_samples, seed=cfg.split_seed)
    by_benchmark = {}
    for name in sorted({it.benchmark for it in items}):
        mask = np.array([it.benchmark == name for it in items])
        rule = sorted({labels[it.item_id].rule for it, m in zip(items, mask) if m})
        auc = auroc(probe.predict(features[mask & ~tr]), y[mask & ~tr]) if (mask & ~tr).any() else float("nan")
        by_benchmark[name] = {"n": int(mask.sum()), "needs_tool": int(y[mask].sum()), "heldout": int((mask & ~tr).sum()),
                              "rule": "/".join(rule), "heldout_auroc": None if auc != auc else auc}
    heldout = {"auroc": None if held_auc != held_auc else held_auc, "auroc_ci95": list(ci) if ci else None,
               "accuracy_at_0_5": float(np.mean((p_held >= 0.5) == y_held)) if len(y_held) else None}
    probe.info["heldout"] = heldout
    probe.save(out)
    train_auc = auroc(probe.predict(features[tr]), y[tr])
    report = {"model": cfg.model, "layers": layers, "hidden_size": probe.hidden_size, "features": int(features.shape[1]),
              "C": cfg.C, "counts": {"queries": len(items), "train": int(tr.sum()), "heldout": int((~tr).sum()),
                                     "needs_tool": int(y.sum()), "skipped": skipped},
              "heldout": heldout, "train_auroc": train_auc, "by_benchmark": by_benchmark,
              "bootstrap_samples": cfg.bootstrap_samples, "judge": judge.describe() if judge else None,
              "seconds": {"labels": round(t_label, 1), "features": round(t_features, 1),
                          "total": round(time.perf_counter() - start, 1)},
              "config": to_dict(cfg)}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float), encoding="utf-8")
    (out / "report.md").write_text(_report_md(report), encoding="utf-8")
    shown = "n/a" if heldout["auroc"] is None else f"{heldout['auroc']:.3f}" + (
        f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
    Console().print(f"probe on {len(items)} queries ({int(y.sum())} tool-necessary): held-out AUROC {shown} on "
                    f"{int((~tr).sum())} queries; probe and report in {out}", markup=False, highlight=False)
    return 0
