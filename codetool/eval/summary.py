"""The one-screen summary at the top of a report: judge-free metrics per method and benchmark as
mean and spread over the seeds of a run, and what the PRM learned (issue 16).

Judge-free metrics (they need no judge, so they mean something even with a 135M policy):

- ``scep``: SCEP as the public CodeTool code counts it (every chosen step, re-run;
  :mod:`codetool.eval.metrics`);
- ``tool_calls``: calls of the query's listed tools per episode (chosen path);
- ``finish``: share of episodes that ended with ``finish``;
- ``grounded``: share of episodes that finished with a non-empty answer that uses what a successful
  call of a listed tool on the chosen path returned (``codetool.rewards.grounded_success``);

Episodes the machine could not run (``codetool.eval.metrics.not_executed_trajectory``) are left out
of every share.
- RestBench-TMDB only: ``correct_path`` (RestGPT's binary correct-path rate) and ``path_score``
  (the fractional share of the gold path matched in order, the kind CodeTool reported).

Seeds are told apart by the trajectory file name (``<slug>.seed<k>.jsonl``, as ``codetool pipeline``
writes them with several ``seeds``); a file without that suffix is one seed on its own. The spread
is half the range (max - min) / 2 for two seeds and the sample standard deviation for more.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from codetool.eval.metrics import not_executed_trajectory, run_metrics
from codetool.eval.restbench import path_metrics
from codetool.eval.runs import load_runs
from codetool.rewards import grounded_success

RESTBENCH = "restbench-tmdb"
METRICS = (("scep", "chosen-step SCEP %", True), ("tool_calls", "tool calls / episode", False),
           ("finish", "finish %", True), ("grounded", "grounded success %", True),
           ("correct_path", "TMDB correct path % (0/1)", True), ("path_score", "TMDB path score % (frac.)", True))
_SEED = re.compile(r"\.seed(\d+)$")


def seed_of(path: str | Path) -> str:
    """The seed tag of a trajectory file: ``"3"`` for ``x.seed3.jsonl``, else ``""``."""
    match = _SEED.search(Path(path).stem)
    return match.group(1) if match else ""


def listed_calls(t) -> list:
    """The calls of the query's listed tools on a trajectory's chosen path."""
    names = {a.get("name") for a in t.available_tools}
    return [c for c in t.executed_calls() if c.name in names]


def grounded(t) -> bool:
    """A grounded success (:func:`codetool.rewards.grounded_success`): finished with an answer that
    uses the result of a successful listed-tool call."""
    names = {a.get("name") for a in t.available_tools}
    return t.finish_type == "finish" and grounded_success(t.final_answer, listed_calls(t), names, query=t.query)


def judge_free(trajs: list) -> dict[str, float | None]:
    """The judge-free metrics of the module docstring over one method's trajectories on one benchmark."""
    trajs = [t for t in trajs if not not_executed_trajectory(t)]
    n = max(len(trajs), 1)
    out: dict[str, float | None] = {
        "scep": run_metrics(trajs).scep, "tool_calls": sum(len(listed_calls(t)) for t in trajs) / n,
        "finish": sum(t.finish_type == "finish" for t in trajs) / n, "grounded": sum(map(grounded, trajs)) / n,
        "correct_path": None, "path_score": None}
    if trajs and trajs[0].benchmark == RESTBENCH:
        path = path_metrics(trajs)
        if path.n:
            out["correct_path"], out["path_score"] = path.correct_path_rate, path.path_fraction_score
    return out


def spread(values: list[float]) -> float:
    """Half the range for two values, the sample standard deviation for more, 0 for one."""
    if len(values) < 2:
        return 0.0
    if len(values) == 2:
        return abs(values[0] - values[1]) / 2
    return float(np.std(values, ddof=1))


def seed_summary(paths: list[str], methods: list[str] | None = None) -> dict[str, Any]:
    """Judge-free metrics per method and benchmark over the seeds of ``paths`` (trajectory files).

    Returns:
        ``{"seeds": [...], "spread": "...", "methods": {method: {benchmark: {metric: {"mean", "spread",
        "values"}, "n": episodes per seed}}}}``; a metric that does not apply is ``None``.
    """
    per_seed: dict[str, dict[str, dict[str, list]]] = {}
    for path in paths:
        for run in load_runs([path]):
            method = run.method.split("@")[0]
            for t in run.trajectories:
                per_seed.setdefault(method, {}).setdefault(t.benchmark, {}).setdefault(seed_of(path), []).append(t)
    seeds = sorted({s for m in per_seed.values() for b in m.values() for s in b}, key=lambda s: (s == "", s))
    out: dict[str, Any] = {"seeds": seeds, "spread": "half the range over 2 seeds" if len(seeds) == 2 else
                           "sample std over seeds" if len(seeds) > 2 else "one seed: no spread", "methods": {}}
    for method in [m for m in (methods or list(per_seed)) if m in per_seed]:
        for bench, by_seed in per_seed[method].items():
            rows = [judge_free(trajs) for trajs in by_seed.values()]
            cell: dict[str, Any] = {"n": [len(t) for t in by_seed.values()]}
            for key, _, _ in METRICS:
                values = [v for r in rows if (v := r[key]) is not None]
                cell[key] = ({"mean": float(np.mean(values)), "spread": spread(values), "values": values}
                             if values else None)
            out["methods"].setdefault(method, {})[bench] = cell
    return out


