"""codetool.cli: ``--help`` of the commands whose configs extend TRL's (train-prm, train-policy)
comes from their options kept as JSON after the first build (< 2 s instead of 6-15 s), with the
same flags and text; the cache's file name follows what the options depend on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codetool import cli

REPO = Path(__file__).resolve().parents[1]


def _help(name: str, cache: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "codetool.cli", name, "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=300, env={**os.environ, "CODETOOL_CACHE_DIR": str(cache), "COLUMNS": "100"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out, time.perf_counter() - start


def _flags(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_train_prm_help_is_fast_from_the_second_time_on_with_the_same_flags(tmp_path, monkeypatch):
    first, _ = _help("train-prm", tmp_path)
    assert len(list((tmp_path / "help").glob("train-prm-*.json"))) == 1
    second, seconds = _help("train-prm", tmp_path)
    assert second.stdout == first.stdout
    assert seconds < 2.0, f"cached --help took {seconds:.2f} s"
    monkeypatch.setenv("COLUMNS", "100")
    config_cls, _ = cli._load("train-prm")
    real = cli._command_parser("train-prm", config_cls)
    assert real.format_help() == second.stdout
    kept = cli._parser_from_options("train-prm", cli._parser_options(real))
    assert _flags(kept) == _flags(real) and {"--optim", "--share_prefix", "--epochs", "--format.max_length",
                                               "--log-level", "--debug", "--config"} <= _flags(real)


def test_a_slow_help_is_kept_and_printed_the_next_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CODETOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cli, "HELP_CACHE_MIN_S", 0.0)  # as if building it were slow
    with pytest.raises(SystemExit) as stop:
        cli.main(["build-trees", "--help"])
    assert stop.value.code == 0
    built = capsys.readouterr().out
    assert "--max_depth" in built
    loaded = []
    monkeypatch.setattr(cli, "_load", loaded.append)  # the cached --help must not load the command
    assert cli.main(["build-trees", "--help"]) == 0
    assert capsys.readouterr().out == built and not loaded


def test_a_quick_help_is_not_kept_and_a_broken_cache_file_is_built_afresh(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CODETOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cli, "HELP_CACHE_MIN_S", 1e9)
    with pytest.raises(SystemExit):
        cli.main(["score", "--help"])
    assert not (tmp_path / "help").exists()
    good = capsys.readouterr().out
    broken = cli._help_cache_file("score")
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    with pytest.raises(SystemExit):
        cli.main(["score", "--help"])
    assert capsys.readouterr().out == good


def test_the_cache_file_follows_the_library_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("CODETOOL_CACHE_DIR", str(tmp_path))
    first = cli._help_cache_file("run")
    assert first.parent == tmp_path / "help" and first.name.startswith("run-")
    assert cli._help_cache_file("run") == first
    monkeypatch.setattr(cli, "HELP_DEPENDENCIES", ("transformers", "no-such-dist"))
    assert cli._help_cache_file("run") != first


def test_an_unwritable_cache_folder_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cli._keep_options(blocker / "help" / "x.json", cli._top_parser())  # no error
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_s_kept_options_give_its_help_and_flags(name):
    config_cls, _ = cli._load(name)
    real = cli._command_parser(name, config_cls)
    kept = cli._parser_from_options(name, json.loads(json.dumps(cli._parser_options(real))))
    assert _flags(kept) == _flags(real)
    assert kept.format_help() == real.format_help()
