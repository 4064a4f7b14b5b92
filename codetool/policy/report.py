"""The train-policy report: reward curves, before/after table, compute, outcome histogram (JSON, Markdown, PNG).

``report.md`` opens with what the numbers are worth at the run's scale (policy, prompts, episodes
per group, steps, seeds), then the training reward per step (mean over seeds, and a PNG with one
line per seed), each setting's rewards by component and the PRM's share of the advantage's
variance, the held-out before/after table of every reward setting (mean ± spread over
seeds; the same evaluation search for all), on sets of synthetic-world queries the exact
before/after (success by the answer key with a 95% bootstrap interval over queries, and each
setting minus before paired by query: ``codetool.eval.testbed.before_after``), the compute of each run (generated policy tokens:
the settings are compared at equal tokens), and the per-step outcome histogram of the training
rollouts (shares of each step category; a rising ``ok_no_tool`` or ``finish`` share without
grounded answers is how reward hacking shows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .episode import CATEGORIES
from .evaluate import METRICS


def scale_note(cfg, prompts: int, eval_tasks: dict) -> str:
    """What the numbers of a run can say, from its sizes: ``cfg`` (a ``TrainPolicyConfig``), the number of
    training prompts and the evaluation tasks by set name (the first lines of ``report.md``)."""
    sizes = ", ".join(f"{len(t)} {n}" for n, t in eval_tasks.items()) or "no evaluation"
    note = (f"`{cfg.policy}` policy, {prompts} training prompts, {cfg.num_generations} episodes per group, at most "
            f"{cfg.max_steps} steps per run (budget {cfg.token_budget or 'none'} tokens), seeds {cfg.seeds}; "
            f"held-out sets: {sizes}.")
    if cfg.policy == "default" or min([len(t) for t in eval_tasks.values()] or [0]) < 20:
        note += (" At this scale (a 135M policy or a few queries per set) one query moves a rate by several "
                 "points and a few GRPO steps barely move the weights: read it as the method running end to "
                 "end with its compute accounted, not as a measurement of the method.")
    return note


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cell(value: dict | None, pct: bool) -> str:
    if value is None:
        return "–"
    scale, digits = (100, 1) if pct else (1, 1)
    text = f"{scale * value['mean']:.{digits}f}"
    return text + (f" ± {scale * value['spread']:.{digits}f}" if len(value.get("values", [])) > 1 else "")


def mean_curve(runs: dict[str, dict]) -> dict[int, float]:
    """Step -> mean training reward over the seeds that logged that step."""
    by_step: dict[int, list[float]] = {}
    for summary in runs.values():
        for point in summary.get("curve", []):
            by_step.setdefault(int(point["step"]), []).append(float(point["reward"]))
    return {step: float(np.mean(v)) for step, v in sorted(by_step.items())}


def plot_curves(runs: dict[str, dict[str, dict]], path: Path) -> Path:
    """Training reward per step, one panel line per (setting, seed), the seed mean bold."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (setting, seeds) in enumerate(runs.items()):
        color = f"C{k}"
        for summary in seeds.values():
            curve = summary.get("curve", [])
            ax.plot([p["step"] for p in curve], [p["reward"] for p in curve], color=color, alpha=0.35, lw=1)
        mean = mean_curve(seeds)
        ax.plot(list(mean), list(mean.values()), color=color, lw=2.2, label=setting)
    ax.set_xlabel("GRPO step")
    return _save(plt, fig, ax, path, "training reward (weighted, per episode)", "Training reward (thin: seeds, bold: mean)")


def outcome_shares(runs: dict[str, dict]) -> dict[str, float]:
    """Share of each step category over every training rollout of a setting's seeds."""
    counts = {c: 0 for c in CATEGORIES}
    for summary in runs.values():
        for key, value in (summary.get("outcomes") or {}).items():
            counts[key] = counts.get(key, 0) + int(value)
    total = max(sum(counts.values()), 1)
    return {k: v / total for k, v in counts.items()}


def plot_outcomes(runs: dict[str, dict[str, dict]], path: Path) -> Path:
    """Grouped bars: each setting's share of steps per outcome category (categories seen only)."""
    plt = _pyplot()
    shares = {s: outcome_shares(seeds) for s, seeds in runs.items()}
    used = [c for c in CATEGORIES if any(v[c] for v in shares.values())] or list(CATEGORIES[:3])
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(shares), 1)
    for k, (setting, values) in enumerate(shares.items()):
        ax.bar(np.arange(len(used)) + k * width, [100 * values[c] for c in used], width, label=setting)
    ax.set_xticks(np.arange(len(used)) + 0.4 - width / 2, used, rotation=30, ha="right")
    return _save(plt, fig, ax, path, "% of training steps", "Per-step outcomes of the training rollouts")


def _save(plt, fig, ax, path: Path, ylabel: str, title: str) -> Path:
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def component_means(runs: dict[str, dict]) -> dict[str, float]:
    """Per reward function, its mean per-episode value over the logged steps and seeds of a setting."""
    values: dict[str, list[float]] = {}
    for summary in runs.values():
        for point in summary.get("curve", []):
            for name in point:
                if name not in ("step", "reward", "generated_tokens") and not name.startswith("outcomes/") \
                        and isinstance(point[name], (int, float)):
                    values.setdefault(name, []).append(float(point[name]))
    return {k: float(np.mean(v)) for k, v in values.items()}


