"""``codetool eval``: score trajectory files and write ``report.json``, ``report.md`` and PNG plots.

Inputs are trajectory files of ``codetool run`` (JSONL, one :class:`Trajectory` per line) or
StableToolBench converted answers (``<method>/<group>.json`` or the ``<method>/`` folder), so the
same command scores our runs and theirs. Trajectories are grouped by method (the record's
``method``, else the file name), then by benchmark and group. For each it computes the judge-free
metrics (:mod:`codetool.eval.metrics`), RestBench path metrics (:mod:`codetool.eval.restbench`)
and, with a judge, the pass rate (SoPR; RestBench calls it success rate) over ``judge.rounds``
rounds, and the win rate (SoWR) of every compared method against the reference.

Outputs in ``out``: ``report.json`` (every number), ``report.md`` (a table per benchmark and
group, the configuration and the judge named; a weak local judge is flagged), ``verdicts.jsonl``
(each query's labels and reasons), ``judge_cache.jsonl`` (reruns are free), and the plots
``bars_<benchmark>.png``, ``steps.png``, ``rewards.png``. Every text written passes through
``codetool.secrets.redact``. ``--compare A B ...`` (methods or files) puts methods side by side
in that order; the first is the win-rate reference unless ``--reference`` names another.

A judge request that fails after its retries ends neither the evaluation nor its report: that
verdict is an error record (Unsolved, its ``errors`` in ``verdicts.jsonl``, counted in
``report.json``'s ``judge_errors`` and warned about), it is not cached, and the exit status is 1;
the same command run again asks only the failed requests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.assemble import make_judge
from codetool.config import ConfigError, config_hash, option, to_dict
from codetool.eval import metrics as run_metrics_mod
from codetool.eval.comparability import comparability_block, recipe_settings
from codetool.eval.convert import export_converted, import_converted
from codetool.eval.preference import compare_runs
from codetool.eval.restbench import load_gold_paths, path_metrics
from codetool.eval.stabletoolbench import (
    average_pass_rate,
    codetool_pass_rate,
    judge_pass,
    majority_label,
    pass_rate,
)
from codetool.jsonl import read_jsonl, write_jsonl
from codetool.judge.config import JudgeConfig
from codetool.judge.records import Judge
from codetool.search.records import Trajectory
from codetool.secrets import redact, redact_obj

logger = logging.getLogger(__name__)

RESTBENCH = "restbench-tmdb"


@dataclass
class EvalConfig:
    """Settings of ``codetool eval``."""

    recipe_sections = {"recipe": ("judge",)}  # see codetool.config.load_config

    trajectories: list[str] = option(default_factory=list, positional=True,
                                     help="trajectory files (.jsonl) or StableToolBench converted answers "
                                          "(<method>/<group>.json or the <method>/ folder)")
    compare: list[str] = option(default_factory=list,
                                help="methods or files to put side by side, in this order (comma-separated, "
                                     "or --compare A B C); the first is the win-rate reference")
    reference: str = option("", "method (or file) the others are compared with for the win rate (SoWR)")
    out: str = option("data/eval", "output folder: report.json, report.md, plots, verdicts, judge cache",
                      aliases=("--output",))
    judge: JudgeConfig = option(default_factory=JudgeConfig, help="the judge of pass and win rates")
    restbench_gold: str = option("", "RestGPT datasets/tmdb.json: gold paths for trajectories that lack "
                                 "extra.gold_path")
    export_stabletoolbench: str = option("", "also write the runs in StableToolBench's converted-answer "
                                         "layout into this folder (<method>/<group>.json)")
    plots: bool = option(True, "write the PNG plots")
    seed_runs: list[str] = option(default_factory=list,
                                  help="trajectory files of the same methods with other seeds (<slug>.seed<k>.jsonl): "
                                       "the summary's judge-free metrics are mean ± spread over them and the inputs")
    prm_metrics: str = option("", "metrics.json of `codetool eval-prm` on held-out trees: shown under "
                              "'what the PRM learned'")
    recipe: str = option("", "the pipeline recipe the trajectories were made with (e.g. "
                         "configs/pipeline/paper-qwen2.5-7b.yaml): its run settings (trees, search, answer, prm) are "
                         "checked in the comparability block, and its judge section is the base of the judge "
                         "settings (--config and --judge.* override it)")
    run_settings: dict[str, Any] = option(default_factory=dict,
                                          help="the run's settings as dotted keys for the comparability block "
                                               "(the pipeline passes its own; --recipe fills them)")

    def __post_init__(self):
        if not self.trajectories and not self.compare:
            raise ConfigError("no trajectory files given: pass one or more .jsonl files of `codetool run` "
                              "(or StableToolBench converted answers), e.g. codetool eval runs/demo.jsonl.")
        if self.recipe:
            self.run_settings = {**recipe_settings(self.recipe), **self.run_settings}


@dataclass
class Run:
    """The trajectories of one method, from one input."""

    method: str
    source: str
    trajectories: list[Trajectory]


def load_runs(paths: Sequence[str]) -> list[Run]:
    """One :class:`Run` per method. Inputs of the same method join into one run when their
    queries differ (one file per benchmark); when they hold the same query, the later input's run
    is named ``<method>@<file stem>``. A query repeated in a file (a resumed run) keeps its last record.

    Raises:
        CodetoolError: a missing input or an unreadable converted-answer file.
    """
    runs: list[Run] = []
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if str(path.resolve()) in seen:  # the same file named twice (e.g. also in --compare)
            continue
        seen.add(str(path.resolve()))
        if path.suffix == ".jsonl":
            if not path.is_file():
                raise ConfigError(f"trajectory file not found: {path}.")
            try:
                trajs = [Trajectory.from_dict(r) for r in read_jsonl(path)]
            except (KeyError, TypeError, ValueError) as e:  # e.g. a PRM dataset passed by mistake
                raise ConfigError(f"{path}: not a trajectory file of 'codetool run' ({type(e).__name__}: "
                                  f"{str(e)[:100]}).") from None
        else:
            trajs = import_converted(path)
        by_method: dict[str, dict[tuple, Trajectory]] = {}
        for traj in trajs:
            name = traj.method or path.stem
            by_method.setdefault(name, {})[(traj.benchmark, traj.group, traj.query_id)] = traj
        for name, kept in by_method.items():
            same = next((r for r in runs if r.method == name), None)
            if same is not None and not ({(t.benchmark, t.group, t.query_id) for t in same.trajectories} & set(kept)):
                same.source = f"{same.source}, {path}"
                same.trajectories.extend(kept.values())
                continue
            if same is not None:
                name = f"{name}@{path.stem}"
            runs.append(Run(name, str(path), list(kept.values())))
    return runs


def _pick(runs: list[Run], key: str) -> Run:
    for run in runs:
        if key in (run.method, run.source) or Path(key).resolve() == Path(run.source).resolve():
            return run
    raise ConfigError(f"'{key}' names no loaded method or file; methods: {', '.join(r.method for r in runs)}.")


def _summary(bench: str, trajs: list[Trajectory], labels: list[list[str]] | None, rounds: int,
             gold: dict | None) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(trajs),
                           "metrics": dataclasses.asdict(run_metrics_mod.run_metrics(trajs))}
    out["pass_rate"] = dataclasses.asdict(pass_rate(labels, rounds)) if labels is not None else None
    if labels is not None:  # split by where the final answer came from (finish / generated / none)
        sources: dict[str, list[int]] = {}
        for i, traj in enumerate(trajs):
            sources.setdefault(run_metrics_mod.answer_source(traj), []).append(i)
        out["pass_rate_by_answer_source"] = {src: dataclasses.asdict(pass_rate([labels[i] for i in idx], rounds))
                                             for src, idx in sorted(sources.items())}
    if bench == RESTBENCH:
        solved = [majority_label(x) == "Solved" for x in labels] if labels is not None else None
        out["path"] = dataclasses.asdict(path_metrics(trajs, solved, fallback=gold))
        trim = dataclasses.asdict(path_metrics(trajs, solved, fallback=gold, normalization="trim"))
        out["path_trim"] = {k: v for k, v in trim.items() if k != "per_query"}  # whitespace-only normalisation
    return out


def _by_group(trajs: list[Trajectory]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, traj in enumerate(trajs):
        groups.setdefault(traj.group or "all", []).append(i)
    return groups


def run_eval(cfg: EvalConfig, judge: Judge | None = None) -> dict[str, Any]:
    """Compute the report of ``cfg`` with ``judge`` (``None``: judge-free metrics only) and write
    its files into ``cfg.out``; returns the report (as written to ``report.json``)."""
    from codetool.eval.markdown import render_markdown

    out_dir = Path(cfg.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CodetoolError(f"--out {out_dir} is a file; pass a folder for report.json, report.md and the plots "
                            "(e.g. --out runs/eval).")
    out_dir.mkdir(parents=True, exist_ok=True)
    ref_file = cfg.reference if cfg.reference and Path(cfg.reference).exists() else ""
    runs = load_runs(list(cfg.trajectories) + [c for c in cfg.compare if Path(c).exists()] + [ref_file] * bool(ref_file))
    if ref_file and len(runs) > 1:  # an imported reference (e.g. ChatGPT CoT): only the queries the others ran
        ref_run = _pick(runs, ref_file)
        wanted = {(t.benchmark, t.group, t.query_id) for r in runs if r is not ref_run for t in r.trajectories}
        ref_run.trajectories = [t for t in ref_run.trajectories if (t.benchmark, t.group, t.query_id) in wanted]
    if not runs:
        raise ConfigError(f"the inputs hold no trajectories: {', '.join(cfg.trajectories)}.")
    # --compare A B C reaches us as compare=[A], trajectories=[B, C] (argparse): when the compared
    # entries are all files, the positional inputs follow them; method names select exactly those.
    named = [_pick(runs, c) for c in cfg.compare]
    only_files = all(Path(c).exists() for c in cfg.compare)
    shown_runs: list[Run] = []
    for run in (named + runs if only_files else named):
        if not any(run is r for r in shown_runs):
            shown_runs.append(run)
    reference = _pick(runs, cfg.reference) if cfg.reference else (shown_runs[0] if cfg.compare else None)
    rounds = cfg.judge.rounds
    gold = load_gold_paths(cfg.restbench_gold) if cfg.restbench_gold else None
    report: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": to_dict(cfg), "config_hash": config_hash(cfg, ignore=("out",)),
        "judge": judge.describe() if judge else {"name": "none", "kind": "none", "weak": False,
                                                 "note": "no judge: pass and win rates are not computed"},
        "rounds": rounds, "inputs": [], "methods": [r.method for r in shown_runs],
        "reference": reference.method if reference else None,
        "benchmarks": {}, "win_rates": {}, "warnings": [], "files": {},
    }
    judged = shown_runs + ([reference] if reference is not None and not any(reference is r for r in shown_runs)
                           else [])
    labels: dict[str, list[list[str]] | None] = {}
    verdict_rows = []
    parse_failures = 0
    for run in judged:
        report["inputs"].append({"method": run.method, "source": run.source, "trajectories": len(run.trajectories)})
        verdicts = judge_pass(run.trajectories, judge, rounds, max_trajectory_chars=cfg.judge.max_trajectory_chars,
                              protocol=cfg.judge.protocol, blank_finish=cfg.judge.blank_finish) if judge else None
        labels[run.method] = [[v.label for v in row] for row in verdicts] if verdicts else None
        for i, traj in enumerate(run.trajectories):
            row = verdicts[i] if verdicts else []
            parse_failures += sum(v.parse_failed for v in row)
            verdict_rows.append({"method": run.method, "benchmark": traj.benchmark, "group": traj.group,
                                 "query_id": traj.query_id, "finish_type": traj.finish_type,
                                 "answer_source": run_metrics_mod.answer_source(traj),
                                 "labels": [v.label for v in row], "sources": [v.source for v in row],
                                 "reasons": [v.reason for v in row],
                                 **({"errors": [v.error for v in row]} if any(v.error for v in row) else {})})
    for run in shown_runs:
        for bench in dict.fromkeys(t.benchmark for t in run.trajectories):
            idx = [i for i, t in enumerate(run.trajectories) if t.benchmark == bench]
            trajs = [run.trajectories[i] for i in idx]
            lab = [labels[run.method][i] for i in idx] if labels[run.method] is not None else None
            groups = {}
            filters = getattr(getattr(judge, "reference", None), "filtered", None)
            for group, members in _by_group(trajs).items():
                sub_labels = [lab[i] for i in members] if lab is not None else None
                groups[group] = _summary(bench, [trajs[i] for i in members], sub_labels, rounds, gold)
                if sub_labels is not None and cfg.judge.protocol == "codetool" and filters and filters(group):
                    # CodeTool's own formula: its Filter_Map ids leave the sum, not the count
                    groups[group]["pass_rate_codetool"] = dataclasses.asdict(codetool_pass_rate(
                        [trajs[i].query_id for i in members], sub_labels, rounds, filters(group)))
            overall = _summary(bench, trajs, lab, rounds, gold)
            if lab is not None:
                overall["pass_rate_pooled"] = overall["pass_rate"]
                overall["pass_rate"] = dataclasses.asdict(average_pass_rate(
                    [pass_rate([lab[i] for i in m], rounds) for m in _by_group(trajs).values()]))
            entry = report["benchmarks"].setdefault(bench, {"methods": {}})
            entry["methods"][run.method] = {"groups": groups, "overall": overall}
            _path_warnings(report["warnings"], run.method, overall.get("path"))
    if reference is not None:
        _win_rates(report, shown_runs, reference, judge, rounds, cfg.judge)
    report["judge_errors"] = getattr(judge, "errors", 0) if judge else 0
    _warnings(report, shown_runs, parse_failures)
    report["comparability"] = comparability_block(report, cfg.judge, shown_runs, reference,
                                                  judge.describe() if judge else None, cfg.run_settings)
    from codetool.eval.summary import seed_summary

    report["summary"] = seed_summary([p for p in [*cfg.trajectories, *cfg.seed_runs] if p.endswith(".jsonl")],
                                     methods=report["methods"])
    if cfg.prm_metrics and Path(cfg.prm_metrics).is_file():
        report["prm"] = json.loads(Path(cfg.prm_metrics).read_text())
        plot = Path(cfg.prm_metrics).with_name("calibration.png")
        if plot.is_file():
            report["prm"]["calibration_plot"] = str(plot.resolve().relative_to(out_dir.resolve())) \
                if plot.resolve().is_relative_to(out_dir.resolve()) else str(plot)
    write_jsonl(out_dir / "verdicts.jsonl", verdict_rows)
    if cfg.plots:
        from codetool.eval.markdown import write_plots

        report["files"]["plots"] = [str(p) for p in write_plots(report, shown_runs, out_dir)]
    if cfg.export_stabletoolbench:
        report["files"]["stabletoolbench_export"] = [
            str(p) for r in shown_runs for p in export_converted(
                [t for t in r.trajectories if t.benchmark != RESTBENCH], cfg.export_stabletoolbench, r.method)]
    report = redact_obj(report)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    (out_dir / "report.md").write_text(redact(render_markdown(report)))
    logger.info("wrote %s and %s", out_dir / "report.json", out_dir / "report.md")
    return report


def _win_rates(report: dict, shown: list[Run], reference: Run, judge: Judge | None, rounds: int,
               judge_cfg: JudgeConfig) -> None:
    """SoWR of each shown run against ``reference``, per StableToolBench-style benchmark and group
    (both answers are judged again inside each preference round, as StableToolBench does)."""
    if judge is None:
        report["warnings"].append("win rates (SoWR) need a judge; none was configured.")
        return

    def pick(run: Run, bench: str, group: str):
        return {t.query_id: t for t in run.trajectories if t.benchmark == bench and (t.group or "all") == group}

    for run in shown:
        if run is reference:
            continue
        result: dict[str, Any] = {}
        for bench in dict.fromkeys(t.benchmark for t in run.trajectories if t.benchmark != RESTBENCH):
            groups = {}
            for group in dict.fromkeys(t.group or "all" for t in run.trajectories if t.benchmark == bench):
                cand, ref = pick(run, bench, group), pick(reference, bench, group)
                if not ref:
                    continue
                win = compare_runs(cand, ref, judge, rounds, seed=judge_cfg.seed,
                                   max_details_chars=judge_cfg.max_trajectory_chars,
                                   blank_finish=judge_cfg.blank_finish)
                groups[group] = {"win": win.win, "lose": win.lose, "tie": win.tie, "n": win.n,
                                 "judged_pairs": sum(c.judged for c in win.per_query.values()),
                                 "random_picks": win.random_picks, "undecided": win.undecided,
                                 "round_winners": {q: c.round_winners for q, c in win.per_query.items()}}
            if groups:
                average = {k: sum(g[k] for g in groups.values()) / len(groups) for k in ("win", "lose", "tie")}
                result[bench] = {"groups": groups, "average": average}
        if result:
            report["win_rates"][f"{run.method} vs {reference.method}"] = result


def _path_warnings(warnings: list[str], method: str, path: dict | None) -> None:
    if not path:
        return
    if path["missing_gold"]:
        warnings.append(f"{method}: {path['missing_gold']} RestBench trajectories have no gold path and are "
                        f"left out of the path rate (fill extra.gold_path or pass --restbench_gold).")
    if path["unmapped_calls"]:
        warnings.append(f"{method}: {path['unmapped_calls']} tool calls could not be mapped to 'METHOD /path' "
                        f"(available_tools entries need method and path).")
    if path["gold_first"]:
        warnings.append(f"{method}: {path['gold_first']} RestBench queries list the gold APIs first among the "
                        f"candidates: shuffle candidate APIs with a fixed seed before prompting.")


def _warnings(report: dict, runs: list[Run], parse_failures: int) -> None:
    if parse_failures:
        report["warnings"].append(f"{parse_failures} judge replies could not be read after retries; they "
                                  f"count as Unsolved.")
    if report.get("judge_errors"):
        report["warnings"].append(f"{report['judge_errors']} judge requests failed after their retries: their "
                                  "verdicts are error records (Unsolved; an undecided comparison is a coin flip), "
                                  "listed in verdicts.jsonl; run the same eval again to ask only those (the others "
                                  "are cached).")
    for run in runs:
        if run.trajectories and all(c.code is None for t in run.trajectories for s in t.steps for c in s.candidates):
            report["warnings"].append(f"{run.method}: no code steps (an imported function-calling run): SCEP is n/a.")
        # How a policy server was used (codetool.models.openai_backend): what the run adapted to.
        serving = next((t.serving for t in reversed(run.trajectories) if t.serving), {})
        policy = serving.get("policy") or {}
        report["warnings"] += [f"{run.method}: policy server: {text}" for text in policy.get("adaptations", [])]
        if policy.get("identical_samples"):
            report["warnings"].append(f"{run.method}: policy server: identical samples in "
                                      f"{policy['identical_samples']}")


def eval_command(cfg: EvalConfig) -> int:
    """``codetool eval``: write the report and print a one-screen summary of it."""
    from rich.console import Console
    from rich.table import Table

    judge = make_judge(cfg.judge, cache_path=str(Path(cfg.out) / "judge_cache.jsonl"))
    report = run_eval(cfg, judge)
    console = Console()
    table = Table(title=f"judge: {report['judge']['name']}" + (" (weak: smoke test only)" if report["judge"]["weak"]
                                                                else ""))
    for column in ("benchmark", "method", "n", "pass / success %", "correct path % (0/1)", "gold calls % (pooled)",
                   "path score % (frac.)", "SCEP %", "steps", "episode wall s"):
        table.add_column(column)
    for bench, entry in report["benchmarks"].items():
        for method, data in entry["methods"].items():
            s, m = data["overall"], data["overall"]["metrics"]
            pr, path = s["pass_rate"], s.get("path") or {}
            table.add_row(bench, method, str(s["n"]),
                          f"{100 * pr['mean']:.1f} ± {100 * pr['std']:.1f}" if pr else "n/a",
                          f"{100 * path['correct_path_rate']:.1f}" if path.get("n") else "",
                          f"{100 * path['path_pooled_rate']:.1f}" if path.get("n") else "",
                          f"{100 * path['path_fraction_score']:.1f}" if path.get("n") else "",
                          f"{100 * m['scep']:.1f}" if m["scep"] is not None else "n/a",
                          f"{m['mean_steps']:.2f}", f"{m['mean_seconds']:.1f}")
    console.print(table)
    for warning in report["warnings"]:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    block = report["comparability"]
    console.print(f"comparability with {block['target_name']}: "
                  + (f"{len(block['deviations'])} differences" if block["deviations"] else
                     f"no deviation found ({block['settings_checked']} settings checked)"), markup=False, highlight=False)
    for deviation in block["deviations"]:
        console.print(f"not comparable: {deviation}", markup=False, highlight=False)
    console.print(f"report: {Path(cfg.out) / 'report.md'}, report.json, {len(report['files'].get('plots', []))} plots",
                  markup=False, highlight=False)
    return 1 if report["judge_errors"] else 0
