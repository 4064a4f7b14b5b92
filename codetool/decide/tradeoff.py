"""When2Tool's trade-off: accuracy against total tool calls, per method and threshold, and the
prompt-only baselines (``codetool eval-decision``).

When2Tool (Sun et al., 2026) plots task accuracy against the total number of tool calls for every
method: a confidence thresholded at tau (their sweep: 0.1-0.9) and the prompt-only modes (force /
default / necessary / sparse / no tool), each with and without reason-then-act. Our measures, per
query i with label y_i (1 = needs a tool, from the no-tool run) and action a_i (1 = tool side):

- ``total_tool_calls`` = sum of c_i, with c_i the tool calls made on i: the executed calls of its
  always-search trajectory when that ran (``run_search``), else 1 per tool-side query (the first
  call the decision commits to), 0 on the no-tool side;
- ``accuracy`` = mean of o_i, with o_i = 1 - y_i on the no-tool side (the no-tool run got it right
  exactly when it needed no tool) and o_i = s_i on the tool side: the search trajectory's grounded
  success when it ran, else 1 (the tool is *assumed* to solve it; the report says which);
- ``unnecessary_tool_calls`` = sum of c_i over y_i = 0; ``missed_tool_calls`` = #{y_i = 1, a_i = 0};
- ``reasoning_tokens`` (baselines): tokens the reply spends before its first action (the text
  before its first code block; a reply without one spends all its tokens and never acts).

A baseline's action is read from one first reply to the policy prompt with the mode's sentence
after the request (``prompts/mode_<mode>.txt``, ``mode_reason.txt`` / ``mode_direct.txt``): the
tool side when its code calls one of the offered functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from codetool import prompts
from codetool.decide.probe import auroc, auroc_interval
from codetool.search.prompt import parse_candidate, policy_messages

MODES = ("force", "default", "necessary", "sparse", "no_tool")
REASONING = ("direct", "reason")
DEFAULT_THRESHOLDS = tuple(round(0.1 * k, 1) for k in range(1, 10))


def tradeoff_point(labels: Sequence[int], tool_side: Sequence[int], tool_calls: Sequence[int] | None = None,
                   tool_ok: Sequence[float] | None = None) -> dict[str, Any]:
    """The trade-off measures of one set of actions (definitions in the module docstring).

    Args:
        labels (`Sequence[int]`): (n,) 1 = needs a tool.
        tool_side (`Sequence[int]`): (n,) 1 = acted with a tool.
        tool_calls (`Sequence[int]`, *optional*): (n,) calls made when on the tool side (default 1 each).
        tool_ok (`Sequence[float]`, *optional*): (n,) success in [0, 1] when on the tool side (default 1).
    Returns:
        ``n``, ``accuracy``, ``total_tool_calls``, ``tool_calls_per_query``, ``unnecessary_tool_calls``,
        ``missed_tool_calls``, ``tool_side``.
    """
    n = len(labels)
    calls = [(tool_calls[i] if tool_calls is not None else 1) if a else 0 for i, a in enumerate(tool_side)]
    ok = [(tool_ok[i] if tool_ok is not None else 1.0) if a else 1.0 - y
          for i, (y, a) in enumerate(zip(labels, tool_side, strict=True))]
    return {"n": n, "accuracy": sum(ok) / n if n else None, "total_tool_calls": sum(calls),
            "tool_calls_per_query": sum(calls) / n if n else None,
            "unnecessary_tool_calls": sum(c for c, y in zip(calls, labels) if not y),
            "missed_tool_calls": sum(1 for y, a in zip(labels, tool_side) if y and not a),
            "tool_side": sum(1 for a in tool_side if a)}


def method_summary(labels: Sequence[int], p_tool: Sequence[float], thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                   *, tool_calls: Sequence[int] | None = None, tool_ok: Sequence[float] | None = None,
                   samples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """AUROC of ``p_tool`` against ``labels`` with its bootstrap 95% interval, and the trade-off at
    each threshold (tool side iff ``p_tool >= t``)."""
    ci = auroc_interval(p_tool, labels, samples=samples, seed=seed)
    value = auroc(p_tool, labels)
    return {"auroc": None if value != value else value, "auroc_ci95": list(ci) if ci else None,
            "sweep": [{"t": t, **tradeoff_point(labels, [int(p >= t) for p in p_tool], tool_calls, tool_ok)}
                      for t in thresholds]}


def mode_messages(query: str, env, mode: str, reasoning: str, step_format: str = "code_only") -> list[dict[str, str]]:
    """The policy's first-step prompt with a prompt-only mode's sentence and the reasoning sentence."""
    extra = prompts.load(f"mode_{mode}").strip() + "\n" + prompts.load(f"mode_{reasoning}").strip()
    return policy_messages(f"{query}\n\n{extra}", env.render(), [], step_format=step_format)


def first_action(text: str, names: Sequence[str]) -> tuple[bool, str]:
    """``(tool side, text before the first action)`` of a reply: the tool side when its first code
    block calls one of ``names``; the text before that block (all of it when there is none)."""
    fence = (text or "").find("```")
    before = text if fence < 0 else text[:fence]
    code = parse_candidate(text).code or ""
    called = any(re.search(rf"(?<![\w.]){re.escape(n)}\s*\(", code) for n in names)
    return called, before


def run_baselines(policy, prompts_by_mode: dict[tuple[str, str], list], names: Sequence[Sequence[str]], *,
                  max_new_tokens: int = 64, seed: int | None = 0, count_tokens=None) -> dict[tuple[str, str], list[dict]]:
    """One greedy first reply per query and mode; per query ``tool`` (bool), ``reasoning_tokens``,
    ``completion_tokens``.

    Args:
        prompts_by_mode (`dict`): ``(mode, reasoning) -> prompts`` (one per query, from :func:`mode_messages`).
        names (`Sequence[Sequence[str]]`): the function names offered to each query.
        count_tokens (`Callable[[str], int]`, *optional*): tokens of a text (default: whitespace words).
    """
    count = count_tokens or (lambda s: len(s.split()))
    out = {}
    for key, batch in prompts_by_mode.items():
        replies = policy.generate(batch, n=1, temperature=0.0, max_new_tokens=max_new_tokens, seed=seed)
        rows = []
        for [c], offered in zip(replies, names, strict=True):
            tool, before = first_action(c.text, offered)
            rows.append({"tool": tool, "reasoning_tokens": count(before) if before.strip() else 0,
                         "completion_tokens": c.completion_tokens})
        out[key] = rows
    return out


def baseline_summary(labels: Sequence[int], runs: dict[tuple[str, str], list[dict]]) -> list[dict[str, Any]]:
    """Per prompt-only mode: the trade-off point and the mean reasoning tokens before the first action."""
    rows = []
    for (mode, reasoning), per_query in runs.items():
        n = max(1, len(per_query))
        rows.append({"mode": mode, "reasoning": reasoning,
                     **tradeoff_point(labels, [int(r["tool"]) for r in per_query]),
                     "reasoning_tokens_per_query": sum(r["reasoning_tokens"] for r in per_query) / n,
                     "completion_tokens_per_query": sum(r["completion_tokens"] for r in per_query) / n})
    return rows


def plot_tradeoff(necessity: dict[str, Any], path) -> None:
    """``decision_tradeoff.png``: accuracy against total tool calls, one line per method over its
    thresholds, one marker per prompt-only baseline (filled: direct, hollow: reason-then-act)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.4))
    for name, summary in necessity["methods"].items():
        pts = summary["sweep"]
        auc = summary["auroc"]
        label = f"{name} (AUROC {auc:.2f})" if auc is not None else name
        ax.plot([p["total_tool_calls"] for p in pts], [100 * p["accuracy"] for p in pts], marker="o", ms=3, label=label)
        for p in pts[:: max(1, len(pts) // 3)]:
            ax.annotate(f"{p['t']:.1f}", (p["total_tool_calls"], 100 * p["accuracy"]), fontsize=6,
                        textcoords="offset points", xytext=(3, 3))
    markers = dict(zip(MODES, "s^DvP"))
    for row in necessity.get("baselines") or []:
        style: dict[str, Any] = {"color": "k"} if row["reasoning"] == "direct" else {"facecolors": "none", "edgecolors": "k"}
        ax.scatter([row["total_tool_calls"]], [100 * row["accuracy"]], marker=markers.get(row["mode"], "o"),
                   label=f"prompt: {row['mode']} ({row['reasoning']})", **style)
    ax.set(xlabel="total tool calls", ylabel="accuracy (%)",
           title=f"accuracy against tool calls, {necessity['n']} held-out queries")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