def prm_section(path: str | Path, out_dir: str | Path) -> dict[str, Any] | None:
    """What the PRM learned, from the ``metrics.json`` of ``codetool eval-prm`` at ``path`` (``None``
    when there is none), with its ``calibration_plot`` beside it (relative to ``out_dir`` when it
    lies inside)."""
    if not path or not Path(path).is_file():
        return None
    out = json.loads(Path(path).read_text())
    plot, root = Path(path).with_name("calibration.png"), Path(out_dir).resolve()
    if plot.is_file():
        out["calibration_plot"] = (str(plot.resolve().relative_to(root)) if plot.resolve().is_relative_to(root)
                                   else str(plot))
    return out


def paired_section(paths: list[str], methods: list[str], labels: dict[str, list | None] | None = None,
                   runs: list | None = None, *, samples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Paired differences between methods (:mod:`codetool.eval.paired`), each method minus the
    baseline (``spot+latent``, CodeTool's method, when present; else the first), per benchmark, with
    a bootstrap over queries: the judged pass score (Solved 1 / Unsure 0.5 / Unsolved 0, mean over
    rounds; the judged runs, one seed) and grounded success (:func:`grounded`, the rule of every other
    success number; mean over the seeds in ``paths``). An episode the machine could not run is left
    out (no score, not a 0), and the bootstrap takes as many resamples as the first screen's."""
    from codetool.eval.paired import mean_over_seeds, paired_differences
    from codetool.judge.records import LABEL_SCORES

    if len(methods) < 2:
        return {}
    baseline = "spot+latent" if "spot+latent" in methods else methods[0]
    seeds: dict[str, dict[str, list[dict]]] = {}  # bench -> method -> per-query scores of each seed
    for path in paths:
        for run in load_runs([path]):
            by_bench: dict[str, dict] = {}
            for t in run.trajectories:
                if not not_executed_trajectory(t):
                    by_bench.setdefault(t.benchmark, {})[(t.group, t.query_id)] = float(grounded(t))
            for bench, scores in by_bench.items():
                seeds.setdefault(bench, {}).setdefault(run.method.split("@")[0], []).append(scores)
    out: dict[str, Any] = {"baseline": baseline, "samples": samples, "seed": seed, "grounded": {}, "pass": {}}
    for bench, per_method in seeds.items():
        scores = {m: mean_over_seeds(per_method[m]) for m in methods if m in per_method}
        if baseline in scores and len(scores) > 1:
            out["grounded"][bench] = [d.to_dict() for d in paired_differences(scores, baseline=baseline,
                                                                               samples=samples, seed=seed)]
    for run in runs or []:
        rows = (labels or {}).get(run.method)
        if not rows:
            continue
        for t, row in zip(run.trajectories, rows):
            known = [LABEL_SCORES[x] for x in row if x in LABEL_SCORES]
            if known:
                out["pass"].setdefault(t.benchmark, {}).setdefault(run.method, {})[(t.group, t.query_id)] = (
                    sum(known) / len(known))
    out["pass"] = {bench: [d.to_dict() for d in paired_differences(scores, baseline=baseline, samples=samples,
                                                                   seed=seed)]
                   for bench, scores in out["pass"].items() if baseline in scores and len(scores) > 1}
    return out


def paired_lines(paired: dict[str, Any]) -> list[str]:
    """Markdown lines of :func:`paired_section` (nothing when it is empty)."""
    parts = [(metric, bench, rows) for metric in ("pass", "grounded") for bench, rows in paired.get(metric, {}).items()]
    if not parts:
        return []
    lines = [f"## Paired differences between methods (minus {paired['baseline']})", "",
             f"Per query, each method's score minus {paired['baseline']}'s on the same query, averaged over the queries "
             f"both ran; 95% interval from {paired['samples']} resamples of queries (seed {paired['seed']}). Pass: "
             "the judged score (Solved 1, Unsure 0.5, Unsolved 0; the judged seed); grounded: grounded success, "
             "averaged over the seeds first.", "",
             "| score | benchmark | method | queries | difference (points) | 95% interval |", "|---|---|---|---:|---:|---|"]
    for metric, bench, rows in parts:
        for d in rows:
            if d["n"]:
                lines.append(f"| {metric} | {bench} | {d['a']} | {d['n']} | {100 * d['mean']:+.1f} | "
                             f"{100 * d['low']:+.1f} to {100 * d['high']:+.1f} |")
    return lines + [""]


def prm_lines(prm: dict[str, Any]) -> list[str]:
    """The report's "What the PRM learned" section from ``eval-prm``'s ``metrics.json``: pairwise
    accuracy over labelled sibling pairs, split by what decided them (the search asks the PRM only
    about pairs whose steps both ran), each with its n and interval, and best-of-k selection."""
    lines = ["## What the PRM learned (held-out trees)", ""]
    decided = prm.get("decided")
    if not decided:  # metrics.json written before issue 38: every positive x negative row combination
        acc = prm.get("pairwise_accuracy")
        lines += [f"Pairwise accuracy {100 * acc:.1f}% over {prm.get('pairs', 0)} positive x negative row combinations "
                  "of sibling groups (an older eval-prm: not labelled pairs, and not split by what decided them; "
                  "run `codetool eval-prm` again)." if acc is not None else
                  f"No held-out sibling pair ({prm.get('rows', 0)} held-out rows): pairwise accuracy not measured.", ""]
    else:
        lines += ["Pairwise accuracy on the labelled held-out sibling pairs (50% is chance), by what separates the two "
                  f"steps; 95% intervals from {prm.get('bootstrap_samples')} resamples of queries (seed "
                  f"{prm.get('bootstrap_seed')}). The search consults the PRM only between candidates with the same "
                  "on-the-spot reward: the pairs where both steps ran are what it decides; pairs decided by "
                  "executability are ranked by the on-the-spot reward already.", "",
                  "| pairs | n | queries | accuracy | 95% interval |", "|---|---:|---:|---:|---|"]
        names = {"all": "all labelled", "executability": "decided by executability", "both_ran": "both steps ran",
                 "both_failed": "both steps failed", "unknown": "not known (rows without ok)"}
        for kind, part in decided.items():
            ci = part.get("ci95")
            acc = "n/a" if part.get("accuracy") is None else f"{100 * part['accuracy']:.1f}%"
            interval = "n/a" if not ci else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}"
            if ci and part.get("queries", 2) < 2:  # a bootstrap over one query resamples it alone
                interval = "n/a (one query)"
            lines.append(f"| {names.get(kind, kind)} | {part['pairs']} | {part['queries']} | {acc} | {interval} |")
        lines.append("")
        best = prm.get("best_of_k") or {}
        if best.get("groups"):
            lines += [f"Best-of-k among runnable siblings ({best['groups']} groups with two or more steps that ran, "
                      f"{best['informative']} whose steps differ): the PRM's pick has latent reward "
                      f"{best['prm']:.3f}, a random pick {best['random']:.3f}, the best {best['oracle']:.3f}; the PRM "
                      f"picks a best step in {100 * best['prm_best']:.0f}% of the groups.", ""]
        else:
            lines += ["Best-of-k: no held-out sibling group has two steps that ran (nothing for the PRM to choose).", ""]
    lines += ["Calibration: " + ", ".join(
        f"{name} {prm[key]:.3f}" for key, name in (("ece", "ECE"), ("brier", "Brier"), ("accuracy", "accuracy@0.5"),
                                                   ("auc", "AUC")) if prm.get(key) is not None)
              + f" over {prm.get('rows', 0)} rows" + (f" ([reliability diagram]({prm['calibration_plot']}))"
                                                       if prm.get("calibration_plot") else "") + ".", ""]
    return lines


def _cell(value: dict | None, pct: bool, seeds: int) -> str:
    if value is None:
        return "–"
    scale, digits = (100, 1) if pct else (1, 2)
    text = f"{scale * value['mean']:.{digits}f}"
    return text + (f" ± {scale * value['spread']:.{digits}f}" if seeds > 1 else "")


def render_summary(report: dict[str, Any]) -> list[str]:
    """Markdown lines of the one-screen summary: the judge-free table and what the PRM learned
    (when ``report`` has them)."""
    lines: list[str] = []
    summary = report.get("summary")
    if summary and summary["methods"]:
        n_seeds = len(summary["seeds"])
        lines += ["## Summary: what each method did (judge-free)", "",
                  f"Mean ± spread over {n_seeds} seeds ({summary['spread']})." if n_seeds > 1 else
                  "One seed.", ""]
        benches = list(dict.fromkeys(b for m in summary["methods"].values() for b in m))
        keys = [(k, label, pct) for k, label, pct in METRICS
                if k not in ("correct_path", "path_score") or RESTBENCH in benches]
        header = ["method", "benchmark", "n"] + [label for _, label, _ in keys]
        lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for method, by_bench in summary["methods"].items():
            for bench, cell in by_bench.items():
                row = [method, bench, "/".join(str(x) for x in dict.fromkeys(cell["n"]))]
                row += [_cell(cell[k], pct, n_seeds) for k, _, pct in keys]
                lines.append("| " + " | ".join(row) + " |")
        lines += ["", "Chosen-step SCEP: as CodeTool's eval_SCEP.py counts it (every chosen step, re-run after "
                  "the earlier steps' code; a reply without a code block fails; see docs/FIDELITY.md). Tool calls: calls of the "
                  "query's listed tools on the chosen path. Grounded success: finished with a non-empty answer "
                  "after >= 1 successful listed-tool call. These need no judge.", ""]
    lines += paired_lines(report.get("paired") or {})  # the step plot is with the other plots (markdown.py)
    prm = report.get("prm")
    if prm:
        lines += prm_lines(prm)
    return lines
