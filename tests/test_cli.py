"""codetool.cli: ``--help`` of the commands whose configs extend TRL's (train-prm, train-policy)
comes from their options kept as JSON after the first build (< 2 s instead of 6-15 s), with the
same flags and text; the cache's file name follows what the options depend on."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize("level", ["debug", "DEBUG", "Warning"])
def test_log_level_takes_any_case(level, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_configure_logging", lambda value: seen.setdefault("level", value))
    monkeypatch.setattr(cli, "_load", lambda name: (dataclasses.make_dataclass("Cfg", []), lambda cfg: 0))
    monkeypatch.setattr(cli, "add_arguments", lambda parser, cls: None)
    monkeypatch.setattr(cli, "config_from_args", lambda cls, args, sections=None: None)
    assert cli.main(["score", "--log-level", level]) == 0
    assert seen["level"] == level.upper()


def test_a_bad_log_level_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["score", "--log-level", "loud"])
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["run", "build-trees", "train-prm"])
def test_a_pipeline_recipe_given_to_another_command_says_so(name, capsys):
    recipe = REPO / "configs" / "pipeline" / "quickstart.yaml"
    assert cli.main([name, "--config", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"codetool {name}: error: {recipe} is a pipeline recipe (top-level keys ")
    assert f"use `codetool pipeline --config {recipe}`" in err and "\n" not in err


def test_an_unknown_key_of_a_command_s_own_recipe_is_still_named(tmp_path, capsys):
    recipe = tmp_path / "run.yaml"
    recipe.write_text("benchmark: stabletoolbench\nnot_a_key: 1\n")
    assert cli.main(["run", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'not_a_key'" in err and "pipeline" not in err


@pytest.mark.parametrize("words", [["search", "eval"], ["search,eval"], ["search,", "eval"]])
def test_a_list_option_takes_space_or_comma_separated_values(monkeypatch, words):
    """Before (issue 40): `--stages search eval` failed with `unknown option 'eval'`."""
    from codetool import cli

    seen = {}
    config_cls, _ = cli._load("pipeline")
    monkeypatch.setattr(cli, "_load", lambda name: (config_cls, lambda cfg: seen.setdefault("cfg", cfg) and 0))
    assert cli.main(["pipeline", "--stages", *words, "--seeds", "0", "1", "--name", "x"]) == 0
    assert seen["cfg"].stages == ["search", "eval"] and seen["cfg"].seeds == [0, 1]
