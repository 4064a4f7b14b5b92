"""The Markdown page and the plots of an evaluation report (see :mod:`codetool.commands.eval`).

``render_markdown(report)`` turns the ``report.json`` data into ``report.md``: the judge (flagged
when weak, and every judged column marked), the first screen (:mod:`codetool.eval.headline`: did the
PRM help, as paired differences with intervals, and its accuracy with its n), the summary
(:mod:`codetool.eval.summary`: judge-free metrics over seeds, what the PRM learned), the configuration
and inputs, warnings, then per benchmark a side-by-side table of
the methods (when there are several) and one table per method with a row per group. Rates are
percentages; pass / success rates are "mean ± std" over the judge rounds. ``write_plots`` draws
the PNGs. Neither computes a metric.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codetool.eval import plots
from codetool.eval.comparability import render_block
from codetool.eval.headline import render_headline
from codetool.eval.metrics import candidate_rewards
from codetool.eval.summary import render_summary

RESTBENCH = "restbench-tmdb"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _rate(pr: dict | None) -> str:
    return "n/a" if not pr else f"{100 * pr['mean']:.1f} ± {100 * pr['std']:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines + [""]


WEAK_MARK = " (⚠ weak judge)"
PLOT_NOTES = {"step_rewards.png": "Per-step rewards of one query every method ran: squares: on-the-spot reward, "
                                  "circles: PRM latent reward, crosses: selection score; the ringed candidate "
                                  "was chosen.",
              "rewards.png": "Selection score of the chosen and rejected candidates of every step with more than "
                             "one candidate: a method whose choices help puts its green box above its red one."}


def _main_name(bench: str, weak: bool = False) -> str:
    return ("success %" if bench == RESTBENCH else "SoPR %") + (WEAK_MARK if weak else "")


def weak_judge_note(judge: dict[str, Any], model: str) -> str:
    """The warning printed beside judged numbers when the judge is a weak local model ("" otherwise)."""
    if not judge.get("weak"):
        return ""
    who = "the embedded 135M judge (SmolLM2-135M-Instruct)" if model == "default" else f"the weak judge `{judge['name']}`"
    return (f"⚠ weak judge: every judged number (SoPR, success %, win rates) comes from {who}, which cannot "
            "tell a right answer from a wrong one; read them as a smoke test of the machinery, not as results.")


def _detail_rows(bench: str, data: dict) -> list[list[str]]:
    rows = []
    items = list(data["groups"].items()) + [("**overall**", data["overall"])]
    for name, s in items:
        m, f = s["metrics"], s["metrics"]["finish_types"]
        row = [name, s["n"], _rate(s["pass_rate"])]
        if bench == RESTBENCH:
            p = s.get("path") or {}
            row += [_pct(p.get(k)) if p.get("n") else "n/a"
                    for k in ("correct_path_rate", "path_pooled_rate", "path_fraction_score", "path_rate_coagents")]
            row += [_num(p.get("delta_solution_len"), 2)]
        row += [_pct(m["scep"]), _pct(m.get("scep_all_candidates")), _num(m["mean_steps"], 2), _num(m["mean_tool_calls"], 2),
                _num(m["mean_prompt_tokens"], 0), _num(m["mean_completion_tokens"], 0), _num(m["mean_seconds"], 1),
                _num(m["mean_tool_cost"], 2), f.get("finish", 0), f.get("give_up", 0), f.get("max_steps", 0),
                f.get("error", 0), s.get("not_executed", 0)]
        rows.append(row)
    return rows


def _detail_header(bench: str, weak: bool = False) -> list[str]:
    head = ["group", "n", _main_name(bench, weak)]
    if bench == RESTBENCH:
        head += ["correct path % (0/1)", "gold calls % (pooled)", "path score % (frac.)", "CoAgents path %", "Δ len"]
    return head + ["SCEP %", "SCEP all cand. %", "steps", "calls", "tokens in", "tokens out", "episode wall s", "tool cost", "finish",
                   "give up", "max steps", "error", "not executed"]


def _comparison(bench: str, methods: dict[str, dict], weak: bool = False) -> list[str]:
    names = list(methods)
    groups = list(dict.fromkeys(g for d in methods.values() for g in d["groups"]))
    rows = []
    for group in groups + ["**overall**"]:
        row = [group]
        for name in names:
            s = methods[name]["overall"] if group == "**overall**" else methods[name]["groups"].get(group)
            if s is None:
                row.append("–")
                continue
            cell = _rate(s["pass_rate"])
            if bench == RESTBENCH:
                p = s.get("path") or {}
                cell += (f" / {_pct(p.get('correct_path_rate'))} / {_pct(p.get('path_fraction_score'))}"
                         if p.get("n") else " / n/a / n/a")
            row.append(cell)
        rows.append(row)
    title = _main_name(bench, weak) + (" / correct path % (0/1) / path score % (frac.)" if bench == RESTBENCH else "")
    lines = [f"### Side by side: {title}", ""] + _table(["group"] + names, rows)
    metric_rows = []
    overall = {n: methods[n]["overall"]["metrics"] for n in names}
    for label, key, fmt in (("SCEP %", "scep", _pct), ("SCEP all cand. %", "scep_all_candidates", _pct),
                            ("steps", "mean_steps", lambda x: _num(x, 2)),
                            ("tool calls", "mean_tool_calls", lambda x: _num(x, 2)),
                            ("tokens in", "mean_prompt_tokens", lambda x: _num(x, 0)),
                            ("tokens out", "mean_completion_tokens", lambda x: _num(x, 0)),
                            ("episode wall s", "mean_seconds", lambda x: _num(x, 1)),
                            ("tool cost", "mean_tool_cost", lambda x: _num(x, 2))):
        metric_rows.append([label] + [fmt(overall[n].get(key)) for n in names])
    for kind in ("finish", "give_up", "max_steps", "error"):
        metric_rows.append([kind] + [str(overall[n]["finish_types"].get(kind, 0)) for n in names])
    metric_rows.append(["not executed (left out)"] + [str(methods[n]["overall"].get("not_executed", 0)) for n in names])
    metric_rows.append(["candidates not executed"] + [str(overall[n].get("not_executed_candidates", 0)) for n in names])
    phases = list(dict.fromkeys(p for n in names for p in overall[n]["phase_seconds"]))
    for phase in phases:
        metric_rows.append([f"s {phase}"] + [_num(overall[n]["phase_seconds"].get(phase), 2) for n in names])
    return lines + ["Run metrics (per query):", ""] + _table(["metric"] + names, metric_rows) + [
        "", "Not executed: episodes that ended because the machine could run none of a step's candidates "
        "(after the executor's retries); they are left out of n and every rate above.",
        "", "Episode wall s: start to end of each episode. Episodes run concurrently and share each "
        "generate call, so these times overlap; `s generation`, `s execution` and `s scoring` split "
        "each shared call's time among the episodes in it."]


def render_markdown(report: dict[str, Any]) -> str:
    """The Markdown page of ``report`` (the data of ``report.json``)."""
    judge = report["judge"]
    lines = ["# codetool evaluation report", ""]
    judge_line = f"**Judge:** `{judge['name']}` ({judge['kind']}"
    if "mode" in judge:
        judge_line += f", {judge['mode']} mode, temperature {judge['temperature']}"
    judge_line += f", {report['rounds']} rounds)" if judge["kind"] != "none" else ")"
    lines.append(judge_line + ".")
    cfg = report["config"]
    weak = bool(judge.get("weak"))
    note = weak_judge_note(judge, cfg["judge"]["model"])
    if weak:
        lines += ["", f"> **Warning: weak judge.** `{judge['name']}` is {judge['note']}. {note}"]
    elif judge["kind"] == "none":
        lines += ["", f"> {judge['note']}."]
    lines += [""] + render_headline(report, WEAK_MARK if weak else "") + render_summary(report)
    lines += ["", f"Created {report['created']}; config hash `{report['config_hash']}`.", "", "## Configuration", ""]
    settings = [["inputs", ", ".join(f"{i['source']} ({i['method']}: {i['trajectories']})" for i in report["inputs"])],
                ["methods shown", ", ".join(report["methods"])],
                ["win-rate reference", report["reference"] or "none"],
                ["judge model", cfg["judge"]["model"] + (f" ({cfg['judge']['remote_model']})"
                                                         if cfg["judge"]["remote_model"] else "")],
                ["judge rounds / temperature / mode", f"{cfg['judge']['rounds']} / {cfg['judge']['temperature']} / "
                                                      f"{cfg['judge']['mode']}"],
                ["RestBench gold file", cfg["restbench_gold"] or "trajectories' extra.gold_path"]]
    lines += _table(["setting", "value"], settings)
    if report.get("comparability"):
        lines += render_block(report["comparability"])
    if report["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
    for bench, entry in report["benchmarks"].items():
        lines += [f"## {bench}", ""]
        if len(entry["methods"]) > 1:
            lines += _comparison(bench, entry["methods"], weak)
        for method, data in entry["methods"].items():
            lines += [f"### {method}", ""] + _table(_detail_header(bench, weak), _detail_rows(bench, data))
            split = data["overall"].get("pass_rate_by_answer_source")
            if split and len(split) > 1:
                lines += [f"{_main_name(bench, weak)} by answer source: " + ", ".join(
                    f"{src} {_rate(pr)} (n={pr['n']})" for src, pr in split.items()), ""]
        if bench == RESTBENCH:
            lines += ["Correct path % (0/1, RestGPT's): queries whose whole gold API path (normalised) appears in "
                      "order among the executed calls. Path score % (frac., the kind CodeTool reported): the share "
                      "of each gold path matched in order, averaged. Δ len: extra calls over the gold path on "
                      "successful queries.", ""]
    if report["win_rates"]:
        lines += ["## Win rates (SoWR)" + (WEAK_MARK if weak else ""), ""] + ([f"> {note}", ""] if note else []) + [
                  "StableToolBench's procedure: per round both answers are judged again (cut to 1,000 "
                  "characters, in a seeded random order); one Solved answer wins, and with none solved a single "
                  "Unsure one wins; otherwise the judge compares the whole answers. \"judged\": rounds a "
                  "comparison decided; \"random\": rounds picked at random between identical answers or after an "
                  "unreadable comparison. A query ties only when an even number of rounds splits evenly.", ""]
        rows = []
        for pair, by_bench in report["win_rates"].items():
            for bench, result in by_bench.items():
                for group, w in result["groups"].items():
                    rows.append([pair, bench, group, w["n"], _pct(w["win"]), _pct(w["tie"]), _pct(w["lose"]),
                                 w["judged_pairs"], w.get("random_picks", 0) + w.get("undecided", 0)])
                avg = result["average"]
                rows.append([pair, bench, "**average**", "", _pct(avg["win"]), _pct(avg["tie"]), _pct(avg["lose"]), "",
                             ""])
        lines += _table(["candidate vs reference", "benchmark", "group", "n", "win %", "tie %", "lose %", "judged",
                         "random"],
                        rows)
    if report["files"].get("plots"):
        lines += ["## Plots", ""]
        for p in report["files"]["plots"]:
            lines += [f"![{Path(p).stem}]({Path(p).name})", ""] + ([PLOT_NOTES[Path(p).name], ""]
                                                                   if Path(p).name in PLOT_NOTES else [])
    return "\n".join(lines)


def write_plots(report: dict[str, Any], runs: list, out_dir: Path) -> list[Path]:
    """``bars_<benchmark>.png`` per benchmark, ``steps.png``, ``rewards.png`` and ``step_rewards.png`` (the
    per-step rewards of one query every method ran); returns the paths."""
    written = []
    for bench, entry in report["benchmarks"].items():
        panels: dict[str, dict] = {}
        errors: dict[str, dict] = {}
        main = "success" if bench == RESTBENCH else "SoPR"
        for method, data in entry["methods"].items():
            items = list(data["groups"].items()) + ([("average", data["overall"])] if len(data["groups"]) > 1 else [])
            for group, s in items:
                if s["pass_rate"] is not None:
                    panels.setdefault(main, {}).setdefault(method, {})[group] = 100 * s["pass_rate"]["mean"]
                    errors.setdefault(main, {}).setdefault(method, {})[group] = 100 * s["pass_rate"]["std"]
                if bench == RESTBENCH:
                    p = s.get("path") or {}
                    value = 100 * p["correct_path_rate"] if p.get("n") else None
                    panels.setdefault("correct path", {}).setdefault(method, {})[group] = value
                else:
                    done = s["metrics"]["finish_types"].get("finish", 0) / max(1, s["n"])
                    panels.setdefault("finished", {}).setdefault(method, {})[group] = 100 * done
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in bench)
        written.append(plots.group_bars(panels, out_dir / f"bars_{safe}.png", title=f"{bench}: per group",
                                        errors=errors))
    written.append(plots.steps_distribution({r.method: [len(t.steps) for t in r.trajectories] for r in runs},
                                            out_dir / "steps.png"))
    written.append(plots.chosen_vs_rejected({r.method: candidate_rewards(r.trajectories) for r in runs},
                                            out_dir / "rewards.png"))
    example = plots.example_step_rewards({r.method: r.trajectories for r in runs}, out_dir / "step_rewards.png")
    if example is not None:
        written.append(example)
    return written
