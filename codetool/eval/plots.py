"""PNG plots of an evaluation report (matplotlib, Agg backend: no display needed).

Per-group bars for each method (one panel per metric, error bars where a metric has a spread over
judge rounds), the distribution of steps per query for each method, the selection score of chosen
vs rejected candidates for each method, the per-step rewards of one example query (every
candidate's on-the-spot and latent reward and score, the chosen one marked;
:func:`example_step_rewards`), and a metric against generated tokens per strategy
(:func:`metric_vs_tokens`, :func:`accuracy_curves`). Every function writes one file
and returns its path; none of them shows a window or keeps a figure open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from codetool.search.records import Trajectory

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def group_bars(panels: Mapping[str, Mapping[str, Mapping[str, float | None]]], path: str | Path, *,
               title: str, errors: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None) -> Path:
    """Grouped bars: one panel per metric, groups on the x axis, one bar per method.

    Args:
        panels (`Mapping`): ``metric -> method -> group -> value in percent`` (``None``: no bar).
        path (`str` or `Path`): the PNG to write.
        title (`str`): the figure title.
        errors (`Mapping`, *optional*): ``metric -> method -> group -> std`` for error bars.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(max(6.0, 5.5 * len(panels)), 4.2), squeeze=False)
    for ax, (metric, by_method) in zip(axes[0], panels.items()):
        methods = list(by_method)
        groups = list(dict.fromkeys(g for m in methods for g in by_method[m]))
        width = 0.8 / max(1, len(methods))
        for k, method in enumerate(methods):
            xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(groups))]
            values = [by_method[method].get(g) for g in groups]
            err = [(errors or {}).get(metric, {}).get(method, {}).get(g, 0.0) for g in groups]
            bars = ax.bar(xs, [v or 0.0 for v in values], width, label=method, color=COLORS[k % len(COLORS)],
                          yerr=err if any(err) else None, capsize=3)
            for bar, value in zip(bars, values):
                label = "n/a" if value is None else f"{value:.0f}"
                ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=30 if len(groups) > 3 else 0, ha="right" if len(groups) > 3 else "center",
                           fontsize=8)
        ax.set_ylim(0, 125)  # the band above 100 holds the legend, clear of the bars
        ax.set_yticks(range(0, 101, 20))
        ax.set_ylabel(f"{metric} (%)")
        ax.set_title(metric, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", ncol=min(4, max(1, len(methods))), frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def steps_distribution(steps: Mapping[str, Sequence[int]], path: str | Path) -> Path:
    """Share of queries by number of steps, one bar per method at each step count."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    counts = sorted({s for values in steps.values() for s in values}) or [0]
    width = 0.8 / max(1, len(steps))
    for k, (method, values) in enumerate(steps.items()):
        total = max(1, len(values))
        shares = [100.0 * sum(1 for v in values if v == c) / total for c in counts]
        ax.bar([c + (k - (len(steps) - 1) / 2) * width for c in counts], shares, width, label=method,
               color=COLORS[k % len(COLORS)])
    ax.set_xticks(counts)
    ax.set_ylim(0, 120)  # the band above 100 holds the legend
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlabel("steps per query")
    ax.set_ylabel("queries (%)")
    ax.set_title("Distribution of steps per query", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", ncol=min(4, max(1, len(steps))), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def chosen_vs_rejected(rewards: Mapping[str, tuple[Sequence[float], Sequence[float]]], path: str | Path, *,
                       label: str = "selection score") -> Path:
    """Box plots of the reward of chosen vs rejected candidates, a pair of boxes per method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(rewards) + 2), 4.0))
    data, positions, colors, ticks = [], [], [], []
    for k, (method, (chosen, rejected)) in enumerate(rewards.items()):
        for offset, values, color in ((-0.2, chosen, "#55A868"), (0.2, rejected, "#C44E52")):
            if values:
                data.append(list(values))
                positions.append(k + offset)
                colors.append(color)
        ticks.append(f"{method}\n(chosen {len(chosen)}, rejected {len(rejected)})")
    if data:
        boxes = ax.boxplot(data, positions=positions, widths=0.35, patch_artist=True, showmeans=True, showfliers=False,
                           medianprops={"color": "black"},
                           meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black"})
        for patch, color in zip(boxes["boxes"], colors):
            patch.set_facecolor(color)
            patch.set_edgecolor(color)
            patch.set_alpha(0.6)
        rng = np.random.default_rng(0)  # jittered points show the data when the boxes collapse
        for values, x, color in zip(data, positions, colors):
            ax.scatter(x + rng.uniform(-0.08, 0.08, len(values)), values, s=8, color=color, alpha=0.7, zorder=3)
    else:
        ax.text(0.5, 0.5, "no step had more than one candidate", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks(range(len(ticks)))
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_xlim(-0.7, max(0, len(ticks) - 1) + 0.7)
    ax.set_ylabel(label)
    ax.set_title(f"{label[:1].upper()}{label[1:]} of the chosen (green) and rejected (red) candidates\n"
                 "of every step with more than one candidate", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor="#55A868", alpha=0.6, label="chosen"),
                       Patch(facecolor="#C44E52", alpha=0.6, label="rejected"),
                       plt.Line2D([], [], color="black", label="median"),
                       plt.Line2D([], [], marker="^", color="black", markerfacecolor="white", linestyle="",
                                  label="mean")], fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def example_query(trajectories: Mapping[str, Sequence]) -> str | None:
    """The query to show in :func:`step_rewards`: one that every method ran, with the most candidates
    carrying a latent reward, then the most candidates in all, then the first in file order.

    Args:
        trajectories (`Mapping`): ``method -> list of Trajectory``.
    """
    by_method = [{t.query_id: t for t in trajs} for trajs in trajectories.values()]
    if not by_method:
        return None
    common = [q for q in by_method[0] if all(q in m for m in by_method[1:])]

    def weight(query_id: str) -> tuple[int, int]:
        cands = [c for m in by_method for s in m[query_id].steps for c in s.candidates]
        return sum(c.r_latent is not None for c in cands), len(cands)

    return max(common, key=lambda q: (weight(q), -common.index(q)), default=None)


def step_rewards(trajectories: Mapping[str, Trajectory], path: str | Path, *, title: str = "") -> Path:
    """Per-step rewards of one query, one panel per method: every candidate's on-the-spot reward
    (square), latent reward (circle, when computed) and selection score (cross); the chosen candidate
    is drawn filled and ringed, the rejected ones faded.

    Args:
        trajectories (`Mapping`): ``method -> Trajectory`` of the same query.
        path (`str` or `Path`): the PNG to write.
        title (`str`, *optional*): the figure title (defaults to the query, shortened).
    """
    plt = _pyplot()
    items = list(trajectories.items())
    fig, axes = plt.subplots(1, max(1, len(items)), figsize=(max(6.0, 4.2 * len(items)), 4.0), squeeze=False,
                             sharey=True)
    for ax, (method, traj) in zip(axes[0], items):
        for s, step in enumerate(traj.steps):
            k = len(step.candidates)
            for c in step.candidates:
                x = s + (c.index - (k - 1) / 2) * 0.18
                alpha = 1.0 if c.chosen else 0.35
                ax.scatter(x, c.r_spot, marker="s", color=COLORS[0], alpha=alpha, s=40, zorder=3)
                if c.r_latent is not None:
                    ax.scatter(x, c.r_latent, marker="o", color=COLORS[1], alpha=alpha, s=40, zorder=3)
                ax.scatter(x, c.score, marker="x", color=COLORS[3], alpha=alpha, s=40, zorder=3)
                if c.chosen:
                    ax.scatter(x, c.score, marker="o", s=160, facecolors="none", edgecolors="black", zorder=4)
        ax.set_xticks(range(len(traj.steps)))
        ax.set_xticklabels([f"step {s + 1}" for s in range(len(traj.steps))], fontsize=8)
        ax.set_xlim(-0.6, max(0, len(traj.steps) - 1) + 0.6)
        ax.set_title(f"{method} ({traj.finish_type})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("reward")
    handles = [plt.Line2D([], [], marker=m, color=c, linestyle="", label=lab) for m, c, lab in
               (("s", COLORS[0], "on-the-spot"), ("o", COLORS[1], "latent (PRM)"), ("x", COLORS[3], "score"))]
    handles.append(plt.Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="black", linestyle="",
                              markersize=10, label="chosen"))
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    query = next((t.query for _, t in items), "")
    fig.suptitle(title or (query if len(query) <= 90 else query[:87] + "..."), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def own_steps(traj) -> bool:
    """Whether a trajectory holds candidates this package ran (and rewarded): an imported answer
    (StableToolBench's converted layout) has neither rewards nor alternatives to plot."""
    from codetool.search.records import ImportedResult

    return any(not isinstance(c.result, ImportedResult) for s in traj.steps for c in s.candidates)


def example_step_rewards(trajectories: Mapping[str, Sequence], path: str | Path) -> Path | None:
    """The hook for a report: :func:`step_rewards` of :func:`example_query`'s query across methods
    (``method -> list of Trajectory``; methods whose runs were imported are left out); ``None`` (no
    file) when no query is common to all the others."""
    trajectories = {m: trajs for m, trajs in trajectories.items() if any(own_steps(t) for t in trajs)}
    query_id = example_query(trajectories)
    if query_id is None:
        return None
    return step_rewards({m: next(t for t in trajs if t.query_id == query_id)
                         for m, trajs in trajectories.items()}, path)


def metric_vs_tokens(points: Mapping[str, Sequence[tuple[float, float]]], path: str | Path, *, metric: str,
                     title: str = "Metric against generated tokens") -> Path:
    """A metric against the policy's generated tokens per query, one series per strategy (the
    equal-compute figure of search-and-learn / Snell et al. 2024).

    Args:
        points (`Mapping`): ``strategy -> [(generated tokens per query, metric), ...]``, one pair per
            run (seed or budget). Runs at the same token budget are not merged: each is a dot, and
            the series' mean is a larger marker with horizontal and vertical std bars.
        path (`str` or `Path`): the PNG to write.
        metric (`str`): the y-axis label (e.g. ``SCEP (%)``).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, (name, pairs) in enumerate(points.items()):
        color = COLORS[k % len(COLORS)]
        if not pairs:
            continue
        xs, ys = np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float)
        ax.scatter(xs, ys, s=14, color=color, alpha=0.5)
        ax.errorbar([xs.mean()], [ys.mean()], xerr=[xs.std()], yerr=[ys.std()], fmt="o", ms=7, color=color,
                    capsize=3, label=f"{name} (n={len(pairs)})")
    ax.set_xlabel("generated tokens per query")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def accuracy_curves(panels: Mapping[str, Mapping[str, Sequence[tuple[float, float, float, float]]]],
                    path: str | Path, *, ylabels: Mapping[str, str], title: str) -> Path:
    """Accuracy against generated tokens per query, one panel per benchmark, one line per strategy
    (Snell et al. 2024's equal-compute curves), each point with its interval over queries.

    Args:
        panels (`Mapping`): ``benchmark -> strategy -> [(tokens per query, value, low, high), ...]``,
            values in percent; a strategy's points are joined in order of tokens.
        path (`str` or `Path`): the PNG to write.
        ylabels (`Mapping[str, str]`): the y-axis label of each panel (what the value is).
        title (`str`): the figure title.
    """
    plt = _pyplot()
    names = list(dict.fromkeys(name for series in panels.values() for name in series))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.2 * max(1, len(panels)), 4.6), squeeze=False)
    markers = "osD^vP*Xh<>"
    for ax, (bench, series) in zip(axes[0], panels.items()):
        for name, pts in series.items():
            if not pts:
                continue
            k = names.index(name)
            pts = sorted(pts)
            dodge = 1.02 ** (k - (len(names) - 1) / 2)  # series at equal tokens stay apart (at most a few %)
            xs, ys = [p[0] * dodge for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, fmt=f"-{markers[k % len(markers)]}", ms=5, lw=1.2, capsize=2,
                        color=COLORS[k % len(COLORS)], alpha=0.85, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("generated tokens per query (all candidates; log scale, series dodged by a few %)")
        ax.set_ylabel(ylabels.get(bench, bench))
        ax.set_title(bench, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(labels) - 1) // 5 if handles else 0), 1, 0.95))
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)
