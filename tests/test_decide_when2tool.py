"""The When2Tool task loader, on files written here in both of their layouts."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.decide.when2tool import load_when2tool

REPO_LAYOUT = [
    {"id": "calc_easy_0", "difficulty": "easy", "multi_step": False, "instruction": "Compute 17 * 23.",
     "environments": [{"name": "CalculatorEnv", "tools": ["evaluate_expression", "get_last_result"], "parameters": {}}],
     "expected": {"answer": "391"}, "tags": ["arithmetic"]},
    {"id": "dt_hard_3", "difficulty": "hard", "multi_step": True,
     "dialog": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What weekday is 2024-02-29?"}],
     "environments": [{"name": "DateTimeEnv", "tools": ["weekday"], "parameters": {"tz": "UTC"}}],
     "expected": {"answer": "Thursday", "steps": ["weekday"]}},
]
HUB_ROW = {"id": "hash_medium_1", "difficulty": "medium", "multi_step": False, "instruction": "sha1 of 'abc'?",
           "env_name": "HashEnv", "tools": json.dumps(["sha1"]), "parameters": "{}", "answer": "a9993e36",
           "tags": "[]", "steps": "[]"}
CALCULATOR_SCHEMAS = [{"name": "evaluate_expression", "description": "Evaluate an arithmetic expression.",
                       "parameters": {"type": "object", "properties": {"expression": {"type": "string",
                                      "description": "the expression"}}, "required": ["expression"]}}]


def test_repository_layout_with_tool_schemas(tmp_path):
    (tmp_path / "tasks.json").write_text(json.dumps(REPO_LAYOUT))
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "CalculatorEnv.json").write_text(json.dumps(CALCULATOR_SCHEMAS))
    calc, date = load_when2tool(tmp_path / "tasks.json", tmp_path / "envs")
    assert (calc.item_id, calc.query, calc.answer, calc.group, calc.category) == (
        "w2t-calc_easy_0", "Compute 17 * 23.", "391", "CalculatorEnv", "easy")
    assert calc.benchmark == "when2tool" and calc.gold == [] and not calc.needs_tool
    expr, last = calc.apis
    assert expr.api == "evaluate_expression" and expr.description.startswith("Evaluate")
    assert [(p.name, p.required) for p in expr.parameters] == [("expression", True)]
    assert last.description == "" and last.parameters == []  # no schema for it in the folder
    assert date.query == "What weekday is 2024-02-29?" and date.answer == "Thursday"


def test_hub_rows_as_json_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(HUB_ROW) + "\n")
    [row] = load_when2tool(path)
    assert row.item_id == "w2t-hash_medium_1" and row.group == "HashEnv" and [a.api for a in row.apis] == ["sha1"]


def test_bad_files_say_what_is_wrong(tmp_path):
    with pytest.raises(CodetoolError, match="not found"):
        load_when2tool(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps([{"id": "x", "instruction": "hi"}]))
    with pytest.raises(CodetoolError, match="needs id, instruction"):
        load_when2tool(tmp_path / "bad.json")
