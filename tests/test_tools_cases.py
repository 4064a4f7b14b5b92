"""Every field case of ``../shared/cases/tools.jsonl`` has a test (named in its docstring)."""

from __future__ import annotations

import ast
import json
from pathlib import Path


def _documented_cases() -> set[str]:
    found = set()
    for path in Path(__file__).parent.glob("test_tools_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = ast.get_docstring(node) or ""
                if doc.startswith("Field case "):
                    found.add(doc[len("Field case "):].split(":")[0].strip())
    return found


def test_every_tools_case_has_a_test(shared_cases):
    cases = [json.loads(line) for line in (shared_cases / "tools.jsonl").read_text().splitlines() if line.strip()]
    ids = {case["id"] for case in cases}
    assert len(ids) == 10
    assert ids - _documented_cases() == set()
