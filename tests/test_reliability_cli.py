"""Bad command-line input (issue 19): a one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os

import pytest

from codetool.cli import main
from codetool.jsonl import read_jsonl

API = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
       "required_parameters": [], "optional_parameters": [], "method": "GET"}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bin").write_bytes(bytes(range(256)) * 2)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "blank.json").write_text(json.dumps([{"query_id": 1, "query": "", "api_list": [API]}]))
    (tmp_path / "q.json").write_text(json.dumps([{"query_id": 1, "query": "q", "api_list": [API]}]))
    (tmp_path / "prm.jsonl").write_text('{"query": "q", "label": 1}\n')
    (tmp_path / "torn.jsonl").write_text('{"query": "q", "label": 1}\n{"que')
    (tmp_path / "deep.json").write_text("[" * 5000 + "]" * 5000)
    return tmp_path


CASES = [
    ("run --config {t}/bin --benchmark toolbench --queries {t}/q.json", "not a YAML text file"),
    ("run --query q --tools {t}/bin", "does not parse as JSON"),
    ("run --query q --tools {t}/deep.json", "nested too deeply"),
    ("run --query q --tools {t}/dir", "is a folder; pass a file"),
    ("run --benchmark toolbench --queries {t}/q.json --output {t}/dir", "is a folder"),
    ("run --benchmark toolbench --queries {t}/q.json --limit -1", "--limit >= 1"),
    ("run --benchmark toolbench --queries {t}/q.json --limit 0", "--limit >= 1"),
    ("run --benchmark toolbench --queries {t}/q.json --offset -1 --limit 2", "--offset must be >= 0"),
    ("run --benchmark toolbench --queries {t}/q.json --offset 5", "skips all 1 queries"),
    ("run --benchmark stabletoolbench --subset nosuch", "--subset 'nosuch'"),
    ("run --benchmark restbench-tmdb --subset full", "--subset 'full'"),
    ("run --benchmark toolbench --queries {t}/q.json --search.temperature nan", "finite"),
    ("run --benchmark toolbench --queries {t}/q.json --search.max_steps -3", "search.max_steps must be >= 1, got -3"),
    ("run --benchmark toolbench --queries {t}/q.json --search.max_new_tokens 0", "search.max_new_tokens must be >= 1"),
    ("run --benchmark toolbench --queries {t}/empty.json", "is an empty list, not a query file"),
    # found before the policy is loaded (it used to search for an answer to "" with the model)
    ("run --benchmark toolbench --queries {t}/blank.json", "not one of the 1 selected entries is a query"),
    ("build-trees --queries {t}/q.json --output {t}/dir", "is a folder"),
    ("build-trees --queries {t}/q.json --limit -2", "--limit must be >= 1"),
    ("eval {t}/prm.jsonl --out {t}/rep", "not a trajectory file"),
    ("score {t}/torn.jsonl --prm {t}/dir", "not JSON objects"),
    ("score {t}/dir --prm {t}/dir", "not found"),
    ("train-prm --dataset {t}/torn.jsonl --output_dir {t}/out", "not JSON objects"),
    ("serve-prm --request_timeout_s nan", "request_timeout_s must be > 0"),
    ("serve-prm --max_history_steps 0", "max_history_steps must be >= 1"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[c[0].split(" {t}")[0][:40] + f"-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_and_nonzero(files, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(files)
    status = main(argv.format(t=files).split())
    err = capsys.readouterr().err.strip()
    assert status != 0
    assert "Traceback" not in err
    assert message in err.splitlines()[-1] and err.splitlines()[-1].startswith("codetool "), err


def test_whitespace_key_refused_by_serve_prm(files, capsys, monkeypatch):
    monkeypatch.setenv("CODETOOL_PRM_API_KEY", "   ")
    assert main(["serve-prm", "--prm", str(files / "dir")]) == 2
    assert "empty or whitespace" in capsys.readouterr().err


def test_malformed_api_entry_fails_only_its_query(files, capsys, monkeypatch):
    import codetool.assemble as assemble
    from codetool.models.backends import ScriptedBackend

    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: ScriptedBackend(lambda p: "finish('ok')\n```"))
    bad = [{"query_id": 1, "query": "q1", "api_list": [API, "oops"]}, {"query_id": 2, "query": "q2", "api_list": [API]},
           {"query_id": 3, "query": " \n", "api_list": [API]}]
    (files / "bad.json").write_text(json.dumps(bad))
    out = files / "o.jsonl"
    args = ["run", "--benchmark", "toolbench", "--queries", str(files / "bad.json"), "--output", str(out),
            "--executor.isolation", "fallback", "--search.max_steps", "1", "--search.k", "1"]
    assert main(args) == 1
    records = {r["query_id"]: r for r in read_jsonl(out)}
    assert records["1"]["finish_type"] == "error" and "malformed query entry" in records["1"]["error"]
    assert records["2"]["finish_type"] == "finish"
    assert records["3"]["finish_type"] == "error" and "not a question to answer" in records["3"]["error"]
    assert not os.path.exists(str(out) + ".lock")  # the run removed its lock file when it ended


def test_a_blank_query_is_refused(files, capsys):
    assert main(["run", "--query", "  \t", "--tools", str(files / "q.json")]) != 0
    assert "give the question to answer" in capsys.readouterr().err
