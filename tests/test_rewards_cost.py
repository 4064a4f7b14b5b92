"""LIT tool costs by hand: P + D + C per API, model-backed APIs, overrides and the code cost."""

from __future__ import annotations

import math

import pytest

from codetool import CodetoolError
from codetool.rewards import ToolCostTable, code_cost, step_cost
from codetool.tools.spec import APISpec, Parameter


def _api(tool="weather", api="current", category="Data", required=2, optional=1):
    params = [Parameter(f"r{i}", "string", required=True) for i in range(required)]
    params += [Parameter(f"o{i}", "string", required=False) for i in range(optional)]
    return APISpec(category=category, tool=tool, api=api, description="", parameters=params)


def test_packaged_table_p_plus_d_plus_c():
    table = ToolCostTable.load()
    # P 1 + D 1 + C (1 + 2 * 0.25 + 1 * 0.05)
    assert table.api_cost(_api()) == pytest.approx(3.55)
    assert table.api_cost(_api(required=0, optional=0)) == pytest.approx(3.0)
    # model-backed by category: P 2 + D 2.5 + C (1 + 0.25)
    assert table.api_cost(_api(category="Translation", required=1, optional=0)) == pytest.approx(5.75)
    # model-backed by a name keyword ("caption")
    assert table.api_cost(_api(tool="ImageCaptioner", required=0, optional=0)) == pytest.approx(5.5)


def test_overrides_tool_then_tool_api():
    table = ToolCostTable({"defaults": {"P": 1, "D": 1, "C": 1},
                           "overrides": {"weather": {"P": 3}, "weather/current": {"C": 0.5}}})
    assert table.api_cost(_api(api="current")) == pytest.approx(3 + 1 + 0.5)
    assert table.api_cost(_api(api="forecast")) == pytest.approx(3 + 1 + 1)   # tool override only
    assert table.api_cost(_api(tool="news")) == pytest.approx(3.0)


def test_code_cost_sqrt_lines_times_packages_times_half():
    code = "import math\nimport os.path\nfrom json import dumps\n# a comment\n\nx = math.pi\nprint(dumps(x))\n"
    # 5 counted lines, 3 packages (math, os, json)
    assert code_cost(code) == pytest.approx(math.sqrt(5) * 3 * 0.5)
    assert code_cost("a = 1\nb = 2\nc = 3\nd = 4") == pytest.approx(1.0)  # no import counts as 1
    assert code_cost("from . import x\nimport os\nimport os") == pytest.approx(math.sqrt(3) * 1 * 0.5)
    assert code_cost("def broken(:\n  pass") == pytest.approx(math.sqrt(2) * 0.5)
    assert code_cost("") == 0.0


def test_step_cost_counts_every_call(tmp_path):
    table = ToolCostTable.load()
    api = _api(required=0, optional=0)
    assert step_cost("x = 1", [api, api], table) == pytest.approx(0.5 + 2 * 3.0)
    with pytest.raises(CodetoolError, match="not found"):
        ToolCostTable.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("overrides: {}\n")
    with pytest.raises(CodetoolError, match="defaults"):
        ToolCostTable.load(tmp_path / "bad.yaml")
