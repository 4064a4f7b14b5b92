"""codetool.cli: ``--help`` without a cache of its own and without importing torch (a command whose
config extends TRL's shows its own options from a light class, ``--help-all`` every option), the
one-line error for a key renamed in 0.2.0, the log level, and a recipe given to the wrong command."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codetool import cli
from codetool.config import section_class

REPO = Path(__file__).resolve().parents[1]


# train-policy's config still declares its fields on TRL's GRPOConfig: its light class comes with the
# config groups' split (issue 42, phase B), after the branches that edit that config land.
HEAVY_HELP = {"train-policy"}


def _flags(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_no_command_s_help_imports_a_heavy_library():
    """``--help`` builds each parser from classes that import no torch, TRL or transformers (the
    commands whose configs extend TRL's describe their own options with a light class)."""
    names = [n for n in cli.COMMANDS if n not in HEAVY_HELP]
    code = ("import sys\nfrom codetool.cli import main\n"
            f"for name in {names!r}:\n    try:\n        main([name, '--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_help_keeps_nothing_and_reads_nothing_outside_the_package(tmp_path, monkeypatch, capsys):
    """No cache of its own: ``--help`` writes no file and a planted one changes nothing."""
    for var in ("CODETOOL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.setenv(var, str(tmp_path))
    planted = tmp_path / "help" / "train-prm-planted.json"
    planted.parent.mkdir()
    planted.write_text('[{"flags": ["--spoofed"], "dest": "x", "help": "100%"}]')
    with pytest.raises(SystemExit) as stop:
        cli.main(["train-prm", "--help"])
    assert stop.value.code == 0
    shown = capsys.readouterr().out
    assert "--share_prefix" in shown and "--spoofed" not in shown
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "help", "help/train-prm-planted.json"]


def test_train_prm_s_help_lists_its_own_options_and_names_trl_s():
    parser = cli._help_parser("train-prm")
    shown = parser.format_help()
    assert {"--share_prefix", "--format.max_length", "--learning_rate", "--lora_r", "--config", "--debug",
            "--log-level"} <= _flags(parser)
    assert "--optim" not in _flags(parser) and "SFTConfig" in shown and "--help-all" in shown


def test_a_light_help_class_is_the_full_config_s_own_part():
    """The options ``--help`` shows for a command whose config extends a library's are the full
    config's own, with the same help text and default; the full parser adds exactly the library's."""
    for name, target in cli.LIGHT_HELP.items():
        light = section_class(target)
        full, _ = cli._load(name)
        assert issubclass(full, light), name
        mine = {f.name: f for f in dataclasses.fields(light)}
        theirs = {f.name: f for f in dataclasses.fields(full)}
        for key, f in mine.items():
            assert theirs[key].metadata == f.metadata and theirs[key].default == f.default, f"{name}: {key}"
        library = {f.name for base in full.__mro__[1:] if dataclasses.is_dataclass(base)
                   and not base.__module__.startswith("codetool.") for f in dataclasses.fields(base)}
        assert set(theirs) - set(mine) <= library, name
        real = cli._command_parser(name, full)
        assert _flags(cli._help_parser(name)) - {"--help-all"} <= _flags(real)


def test_help_all_shows_the_library_s_options_too(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train-prm", "--help-all"])
    shown = capsys.readouterr().out
    assert "--optim" in shown and "--share_prefix" in shown


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_s_help_formats(name):
    """Every help text formats (a ``%`` in one would crash argparse) and lists the config's keys."""
    config_cls, _ = cli._load(name)
    shown = cli._command_parser(name, config_cls).format_help()
    assert shown.startswith(f"usage: codetool {name}") and "--config" in shown
    assert cli._help_parser(name).format_help().startswith(f"usage: codetool {name}")


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_option_s_help_shows_one_default(name):
    """A help text that says its default in words gets no second ``[default: ...]`` (serve-mock
    --queries showed "[default: the six test groups] [default: none]")."""
    config_cls, _ = cli._load(name)
    for action in cli._command_parser(name, config_cls)._actions:
        assert (action.help or "").count("default:") <= 1, (name, action.option_strings, action.help)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_an_empty_config_stops_every_command_with_one_line(name, tmp_path, capsys, monkeypatch):
    """``--config empty.yaml`` used to start the command with every default (``pipeline``: a full
    default run); docs/LONG_JOBS.md "Bad input" says an empty file stops the command."""
    monkeypatch.chdir(tmp_path)  # the old code wrote its default outputs (runs/, data/) here
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("# nothing yet\n")
    assert cli.main([name, "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"codetool {name}: error: {recipe}: the recipe is empty"), err


def test_a_mistyped_option_shows_every_close_option(capsys):
    """``--querys`` suggested only ``--query``; ``--queries`` is as close."""
    assert cli.main(["run", "--querys", "q.json"]) == 2
    assert ("unknown option '--querys' for 'codetool run'. Did you mean '--query' or '--queries'? Run 'codetool "
            "run --help' for the options.") in capsys.readouterr().err
    assert cli.main(["run", "--polcy", "x"]) == 2
    assert "Did you mean '--policy'? Run" in capsys.readouterr().err


# ---- 0.2.0 renamed keys: one line naming the new key

@pytest.mark.parametrize(("argv", "said"), [
    (["train-prm", "--epochs", "2"], "--epochs was renamed to --num_train_epochs in 0.2.0 (docs/MIGRATING.md)"),
    (["train-prm", "--batch-size=3"], "--batch_size was renamed to --per_device_train_batch_size in 0.2.0"),
    (["pipeline", "--train.warmup", "5"], "train.warmup was renamed to train.warmup_steps in 0.2.0 (docs/MIGRATING.md)"),
])
def test_an_old_flag_is_refused_naming_the_new_one(argv, said, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_the_never_read_routing_switch_is_refused_naming_run_s(capsys):
    assert cli.main(["run", "--benchmark", "stabletoolbench", "--routing.enabled", "true"]) == 2
    assert ("--routing.enabled was removed in 0.2.0: it turned nothing on; codetool run --router routes queries "
            "through the decision stage (docs/MIGRATING.md).") in capsys.readouterr().err


def test_an_old_recipe_key_is_refused_naming_the_new_one(tmp_path, capsys):
    recipe = tmp_path / "train.yaml"
    recipe.write_text("epochs: 2\n")
    assert cli.main(["train-prm", "--config", str(recipe)]) == 2
    assert "epochs was renamed to num_train_epochs in 0.2.0 (docs/MIGRATING.md)" in capsys.readouterr().err
    recipe.write_text("train:\n  trainer_options: {optim: sgd}\n")
    assert cli.main(["pipeline", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "train.trainer_options was removed in 0.2.0: give its keys directly in train" in err


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


@pytest.mark.parametrize("argv, after", [(["serve-prm"], "stopped."), (["pipeline", "--name", "x"], "finished work is saved and a rerun resumes.")])
def test_sigterm_says_what_it_leaves(monkeypatch, capsys, argv, after):
    """A server stopped by SIGTERM has nothing to resume (serve-prm said 'a rerun resumes')."""
    config_cls, _ = cli._load(argv[0])

    def terminated(cfg):
        raise cli.Terminated()

    monkeypatch.setattr(cli, "_load", lambda _: (config_cls, terminated))
    assert cli.main(argv) == 143
    assert capsys.readouterr().err.strip().endswith(f"terminated (SIGTERM); {after}")


@pytest.mark.parametrize("given, kept", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_wait_asleep_unless_the_user_said_otherwise(given, kept, monkeypatch, capsys):
    """A command sets ``OMP_WAIT_POLICY=PASSIVE`` before any command imports torch (spinning OpenMP
    threads cost 3-4x the CPU per decoding step on a shared machine, docs/TESTBED.md 5.1); a value
    the user set stays."""
    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    assert cli.main(["no-such-command"]) == 2
    assert os.environ["OMP_WAIT_POLICY"] == kept
