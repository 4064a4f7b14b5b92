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
    with pytest.raises(ConfigError, match="no such folder"):
        DataConfig(datasets=["restbench"], from_dir=str(tmp_path / "absent"))
