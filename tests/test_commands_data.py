"""``codetool data fetch`` (codetool.commands.data): the command line, the summary and its checks."""

from __future__ import annotations

import pytest

from codetool.commands.data import DataConfig
from codetool.config import ConfigError
from codetool.tools.data import data_root


def test_cli_fetch_and_data_root(shared_data, tmp_path, monkeypatch, capsys):
    from codetool.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["data", "fetch", "restbench", "--from-dir", str(shared_data)]) == 0
    printed = capsys.readouterr().out
    assert "restbench: 3 files in data/, 0 missing" in printed
    assert data_root().resolve() == (tmp_path / "data").resolve()
    assert (tmp_path / "data" / "RestGPT" / "specs" / "tmdb_oas.json").is_file()


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset"):
        DataConfig(datasets=["imagenet"])
    with pytest.raises(ConfigError, match="the folder does not exist"):
        DataConfig(datasets=["restbench"], from_dir=str(tmp_path / "absent"))


def test_the_default_fetch_gets_what_the_benchmark_runs_read(shared_data, tmp_path, monkeypatch):
    """A bare ``codetool data fetch`` gets every dataset: after it, the default StableToolBench and
    RestBench-TMDB loaders find their files in ./data (CodeTool's query subsets and TMDB spec)."""
    from codetool.cli import main
    from codetool.tools.data import DATASETS
    from codetool.tools.loaders import load_restbench, load_stabletoolbench

    assert DataConfig().datasets == list(DATASETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CODETOOL_DATA", raising=False)
    assert main(["data", "fetch", "--from-dir", str(shared_data)]) == 0
    root = data_root()
    assert root.resolve() == (tmp_path / "data").resolve()
    assert load_stabletoolbench("G1_instruction", subset="codetool")  # CodeTool's query subsets
    assert load_restbench(source="codetool")  # CodeTool's TMDB queries and spec


def test_a_missing_benchmark_file_names_the_dataset_that_holds_it(tmp_path):
    from codetool import CodetoolError
    from codetool.tools.data import fetch_hint
    from codetool.tools.openapi import load_openapi

    spec = tmp_path / "CodeTool" / "infer" / "tmdb" / "tmdb.spec.raw.v2.json"
    assert fetch_hint(spec) == "codetool data fetch codetool"
    assert fetch_hint("x/RestGPT/specs/tmdb_oas.json") == "codetool data fetch restbench"
    assert fetch_hint(tmp_path / "elsewhere.json") == "codetool data fetch"
    with pytest.raises(CodetoolError, match="Run 'codetool data fetch codetool'"):
        load_openapi(spec)


def test_a_folder_without_the_files_is_one_line_not_a_list_of_every_file(tmp_path, capsys):
    """``data fetch codetool --from DIR`` with a folder holding none of its files (the trial's
    /nonexistent existed, empty) listed "missing: ..." nine times and exited 1."""
    from codetool.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["data", "fetch", "codetool", "--from", str(tmp_path / "empty"), "--out", str(tmp_path / "d")]) == 2
    captured = capsys.readouterr()
    assert "missing:" not in captured.out and captured.err.count("\n") == 1
    assert f"--from {tmp_path / 'empty'} holds none of the files of codetool" in captured.err
    assert main(["data", "fetch", "codetool", "--from", str(tmp_path / "absent")]) == 2
    assert f"--from {tmp_path / 'absent'}: the folder does not exist" in capsys.readouterr().err
