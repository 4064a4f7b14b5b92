"""The report of ``codetool eval-decision``: ``report.json`` (:func:`build_report`), the ``report.md``
tables and the ``decision_sweep.png`` plot.

The page and the plot read only the ``report.json`` dictionary, so a saved report can be
re-rendered without rerunning anything.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codetool.decide.metrics import (
    SCORINGS,
    action_metrics,
    argmax_choices,
    baseline_row,
    route_at,
    sweep_thresholds,
    threshold_row,
)

if TYPE_CHECKING:
    from codetool.decide.records import DecisionRecord
    from codetool.decide.stage import RouterConfig

_ROWS = [("decision_accuracy", "decision accuracy (first action right)"),
         ("necessity_accuracy", "necessity accuracy (tool vs none)"),
         ("tool_invocation_accuracy", "tool-invocation accuracy"), ("tool_selection_error", "tool-selection error"),
         ("hallucination_rate", "hallucination rate"), ("deferred_rate", "deferred to search (tool queries)"),
         ("unnecessary_tool_rate", "unnecessary tool use (tool-free)")]


def pct(x: float | None) -> str:
    """A share in [0, 1] as a percentage with one decimal, or ``n/a``."""
    return "n/a" if x is None else f"{100 * x:.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows] + [""]


def build_report(records: list[DecisionRecord], skipped: dict[str, int], seconds: float, *, router: RouterConfig,
                 model: str, decider: str = "", thresholds: list[float] | None = None, run_search: bool = False,
                 config: dict[str, Any] | None = None) -> dict:
    """``report.json``: counts, the decision layer, routing at ``router``'s thresholds, the
    always-search baseline and saving, the sweep (over ``thresholds``, default: every recorded
    confidence), per-category accuracy, direct-answer accuracy.

    Args:
        model (`str`), decider (`str`, *optional*): the policy and deciding model as configured
            (no decider: the policy decides).
        run_search (`bool`, *optional*): whether the fast and search routes were run (a note says
            what is missing when not).
        config (`dict`, *optional*): the command's settings, written as the report's ``config``.
    """
    method = records[0].method if records else None
    r_cfg = router
    t_tool = r_cfg.t_probe if method == "probe" else r_cfg.t_tool
    at = threshold_row(records, r_cfg.t_none, t_tool, r_cfg.prefill)
    at["fast_fallbacks"] = sum(1 for r in records if route_at(r, r_cfg.t_none, t_tool, r_cfg.prefill) == "fast"
                               and r.fast_fallback)
    base = baseline_row(records)
    saving = None
    if base and at["tokens_per_query"] is not None:
        saving = {"tokens": 1 - at["tokens_per_query"] / max(base["tokens_per_query"], 1e-9),
                  "seconds": 1 - at["seconds_per_query"] / max(base["seconds_per_query"], 1e-9)}
    by_category = {}
    for cat in sorted({r.category for r in records}):
        rows = [r for r in records if r.category == cat]
        by_category[cat] = {"n": len(rows), **{k: v for k, v in action_metrics(rows, [r.choice for r in rows]).items()
                                                if k in ("decision_accuracy", "necessity_accuracy")}}
    judged = [r for r in records if r.answer_correct is not None]
    notes = ["Each tool-free query is offered the tool list of a sampled tool-needing query (tools_from).",
             "Direct-answer accuracy is a lenient string match against the reference, not a judge."]
    if not run_search:
        notes.append("run_search was off: the fast and search routes were not run, so their first tool is "
                     "unknown ('deferred') and tokens/seconds against always-search are not available.")
    n = max(1, len(records))
    return {
        "benchmark": "decision", "model": model, "decider": decider or model, "method": method,
        "scoring": (("pmi-" if r_cfg.calibrate else "") + r_cfg.length_norm) if method == "logprobs" else None,
        "thresholds": {"t_none": r_cfg.t_none, "t_tool": r_cfg.t_tool} if method != "probe"
        else {"t_probe": r_cfg.t_probe},
        "counts": {"tool": sum(r.needs_tool for r in records), "free": sum(not r.needs_tool for r in records),
                   "groups": dict(Counter(r.group for r in records)),
                   "categories": dict(Counter(r.category for r in records)),
                   "mean_functions_offered": sum(r.n_functions for r in records) / n},
        "skipped": skipped,
        "decision": action_metrics(records, [r.choice for r in records]),
        "decision_by_scoring": {k: action_metrics(records, argmax_choices(records, k)) for k in SCORINGS
                                if not k.startswith("pmi-") or all(r.null_logprobs for r in records)}
        if method == "logprobs" else None,
        "decision_cost": {"tokens_per_query": sum(r.costs.decision.tokens for r in records) / n,
                          "seconds_per_query": sum(r.costs.decision.seconds for r in records) / n},
        "at_threshold": at, "always_act": threshold_row(records, 0.0, 0.0, r_cfg.prefill), "always_search": base,
        "saving": saving, "sweep": sweep_thresholds(records, thresholds or None, r_cfg.prefill),
        "by_category": by_category,
        "direct_answers": {"with_reference": len(judged), "correct": sum(bool(r.answer_correct) for r in judged),
                           "accuracy": sum(bool(r.answer_correct) for r in judged) / len(judged) if judged else None},
        "seconds_total": seconds, "notes": notes, "config": config or {},
    }


def write_report(out: Path, report: dict, records: list[DecisionRecord]) -> None:
    """Write ``records.jsonl``, ``report.json``, ``report.md``, ``decision_sweep.png`` and, with a
    necessity comparison, ``decision_tradeoff.png`` into ``out`` (``report`` already redacted)."""
    from codetool.decide.tradeoff import plot_tradeoff
    from codetool.jsonl import write_jsonl

    write_jsonl(out / "records.jsonl", [r.to_dict() for r in records])
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    plot_sweep(report, out / "decision_sweep.png")
    if report["necessity"]:
        plot_tradeoff(report["necessity"], out / "decision_tradeoff.png")


def render_markdown(report: dict) -> str:
    """``report.md``: tables of the decision, routing vs always-search, the sweep, categories."""
    c, t = report["counts"], report["thresholds"]
    lines = ["# Decide-first benchmark", "",
             f"Model `{report['model']}` (decider `{report['decider']}`), confidence from **{report['method']}**"
             + (f" (scoring `{report['scoring']}`)" if report["scoring"] else "")
             + f"; {c['tool']} tool-needing queries ({', '.join(f'{g} {n}' for g, n in c['groups'].items() if g != 'tool_free')}),"
             f" {c['free']} tool-free; {c['mean_functions_offered']:.1f} functions offered per query on average."
             + (f" Skipped StableToolBench queries: {report['skipped']}." if report["skipped"] else ""), "",
             "## Decision (top option, no threshold)", ""]
    cols = report["decision_by_scoring"] or {"top option": report["decision"]}
    lines += _table(["metric (%)", *cols], [[label, *(pct(m[key]) for m in cols.values())] for key, label in _ROWS])
    cost = report["decision_cost"]
    lines += [f"Decision cost: {cost['tokens_per_query']:.0f} tokens and {cost['seconds_per_query']:.2f} s per query.", "",
              f"## Routing at {', '.join(f'{k} = {v}' for k, v in t.items())}", ""]
    cols = {"router": report["at_threshold"], "always act (t = 0)": report["always_act"]}
    if report["always_search"]:
        cols["always search"] = report["always_search"]
    rows = [[label, *(pct(m[key]) for m in cols.values())] for key, label in _ROWS]
    rows.append(["tokens per query", *(_num(m["tokens_per_query"], 0) for m in cols.values())])
    rows.append(["seconds per query", *(_num(m["seconds_per_query"], 2) for m in cols.values())])
    rows.append(["routes direct/fast/search", *("/".join(str(v) for v in m["routes"].values()) if "routes" in m
                                                else "-" for m in cols.values())])
    lines += _table(["", *cols], rows)
    at, saving = report["at_threshold"], report["saving"]
    if report["always_search"]:
        lines.append(f"Fast paths that fell back to the search: {at['fast_fallbacks']} of {at['routes']['fast']}.")
    if saving:
        lines.append(f"**Saving against always-search: {100 * saving['tokens']:.1f}% of tokens, "
                     f"{100 * saving['seconds']:.1f}% of seconds per query.**")
    lines += ["", "## Threshold sweep (t_none = t_tool = t)", "", "![accuracy and tokens against the threshold]"
              "(decision_sweep.png)", ""]
    sweep = report["sweep"]
    shown = sweep if len(sweep) <= 16 else [sweep[round(i * (len(sweep) - 1) / 15)] for i in range(16)]
    lines += _table(["t", "direct/fast/search", "decision acc %", "tool-invocation %", "hallucination %",
                     "unnecessary %", "tokens/query", "s/query"],
                    [[f"{r['t_none']:.3f}", "/".join(str(v) for v in r["routes"].values()), pct(r["decision_accuracy"]),
                      pct(r["tool_invocation_accuracy"]), pct(r["hallucination_rate"]),
                      pct(r["unnecessary_tool_rate"]), _num(r["tokens_per_query"], 0), _num(r["seconds_per_query"], 2)]
                     for r in shown])
    lines += necessity_markdown(report.get("necessity"))
    lines += ["## Decision accuracy by category", ""]
    lines += _table(["category", "n", "decision acc %", "necessity acc %"],
                    [[k, v["n"], pct(v["decision_accuracy"]), pct(v["necessity_accuracy"])]
                     for k, v in report["by_category"].items()])
    da = report["direct_answers"]
    lines += [f"Direct answers on tool-free queries with a reference: {da['correct']} of {da['with_reference']} "
              f"match ({pct(da['accuracy'])}%).", "", "## Definitions", "",
              "T = tool-needing queries (gold: StableToolBench `relevant APIs`), F = tool-free queries; the first "
              "action is NONE (direct answer), a function (fast path: its first executed call when run), or the "
              "full search (its first executed call when run, else *deferred*).",
              "- tool-invocation accuracy: share of T whose first action is a gold function;",
              "- tool-selection error: share of T whose first action is a function that is not gold;",
              "- hallucination rate: share of T answered directly, without the tool it needed;",
              "- unnecessary tool use: share of F not answered directly;",
              "- decision accuracy: right first action over T and F; necessity accuracy: tool-or-not right.", "",
              "## Notes", "", *(f"- {n}" for n in report["notes"]), ""]
    return "\n".join(lines)


def necessity_markdown(nec: dict | None) -> list[str]:
    """The ``report.md`` section of the side-by-side necessity comparison (empty without one)."""
    if not nec:
        return []
    from codetool.decide.compare import LABEL

    where = "held-out queries of the probe" if nec["heldout"] else "queries of this draw"
    lines = [f"## Tool necessity: probe, verbalised and log-prob confidence ({nec['n']} {where}, "
             f"{nec['needs_tool']} need a tool)", "", f"Labels: {nec['labels_from']}. Tool outcome: {nec['tool_outcome']}.",
             "", "![accuracy against total tool calls](decision_tradeoff.png)", ""]
    rows = []
    for name, m in nec["methods"].items():
        ci = m["auroc_ci95"]
        rows.append([LABEL.get(name, name), _num(m["auroc"], 3), f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "n/a"])
    lines += _table(["method", "AUROC", "95% bootstrap interval"], rows)
    header = ["method", "t", "accuracy %", "total tool calls", "unnecessary tool calls", "missed tool calls"]
    rows = [[LABEL.get(name, name), f"{pt['t']:.1f}", pct(pt["accuracy"]), pt["total_tool_calls"],
             pt["unnecessary_tool_calls"], pt["missed_tool_calls"]]
            for name, m in nec["methods"].items() for pt in m["sweep"]]
    lines += ["### Accuracy against tool calls, per threshold (tool side iff P(tool) >= t)", ""] + _table(header, rows)
    if nec["baselines"]:
        rows = [[b["mode"], b["reasoning"], pct(b["accuracy"]), b["total_tool_calls"], b["unnecessary_tool_calls"],
                 b["missed_tool_calls"], _num(b["reasoning_tokens_per_query"], 1)] for b in nec["baselines"]]
        lines += ["### Prompt-only baselines (one first reply per query)", ""] + _table(
            ["mode", "reasoning", "accuracy %", "total tool calls", "unnecessary tool calls", "missed tool calls",
             "tokens before the first action"], rows)
    lines += ["Accuracy: a no-tool answer is right when the query needs no tool (the no-tool run's label); a "
              "tool-side query is right when its tool outcome is (see above). Unnecessary tool calls: calls on "
              "queries that need none; missed: tool-needing queries answered without one.", ""]
    return lines


def plot_sweep(report: dict, path: str | Path) -> Path:
    """``decision_sweep.png``: accuracy metrics (left) and tokens per query (right) against the
    threshold; without measured route costs, the right panel shows the share of each route."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = report["sweep"]
    ts = [r["t_none"] for r in sweep]
    measured = report["always_search"] is not None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.4))
    for key, label in [_ROWS[0], _ROWS[1], _ROWS[2], _ROWS[4], _ROWS[6]]:
        if not measured and key in ("decision_accuracy", "tool_invocation_accuracy"):
            label += " (deferred = not right)"
        if all(r[key] is not None for r in sweep):
            left.plot(ts, [100 * r[key] for r in sweep], drawstyle="steps-post", marker=".", label=label)
    left.set(ylabel="%", ylim=(-3, 103), title="accuracy against the threshold")
    if all(r["tokens_per_query"] is not None for r in sweep):
        right.plot(ts, [r["tokens_per_query"] for r in sweep], drawstyle="steps-post", marker=".", label="router")
        if measured:
            right.axhline(report["always_search"]["tokens_per_query"], color="C3", ls=":", label="always search")
        right.set(ylabel="tokens per query", title="tokens per query against the threshold")
    else:
        n = max(1, sum(sweep[0]["routes"].values()))
        for route in ("direct", "fast", "search"):
            right.plot(ts, [100 * r["routes"][route] / n for r in sweep], drawstyle="steps-post", marker=".", label=route)
        right.set(ylabel="% of queries", ylim=(-3, 103), title="routes (fast/search costs not measured)")
    for ax in (left, right):
        for name, value in report["thresholds"].items():
            ax.axvline(value, color="gray", ls="--" if name == "t_tool" else ":", lw=1, label=f"chosen {name} = {value}")
        ax.set_xlabel("threshold t (t_none = t_tool)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.suptitle(f"Decide-first: {report['model']}, {report['method']}, "
                 f"{report['counts']['tool']} tool + {report['counts']['free']} tool-free queries", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
