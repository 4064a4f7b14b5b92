"""``codetool eval``: score trajectory files and write ``report.json``, ``report.md`` and PNG plots.

The inputs (runs of ``codetool run`` or StableToolBench converted answers) are read into one run
per method (:mod:`codetool.eval.runs`); with a judge every trajectory gets its pass-rate verdicts
over ``judge.rounds`` rounds; each benchmark's section comes from its module
(:func:`codetool.eval.stabletoolbench.evaluate`: judge-free metrics and SoPR;
:func:`codetool.eval.restbench.evaluate`: the same with the path metrics, SoPR being RestBench's
success rate); with a reference, the win rates (SoWR, :func:`codetool.eval.preference.win_rates`).

Outputs in ``out``: ``report.json`` (every number), ``report.md`` (a weak local judge is
flagged), ``verdicts.jsonl``, ``judge_cache.jsonl`` (reruns are free) and the plots; every text
passes through ``codetool.secrets.redact``. A judge request that fails after its retries is an
error record (Unsolved, in ``verdicts.jsonl`` and ``judge_errors``), not cached, and the exit
status is 1; the same command run again asks only the failed requests.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.assemble import make_judge
from codetool.commands import progress_bar
from codetool.config import config_hash, to_dict
from codetool.eval import restbench, stabletoolbench
from codetool.eval.comparability import comparability_block
from codetool.eval.config import EvalConfig
from codetool.eval.convert import export_converted
from codetool.eval.headline import headline, prm_line, verdict
from codetool.eval.markdown import render_markdown, write_plots
from codetool.eval.preference import win_rates
from codetool.eval.runs import open_runs, run_warnings
from codetool.eval.summary import paired_section, prm_section, seed_summary
from codetool.jobs import client_rows
from codetool.jsonl import write_jsonl
from codetool.judge.records import Judge, JudgeMixin
from codetool.secrets import redact, redact_obj

__all__ = ["EvalConfig", "eval_command", "run_eval"]

logger = logging.getLogger(__name__)

RESTBENCH = restbench.BENCHMARK


def run_eval(cfg: EvalConfig, judge: Judge | None = None) -> dict[str, Any]:
    """Compute the report of ``cfg`` with ``judge`` (``None``: judge-free metrics only) and write
    its files into ``cfg.out``; returns the report (as written to ``report.json``)."""
    out_dir = Path(cfg.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CodetoolError(f"--out {out_dir} is a file; pass a folder for report.json, report.md and the plots "
                            "(e.g. --out runs/eval).")
    out_dir.mkdir(parents=True, exist_ok=True)
    shown, reference = open_runs(cfg.trajectories, cfg.compare, cfg.reference)
    rounds = cfg.judge.rounds
    assert rounds is not None  # JudgeConfig.__post_init__ resolves it from the protocol
    gold = restbench.load_gold_paths(cfg.restbench_gold) if cfg.restbench_gold else None
    report: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": to_dict(cfg), "config_hash": config_hash(cfg, ignore=("out",)),
        "judge": judge.describe() if judge else {"name": "none", "kind": "none", "weak": False,
                                                 "note": "no judge: pass and win rates are not computed"},
        "rounds": rounds, "inputs": [], "methods": [r.method for r in shown],
        "reference": reference.method if reference else None,
        "benchmarks": {}, "win_rates": {}, "warnings": [], "files": {},
    }
    judged = shown + ([reference] if reference is not None and not any(reference is r for r in shown) else [])
    report["inputs"] = [{"method": r.method, "source": r.source, "trajectories": len(r.trajectories)} for r in judged]
    labels, verdict_rows, parse_failures = stabletoolbench.judge_runs(
        judged, judge, rounds, max_trajectory_chars=cfg.judge.max_trajectory_chars, protocol=cfg.judge.protocol,
        blank_finish=cfg.judge.blank_finish)
    filters = getattr(getattr(judge, "reference", None), "filtered", None) if cfg.judge.protocol == "codetool" else None
    benches = list(dict.fromkeys(t.benchmark for r in shown for t in r.trajectories))
    sections = {**stabletoolbench.evaluate(shown, labels, rounds, [b for b in benches if b != RESTBENCH],
                                           filters=filters),
                **restbench.evaluate(shown, labels, rounds, gold=gold, filters=filters)}
    report["benchmarks"] = {b: sections[b] for b in benches}
    for method, data in sections.get(RESTBENCH, {"methods": {}})["methods"].items():
        report["warnings"] += restbench.path_warnings(method, data["overall"].get("path"))
    if reference is not None and judge is None:
        report["warnings"].append("win rates (SoWR) need a judge; none was configured.")
    elif reference is not None and judge is not None:
        report["win_rates"] = win_rates(shown, reference, judge, rounds, skip=[RESTBENCH], seed=cfg.judge.seed,
                                        max_details_chars=cfg.judge.max_trajectory_chars,
                                        blank_finish=cfg.judge.blank_finish)
    report["judge_errors"] = getattr(judge, "errors", 0) if judge else 0
    report["warnings"] += run_warnings(shown, parse_failures, report["judge_errors"])
    report["comparability"] = comparability_block(report, cfg.judge, shown, reference,
                                                  judge.describe() if judge else None, cfg.run_settings)
    seed_paths = [p for p in [*cfg.trajectories, *cfg.seed_runs] if p.endswith(".jsonl")]
    report["summary"] = seed_summary(seed_paths, methods=report["methods"])
    report["paired"] = paired_section(seed_paths, report["methods"], labels, shown, seed=cfg.judge.seed)
    report["headline"] = headline(shown, labels, seed_paths)
    if (prm := prm_section(cfg.prm_metrics, out_dir)) is not None:
        report["prm"] = prm
    write_jsonl(out_dir / "verdicts.jsonl", verdict_rows)
    if cfg.plots:
        report["files"]["plots"] = [str(p) for p in write_plots(report, shown, out_dir)]
    if cfg.export_stabletoolbench:
        report["files"]["stabletoolbench_export"] = [
            str(p) for r in shown for p in export_converted(
                [t for t in r.trajectories if t.benchmark != RESTBENCH], cfg.export_stabletoolbench, r.method)]
    report = redact_obj(report)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    (out_dir / "report.md").write_text(redact(render_markdown(report)))
    logger.info("wrote %s and %s", out_dir / "report.json", out_dir / "report.md")
    return report


def summary_tables(report: dict[str, Any]) -> list:
    """The console summary: one ``rich`` table per benchmark, a row per metric and a column per
    method, so that it fits 80 columns without cutting its headers."""
    from rich.table import Table

    weak = " (weak judge: smoke test only)" if report["judge"]["weak"] else ""
    tables = []
    for bench, entry in report["benchmarks"].items():
        table = Table(title=f"{bench}, judge {report['judge']['name']}{weak}", title_justify="left")
        table.add_column("metric", no_wrap=True)
        methods = entry["methods"]
        for method in methods:
            table.add_column(method, justify="right", overflow="fold")
        rows: dict[str, list[str]] = {}
        for data in methods.values():
            s, m = data["overall"], data["overall"]["metrics"]
            pr, path = s["pass_rate"], s.get("path") or {}
            cells = {"queries": str(s["n"]),
                     "success %" if bench == RESTBENCH else "SoPR %": (f"{100 * pr['mean']:.1f} ± {100 * pr['std']:.1f}"
                                                                       if pr else "n/a")}
            if bench == RESTBENCH:
                for label, key in (("correct path % (0/1)", "correct_path_rate"),
                                   ("gold calls % (pooled)", "path_pooled_rate"),
                                   ("path score % (frac.)", "path_fraction_score")):
                    cells[label] = f"{100 * path[key]:.1f}" if path.get("n") else "n/a"
            cells.update({"SCEP %": f"{100 * m['scep']:.1f}" if m["scep"] is not None else "n/a",
                          "steps": f"{m['mean_steps']:.2f}", "episode wall s": f"{m['mean_seconds']:.1f}"})
            for label, value in cells.items():
                rows.setdefault(label, []).append(value)
        for label, values in rows.items():
            table.add_row(label, *values)
        tables.append(table)
    return tables


def eval_command(cfg: EvalConfig) -> int:
    """``codetool eval``: write the report and print a one-screen summary of it."""
    from rich.console import Console

    judge = make_judge(cfg.judge, cache_path=str(Path(cfg.out) / "judge_cache.jsonl"))
    with progress_bar(f"judge {redact(judge.name)}" if judge else "eval") as progress:
        if isinstance(judge, JudgeMixin):  # our judges tick it per batch
            judge.progress = progress
        report = run_eval(cfg, judge)
    console = Console()
    for table in summary_tables(report):
        console.print(table)
    for c in (report.get("headline") or {}).get("comparisons", []):
        console.print(f"{c['benchmark']}: {c['a']} - {c['b']}, {c['metric']} ({c['kind']}): {c['mean']:+.1f} points "
                      + (f"(95% interval {c['low']:+.1f} to {c['high']:+.1f}, " if c["n"] >= 2 else "(no interval, ")
                      + f"{c['n']} queries): {verdict(c)}",
                      markup=False, highlight=False)
    if (line := prm_line(report)):
        console.print(line.replace("**", ""), markup=False, highlight=False)
    backend = getattr(judge, "_backend", None) if judge is not None and not getattr(judge, "_lazy", True) else None
    if callable(getattr(backend, "stats", None)):  # a judge server: its requests and the faults retried
        for key, value in client_rows({"judge": backend}):
            console.print(f"{key.strip()}: {value}", markup=False, highlight=False)
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    block = report["comparability"]
    console.print(f"comparability with {block['target_name']}: "
                  + (f"{len(block['deviations'])} differences" if block["deviations"] else
                     f"no setting deviates ({block['settings_checked']} checked)")
                  + f"; {len(block.get('known_differences', []))} known differences, "
                    f"{len(block.get('unchecked', []))} things not checked (report.md)", markup=False, highlight=False)
    for deviation in block["deviations"]:
        console.print(f"not comparable: {deviation}", markup=False, highlight=False)
    console.print(f"report: {Path(cfg.out) / 'report.md'}, report.json, {len(report['files'].get('plots', []))} plots",
                  markup=False, highlight=False)
    return 1 if report["judge_errors"] else 0
