"""LIT tool costs by hand: P + D + C per API, model-backed APIs, overrides and the code cost."""

from __future__ import annotations

import math

import pytest

from codetool import CodetoolError
from codetool.rewards import DYNAMIC_LINES, ToolCostTable, code_cost, step_cost
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


# ------------------------------------------------------------- packing cannot lower the cost (issue 37)
PROGRAM = """import json
import math
import statistics
data = json.loads('[1, 2, 3, 4]')
mean = statistics.mean(data)
spread = statistics.pstdev(data)
root = math.sqrt(mean)
print(mean, spread, root)
"""


def test_the_issues_program_costs_what_it_did_before():
    # 8 lines, 3 packages: the figure of the issue (6.00 with its own program) is sqrt(n) * 3 * 0.5
    assert code_cost(PROGRAM) == pytest.approx(math.sqrt(8) * 3 * 0.5)


@pytest.mark.parametrize("packed", [
    f"exec({PROGRAM!r})",
    f"exec(compile({PROGRAM!r}, 'step', 'exec'))",
    f"source = {PROGRAM!r}\nexec(source)",
    f"exec({PROGRAM[:60]!r} + {PROGRAM[60:]!r})",
    "; ".join(line for line in PROGRAM.splitlines() if line),   # one long line
    f"import builtins\nbuiltins.exec({PROGRAM!r})",
])
def test_packing_the_program_never_lowers_its_cost(packed):
    assert code_cost(packed) >= code_cost(PROGRAM)


def test_one_long_line_counts_its_statements_and_walrus_chains():
    assert code_cost("a = 1; b = 2; c = 3; d = 4") == pytest.approx(1.0)  # 4 statements, as 4 lines
    assert code_cost("(a := 1, b := 2, c := 3, d := 4)") == pytest.approx(math.sqrt(5) * 0.5)
    # an honest multi-line statement keeps its lines (the paper's count)
    assert code_cost("x = {\n  'a': 1,\n  'b': 2,\n}") == pytest.approx(math.sqrt(4) * 0.5)


def test_imports_reached_dynamically_count_as_packages():
    assert code_cost("j = __import__('json')\nm = __import__('math')") == pytest.approx(math.sqrt(2) * 2 * 0.5)
    assert code_cost("import importlib\nj = importlib.import_module('json')") == pytest.approx(math.sqrt(2) * 2 * 0.5)


@pytest.mark.parametrize("dynamic", [
    "import base64\nexec(base64.b64decode('cHJpbnQoMSk='))",   # code the cost model cannot read
    "e = exec\ne('print(1)')",                                  # an alias of exec
    "name = 'js' + input()\nm = __import__(name)",
    "getattr(__builtins__, 'ex' + 'ec')('print(1)')",
    "().__class__.__base__.__subclasses__()",
    "g = finish.__globals__",
])
def test_code_it_cannot_read_is_charged_the_dynamic_penalty(dynamic):
    assert code_cost(dynamic) >= math.sqrt(1 + DYNAMIC_LINES) * 2 * 0.5


def test_honest_uses_of_like_named_functions_cost_as_before():
    assert code_cost("import re\np = re.compile(pattern)\nprint(p)") == pytest.approx(math.sqrt(3) * 0.5)
    assert code_cost("name = type(x).__name__\nprint(name)") == pytest.approx(math.sqrt(2) * 0.5)
    assert code_cost("v = getattr(r, 'title', None)") == pytest.approx(0.5)


@pytest.mark.parametrize("packed", [
    f"from builtins import exec as run\nrun({PROGRAM!r})",        # exec under another name
    f"import builtins as b\nb.exec({PROGRAM!r})",                  # builtins under another name
    f"import builtins as b\nb.eval(b.compile({PROGRAM!r}, 's', 'exec'))",
])
def test_an_import_alias_of_exec_or_builtins_is_followed(packed):
    assert code_cost(packed) >= code_cost(PROGRAM)


def test_an_import_alias_of_import_module_counts_its_package():
    assert code_cost("from importlib import import_module as im\nj = im('json')") == pytest.approx(math.sqrt(2) * 2 * 0.5)


@pytest.mark.parametrize("packed", [
    # the program in a pickle: unpickling calls builtins.exec on it
    "import pickle\npickle.loads(" + repr(b"cbuiltins\nexec\n(V" + PROGRAM.replace("\n", "\\u000a").encode() + b"\ntR.") + ")",
    "import marshal, types\ntypes.FunctionType(marshal.loads(blob), {})()",
    f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {PROGRAM!r}])",
    f"import os\nos.system('python3 -c ' + {PROGRAM!r})",
    f"from os import system\nsystem('python3 -c ' + {PROGRAM!r})",
    f"import code\ncode.InteractiveInterpreter().runsource({PROGRAM!r})",
    f"import timeit\ntimeit.timeit({PROGRAM!r}, number=1)",
    "p = __import__('pickle')\np.loads(blob)",
    f"import operator, builtins\noperator.attrgetter('exec')(builtins)({PROGRAM!r})",
    f"import importlib, operator\nb = importlib.import_module('builtins')\noperator.attrgetter('exec')(b)({PROGRAM!r})",
    f"import pydoc\npydoc.locate('builtins.exec')({PROGRAM!r})",
    f"import pkgutil\npkgutil.resolve_name('builtins:exec')({PROGRAM!r})",
])
def test_running_the_program_from_data_never_lowers_its_cost(packed):
    assert code_cost(packed) >= code_cost(PROGRAM)


def test_sys_modules_hands_out_modules_without_an_import():
    # two packages reached through sys.modules cost no less than importing them
    honest = "import json\nimport math\nprint(json.dumps(math.pi))"
    assert code_cost("import sys\njson = sys.modules['json']\nmath = sys.modules['math']\nprint(json.dumps(math.pi))") \
        >= code_cost(honest)
    assert code_cost("from sys import modules\nj = modules['json']") >= math.sqrt(1 + DYNAMIC_LINES) * 2 * 0.5


def test_honest_uses_of_os_sys_platform_and_re_compile_cost_as_plain_code():
    assert code_cost("import os\np = os.path.join('a', 'b')") == pytest.approx(math.sqrt(2) * 0.5)
    assert code_cost("import sys\nprint(sys.version)") == pytest.approx(math.sqrt(2) * 0.5)
    assert code_cost("import platform\nprint(platform.system())") == pytest.approx(math.sqrt(2) * 0.5)
    assert code_cost("from re import compile\np = compile('a+')") == pytest.approx(math.sqrt(2) * 0.5)


@pytest.mark.parametrize("rebound", [
    f"s = 'x = 1'\ns += {PROGRAM!r}\nexec(s)",                      # augmented after a harmless literal
    f"s = 'x = 1'\ns = s + chr(10) + {PROGRAM!r}\nexec(s)",          # rebound to a computed string
    f"s = {PROGRAM!r}\nif True:\n    s = 'x = 1'\nexec(s)",           # two literals: which one runs?
    f"s = 'x = 1'\nfor s in [{PROGRAM!r}]:\n    pass\nexec(s)",       # a loop target
    f"s = 'x = 1'\n(s := {PROGRAM!r})\nexec(s)",                     # a walrus
])
def test_a_name_bound_more_than_once_is_not_read_as_its_first_string(rebound):
    assert code_cost(rebound) >= code_cost(PROGRAM)