def component_lines(runs: dict[str, dict[str, dict]], weights: dict[str, dict[str, float]]) -> list[str]:
    """The report's table of each setting's rewards by component and the PRM's share of the advantage."""
    names = list(dict.fromkeys(n for w in weights.values() for n in w))
    lines = ["## Rewards by component, and the PRM's share of the advantage", "",
             "Each reward function's mean value per episode over the training steps (seed mean; unweighted), and "
             "the share of the advantages' variance that each reward's term carries (the covariance share, "
             "`advantages/share_<name>`, mean over steps and seeds). A PRM whose input says nothing (every step scored "
             "alike within each group) has share 0.", "",
             "| setting | " + " | ".join(names) + " | PRM share of the advantage |",
             "|---|" + "---:|" * (len(names) + 1)]
    for setting, seeds in runs.items():
        means = component_means(seeds)
        shares = [s.get("advantage_shares", {}).get("prm") for s in seeds.values()]
        shares = [x for x in shares if x is not None]
        used = weights.get(setting, {})
        share = "–" if not used.get("prm") else f"{100 * float(np.mean(shares)):.1f}%" if shares else "n/a (not logged)"
        lines.append(f"| {setting} | " + " | ".join(f"{means[n]:.3f}" if n in means and used.get(n) else "–"
                                                 for n in names) + f" | {share} |")
    return lines + [""]


def answer_lines(sections: dict[str, dict]) -> list[str]:
    """The exact before/after of world query sets (``codetool.eval.testbed.before_after``): success
    with its 95% bootstrap interval over queries, and each setting minus ``before`` paired by query."""
    lines: list[str] = []
    for name, section in sections.items():
        lines += [f"## Exact success before/after: {name}", "", "By the answer key (per query the mean over "
                  "seeds, then the mean over queries; 95% percentile bootstrap over queries).", "",
                  "| policy | success % | 95% interval | queries |", "|---|---:|---:|---:|"]
        lines += [f"| {r['method']} | {_pct(r['success'])} | {_pct(r['low'])} to {_pct(r['high'])} | {r['queries']} |"
                  for r in section["methods"]]
        lines += ["", "| after - before | points | 95% interval | queries |", "|---|---:|---:|---:|"]
        lines += [f"| {p['a']} - {p['b']} | {_signed(p['mean'])} | {_signed(p['low'])} to {_signed(p['high'])} | "
                  f"{p['n']} |" for p in section["paired"]]
        lines.append("")
    return lines


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:+.1f}"


def render(results: dict[str, Any]) -> str:
    """``report.md`` of a train-policy run (``results.json``'s content)."""
    runs, settings = results["runs"], list(results["runs"])
    lines = [f"# Policy RL: {results['name']}", "", f"**Scale.** {results['scale']}", "",
             f"- policy: `{results['policy']}`; PRM: {results['prm']}",
             f"- advantages: {results['advantage']} (per-step rewards aggregated by {results['aggregate']}), loss "
             f"normalisation {results.get('loss_type', 'dapo')}; compute matched by a budget of "
             f"{results['token_budget'] or 'no'} generated policy tokens per run",
             f"- training prompts: {results.get('test_queries_dropped', 0)} evaluation or test queries dropped from them "
             f"(test sets: {', '.join(results.get('test_sets', [])) or 'none'}; by id and by text)", ""]
    lines += ["| setting | reward weights |", "|---|---|"]
    lines += [f"| {s} | {', '.join(f'{k} {v:g}' for k, v in w.items())} |" for s, w in results["weights"].items()]
    lines += ["", "## Training reward", "", "Mean over seeds of the weighted episode reward at each GRPO step "
              "(settings weigh different rewards, so compare each curve with its own start).", ""]
    curves = {s: mean_curve(runs[s]) for s in settings}
    steps = sorted({step for c in curves.values() for step in c})
    lines += ["| step | " + " | ".join(settings) + " |", "|---:|" + "---:|" * len(settings)]
    for step in steps:
        lines.append(f"| {step} | " + " | ".join(f"{curves[s][step]:.3f}" if step in curves[s] else "–"
                                               for s in settings) + " |")
    lines += ["", "![training reward](reward_curves.png)", ""]
    lines += component_lines(runs, results["weights"])
    if results.get("eval"):
        columns = ["before", *settings]
        lines += ["## Held-out before/after", "", f"The same evaluation search for every policy "
                  f"({results['eval_search']}); mean ± {results['spread']}.", ""]
        for name in results["eval_sets"]:
            lines += [f"**{name}** ({results['eval_sizes'].get(name, '?')} queries)", "",
                      "| metric | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
            for key, label, pct in METRICS:
                cells = [_cell(results["eval"].get(c, {}).get(name, {}).get(key), pct) for c in columns]
                if all(c == "–" for c in cells):
                    continue
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
    lines += answer_lines(results.get("answer_before_after") or {})
    lines += ["## Compute per run", "", "| setting | seed | steps | generated policy tokens | seconds |",
              "|---|---:|---:|---:|---:|"]
    for s in settings:
        for seed, summary in runs[s].items():
            lines.append(f"| {s} | {seed} | {summary['steps']} | {summary['generated_tokens']} | {summary['seconds']} |")
    lines += ["", "## Per-step outcomes of the training rollouts", "", "| outcome | " + " | ".join(settings) + " |",
              "|---|" + "---:|" * len(settings)]
    shares = {s: outcome_shares(runs[s]) for s in settings}
    for cat in CATEGORIES:
        if any(shares[s][cat] for s in settings):
            lines.append(f"| {cat} | " + " | ".join(f"{100 * shares[s][cat]:.1f}%" for s in settings) + " |")
    lines += ["", "![per-step outcomes](outcome_histogram.png)", ""]
    return "\n".join(lines)


def write_report(out_dir: str | Path, results: dict[str, Any]) -> Path:
    """Write ``results.json``, ``report.md`` and the two PNGs into ``out_dir``; returns the report path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot_curves(results["runs"], out / "reward_curves.png")
    plot_outcomes(results["runs"], out / "outcome_histogram.png")
    path = out / "report.md"
    path.write_text(render(results))
    return path
