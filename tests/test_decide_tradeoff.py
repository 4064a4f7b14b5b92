"""When2Tool's trade-off measures on a hand-computed case, the first action of a reply, and the
prompt-only baselines with a scripted policy."""

from __future__ import annotations

import pytest

from codetool.decide.tradeoff import (
    baseline_summary,
    first_action,
    method_summary,
    mode_messages,
    plot_tradeoff,
    run_baselines,
    tradeoff_point,
)
from codetool.models.backends import ScriptedBackend

LABELS = [1, 1, 0, 0, 1]
P_TOOL = [0.9, 0.3, 0.6, 0.1, 0.7]


def test_tradeoff_point_by_hand():
    acting = [int(p >= 0.5) for p in P_TOOL]  # [1, 0, 1, 0, 1]
    point = tradeoff_point(LABELS, acting)
    # right: q1 (tool), q4 (no tool, needed none), q5 (tool); q3 (tool) right too, as the tool is assumed to
    # solve it; q2 answered without the tool it needed is wrong: 4 of 5
    assert point == {"n": 5, "accuracy": 0.8, "total_tool_calls": 3, "tool_calls_per_query": 0.6,
                     "unnecessary_tool_calls": 1, "missed_tool_calls": 1, "tool_side": 3}
    measured = tradeoff_point(LABELS, acting, tool_calls=[2, 5, 3, 9, 1], tool_ok=[1, 0, 0, 0, 0.5])
    # calls only where acting: 2 + 3 + 1; outcomes [1, 0 (missed), 0 (tool failed), 1, 0.5]
    assert measured["total_tool_calls"] == 6 and measured["unnecessary_tool_calls"] == 3
    assert measured["accuracy"] == pytest.approx(0.5)


def test_method_summary_sweeps_thresholds_and_reports_auroc():
    summary = method_summary(LABELS, P_TOOL, [0.0, 0.5, 0.95], samples=100)
    assert summary["auroc"] == pytest.approx(5 / 6)  # 5 of the 6 (necessary, unnecessary) pairs ordered right
    lo, hi = summary["auroc_ci95"]
    assert 0 <= lo <= 5 / 6 <= hi <= 1
    always, half, never = summary["sweep"]
    assert always["total_tool_calls"] == 5 and always["accuracy"] == 1.0 and always["unnecessary_tool_calls"] == 2
    assert half["t"] == 0.5 and half["accuracy"] == 0.8
    assert never["total_tool_calls"] == 0 and never["accuracy"] == 0.4 and never["missed_tool_calls"] == 3


def test_first_action_of_a_reply():
    names = ["weather_api", "news_api"]
    assert first_action("Needs data.\n```python\nr = weather_api(city='x')\nprint(r)\n```", names) == (True, "Needs data.\n")
    assert first_action("```python\nfinish('4')\n```", names) == (False, "")
    assert first_action("```python\nx = my_weather_api(1)\n```", names)[0] is False  # not an offered name
    assert first_action("The answer is 4.", names) == (False, "The answer is 4.")


class Env:
    def render(self):
        return "def weather_api(city: str): ..."


def test_baselines_with_a_scripted_policy(tmp_path):
    def reply(prompt):
        text = prompt[-1]["content"]
        if "Do not call any listed function" in text:
            return "```python\nfinish('sunny')\n```"
        prefix = "It needs live data.\n" if "whether this request needs a function" in text else ""
        return prefix + "```python\nprint(weather_api(city='Paris'))\n```"

    prompts = {(m, r): [mode_messages(q, Env(), m, r) for q in ("Weather in Paris?", "2 + 2?")]
               for m in ("force", "no_tool") for r in ("direct", "reason")}
    assert "Function calls are" not in prompts[("force", "direct")][0][1]["content"]
    runs = run_baselines(ScriptedBackend(reply), prompts, [["weather_api"]] * 2, max_new_tokens=32)
    rows = {(r["mode"], r["reasoning"]): r for r in baseline_summary([1, 0], runs)}
    assert rows[("force", "direct")]["total_tool_calls"] == 2 and rows[("force", "direct")]["accuracy"] == 1.0
    assert rows[("force", "direct")]["reasoning_tokens_per_query"] == 0
    assert rows[("force", "reason")]["reasoning_tokens_per_query"] == 4  # "It needs live data." in words
    assert rows[("no_tool", "direct")]["total_tool_calls"] == 0 and rows[("no_tool", "direct")]["accuracy"] == 0.5
    necessity = {"n": 5, "methods": {"probe": method_summary(LABELS, P_TOOL, [0.5], samples=20)},
                 "baselines": list(rows.values())}
    plot_tradeoff(necessity, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
