"""PRM example rows as read (codetool.prm.rows): both layouts, validation, the split unit."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.prm.rows import is_stepwise, query_key, read_rows
from codetool.prm.synthetic import synthetic_rows


def test_read_rows_validates(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps(r) for r in synthetic_rows(1)) + "\n")
    assert len(read_rows(str(good))) == 4
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "label": 2}) + "\n")
    with pytest.raises(CodetoolError, match="0 or 1"):
        read_rows(str(bad))
    with pytest.raises(CodetoolError, match="not found"):
        read_rows(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CodetoolError, match="empty"):
        read_rows([str(empty)])


def test_query_key_prefers_the_query_id():
    assert query_key({"query_id": 7, "query": "q"}) == "7"
    assert query_key({"query": "q"}) == "q" and query_key({}) == ""


def test_a_stepwise_row_is_told_from_an_example_row():
    assert is_stepwise({"prompt": "p", "completions": ["a"], "labels": [True]})
    assert not is_stepwise({"prompt": "p", "completions": ["a"], "labels": [True], "label": 1})
    assert not is_stepwise({"query": "q", "label": 1}) and not is_stepwise(["prompt"])


def test_mixed_layouts_in_one_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    stepwise = {"prompt": "tools\n\nq", "query": "q", "completions": ["```python\nx = 1\n```\nOutput:\n1", "y"],
                "labels": [True, False]}
    path.write_text(json.dumps({"query": "q", "candidate": "z", "label": 1}) + "\n" + json.dumps(stepwise) + "\n")
    rows = read_rows(str(path))
    assert [(r["candidate"], r["label"]) for r in rows] == [("z", 1), ("x = 1", 1), ("y", 0)]
    assert rows[2]["history"] == [{"code": "x = 1", "output": "1"}] and rows[2]["tools"] == "tools"


def test_pair_ids_of_several_files_stay_apart(tmp_path):
    # two builds of one query both write the pair id "q1:1>2": read together they are two pairs
    row = {"query_id": "q1", "query": "Is book 17 on the shelf?", "history": [], "candidate": "print(1)"}
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({**row, "label": label, "pair": "q1:1>2"}) + "\n" for label in (1, 0)))
    rows = read_rows([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])
    assert [r["pair"] for r in rows] == ["0:q1:1>2", "0:q1:1>2", "1:q1:1>2", "1:q1:1>2"]
    assert [r["pair"] for r in read_rows(str(tmp_path / "a.jsonl"))] == ["q1:1>2"] * 2  # one file: as written
