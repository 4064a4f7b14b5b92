"""``codetool.prm.config.PRMConfig``: one config for ``train-prm`` and the pipeline's ``train`` section.

The section used to be its own ``TrainConfig`` (36 keys mirroring ``PRMConfig``); its names still
work for one release, each with one deprecation line, mean what they meant, and give the same train
stage hash (``PRMConfig.stage_settings``, written with the old names).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from codetool.config import ConfigError, config_hash, from_dict, load_config, load_yaml
from codetool.jobs.pipeline import PipelineConfig, stage_hashes, train_config
from codetool.prm.config import ALIASES, LEGACY_KEYS, PRMConfig
from codetool.prm.format import PRMFormat

REPO = Path(__file__).resolve().parents[1]

OLD = {"epochs": 2, "batch_size": 3, "eval_batch_size": 5, "lr_scheduler": "linear", "warmup": 7,
       "num_workers": 1, "logging_steps": 4, "trainer_options": {"optim": "sgd", "adam_beta1": 0.5}}
NEW = {"num_train_epochs": 2, "per_device_train_batch_size": 3, "per_device_eval_batch_size": 5,
       "lr_scheduler_type": "linear", "warmup_steps": 7, "dataloader_num_workers": 1, "logging_steps": 4,
       "optim": "sgd", "adam_beta1": 0.5}


def test_the_old_train_section_keys_mean_the_new_ones_with_one_deprecation_line_each(caplog):
    caplog.set_level("WARNING", logger="codetool")
    old = load_config(PipelineConfig, None, {f"train.{k}": v for k, v in OLD.items()}).train
    new = load_config(PipelineConfig, None, {f"train.{k}": v for k, v in NEW.items()}).train
    assert isinstance(old, PRMConfig) and old.to_dict() == new.to_dict()
    assert (old.num_train_epochs, old.per_device_train_batch_size, old.optim, old.adam_beta1) == (2.0, 3, "sgd", 0.5)
    deprecated = [m for m in caplog.messages if "is an old name" in m]
    assert len(deprecated) == 7  # logging_steps kept its name
    assert "train.epochs is an old name that works until the next release; use train.num_train_epochs" in deprecated


def test_the_stage_settings_are_the_old_sections_keys_whatever_names_were_used():
    old, new = from_dict(PRMConfig, OLD, where="train"), from_dict(PRMConfig, NEW, where="train")
    settings = old.stage_settings()
    assert settings == new.stage_settings() and list(settings) == [*LEGACY_KEYS, "trainer_options"]
    assert (settings["epochs"], settings["batch_size"], settings["warmup"], settings["lr_scheduler"]) == (
        2.0, 3, 7.0, "linear")
    assert settings["logging_steps"] == 4 and isinstance(settings["logging_steps"], int)  # an int, as before
    assert settings["trainer_options"] == {"optim": "sgd", "adam_beta1": 0.5}
    assert settings["report_to"] == "none" and settings["format"] == dataclasses.asdict(PRMFormat())


def test_the_old_sections_defaults_give_the_hash_they_gave():
    """A ``TrainConfig()`` (the section with nothing set), as ``dataclasses.asdict`` wrote it, and
    the hash of it that a pipeline recorded before the switch."""
    settings = PRMConfig().stage_settings()
    assert {k: settings[k] for k in ("model", "dataset", "output_dir", "epochs", "warmup", "eval_steps",
                                     "trainer_options", "max_samples")} == {
        "model": "default", "dataset": ["data/prm/prm_examples.jsonl"], "output_dir": "checkpoints/prm/quickstart",
        "epochs": 1.0, "warmup": 0.03, "eval_steps": 50, "trainer_options": {}, "max_samples": None}
    assert config_hash([settings, "h"]) == "7ee4e3ae20fb"  # TrainConfig() gave this


def test_the_pipeline_trains_with_the_sections_settings_on_its_own_data(tmp_path):
    cfg = load_config(PipelineConfig, REPO / "configs" / "pipeline" / "quickstart.yaml", {"runs_dir": str(tmp_path)})
    train = train_config(cfg)
    assert train.dataset == [str(tmp_path / "quickstart" / "trees" / "prm_dataset" / "train.jsonl")]
    assert (train.learning_rate, train.logging_steps, train.eval_strategy, train.format.max_length) == (
        5e-4, 5, "no", 768)
    assert train.stage_settings() == {**cfg.train.stage_settings(), "dataset": train.dataset,
                                      "eval_dataset": train.eval_dataset, "output_dir": train.output_dir}


@pytest.mark.parametrize("recipe_key, flag_key", [("epochs", "num_train_epochs"), ("num_train_epochs", "epochs")])
def test_a_train_flag_wins_over_the_recipe_whichever_name_each_uses(recipe_key, flag_key, tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(yaml.safe_dump({"train": {recipe_key: 1}}))
    assert load_config(PipelineConfig, recipe, {f"train.{flag_key}": "3"}).train.num_train_epochs == 3.0
    assert load_config(PRMConfig, recipe.write_text(yaml.safe_dump({recipe_key: 1})) and recipe,
                       {flag_key: "3"}).num_train_epochs == 3.0


def test_an_unknown_train_key_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.learning_rat'\. Did you mean 'learning_rate'"):
        load_config(PipelineConfig, None, {"train.learning_rat": 1})


def test_the_pipeline_command_line_takes_any_train_prm_option(monkeypatch):
    from codetool import cli
    from codetool.commands import pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "pipeline_command", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    assert cli.main(["pipeline", "--train.epochs", "3", "--train.optim=adafactor", "--train.gradient_checkpointing",
                     "--train.max_steps", "-1", "--name", "x"]) == 0
    cfg = seen["cfg"]
    assert (cfg.name, cfg.train.num_train_epochs, cfg.train.gradient_checkpointing) == ("x", 3.0, True)
    assert str(getattr(cfg.train.optim, "value", cfg.train.optim)) == "adafactor"
    assert cli.main(["pipeline", "--train.learning_rat", "1"]) == 2  # refused by name, one line


def test_pipeline_help_does_not_import_trl():
    code = ("import sys\nfrom codetool.cli import main\ntry:\n    main(['pipeline', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint('trl' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--train.KEY VALUE" in out.stdout and out.stdout.strip().endswith("False False")


RENAMED = {old: new for old, new in ALIASES.items() if new != "*"}


def _with_names(section: dict, names: dict[str, str]) -> dict:
    return {names.get(k, k): v for k, v in section.items()}


@pytest.mark.parametrize("recipe", sorted((REPO / "configs" / "train").glob("*.yaml"))
                         + sorted((REPO / "configs" / "pipeline").glob("*.yaml")), ids=lambda p: p.parent.name + "/" + p.stem)
def test_every_shipped_recipe_means_the_same_by_old_and_by_new_names(recipe, tmp_path):
    """The recipe with every old key renamed, and with every new key given its old name: the same
    training settings, and (pipeline recipes) the same stage hashes."""
    data = load_yaml(recipe)
    is_pipeline = recipe.parent.name == "pipeline"
    train = data.get("train", {}) if is_pipeline else data
    variants = []
    for names in (RENAMED, {new: old for old, new in RENAMED.items()}):
        path = tmp_path / f"{len(variants)}.yaml"
        path.write_text(yaml.safe_dump({**data, "train": _with_names(train, names)} if is_pipeline
                                       else _with_names(train, names)))
        variants.append(load_config(PipelineConfig if is_pipeline else PRMConfig, path))
    (new, old), (new_train, old_train) = variants, [v.train if is_pipeline else v for v in variants]
    assert new_train.to_dict() == old_train.to_dict() and new_train.stage_settings() == old_train.stage_settings()
    if is_pipeline:
        assert stage_hashes(new) == stage_hashes(old) == stage_hashes(load_config(PipelineConfig, recipe))
