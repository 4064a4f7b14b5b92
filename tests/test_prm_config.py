"""``codetool.prm.config.PRMConfig``: one config for ``train-prm`` and the pipeline's ``train`` section.

The section used to be its own ``TrainConfig``; 0.2.0 refuses its old key names with one line that
names the new key (``RENAMED``), and the train stage hashes the settings under their own names
(``PRMConfig.stage_settings``): every setting the PRM declares, and every TRL setting given.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from codetool.config import ConfigError, _flat_fields, from_dict, load_config
from codetool.jobs.pipeline import PipelineConfig, train_config
from codetool.prm.config import RENAMED, PRMConfig
from codetool.prm.options import PRMOptions

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_train_section_key_is_refused_naming_the_new_one(old):
    new = RENAMED[old]
    for where, cls, data in (("train.", PipelineConfig, {"train": {old: 1}}), ("", PRMConfig, {old: 1})):
        said = (rf"{where}{old} was renamed to {where}{new} in 0\.2\.0 " if " " not in new
                else rf"{where}{old} was removed in 0\.2\.0: ")
        with pytest.raises(ConfigError, match=rf"^{said}.*\(docs/MIGRATING\.md\)\.$"):
            from_dict(cls, data)


def test_the_renamed_keys_name_real_settings():
    fields = {f.name for f in dataclasses.fields(PRMConfig)}
    assert {new for new in RENAMED.values() if " " not in new} <= fields
    assert not set(RENAMED) & fields


def test_the_stage_settings_are_the_prm_s_own_and_the_trl_settings_given():
    cfg = from_dict(PRMConfig, {"num_train_epochs": 2, "optim": "sgd", "adam_beta1": 0.5, "logging_steps": 4,
                                "format": {"max_length": 1024}}, where="train")
    settings = cfg.stage_settings()
    own = {name for name, _, _ in _flat_fields(PRMOptions)}
    assert own <= set(settings) and set(settings) - own == {"optim", "adam_beta1"}
    assert (settings["num_train_epochs"], settings["optim"], settings["adam_beta1"]) == (2.0, "sgd", 0.5)
    assert settings["format.max_length"] == 1024 and settings["report_to"] == "none" and "format" not in settings
    assert PRMConfig().stage_settings()["warmup_steps"] == 0.03  # a default as given, not as TRL rewrites it


def test_the_pipeline_trains_with_the_sections_settings_on_its_own_data(tmp_path):
    cfg = load_config(PipelineConfig, REPO / "configs" / "pipeline" / "quickstart.yaml", {"runs_dir": str(tmp_path)})
    train = train_config(cfg)
    assert train.dataset == [str(tmp_path / "quickstart" / "trees" / "prm_dataset" / "train.jsonl")]
    assert (train.learning_rate, train.logging_steps, train.eval_strategy, train.format.max_length) == (
        5e-4, 5, "no", 768)
    assert train.stage_settings() == {**cfg.train.stage_settings(), "dataset": train.dataset,
                                      "eval_dataset": train.eval_dataset, "output_dir": train.output_dir}


def test_a_train_flag_wins_over_the_recipe(tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(yaml.safe_dump({"train": {"num_train_epochs": 1}}))
    assert load_config(PipelineConfig, recipe, {"train.num_train_epochs": "3"}).train.num_train_epochs == 3.0
    recipe.write_text(yaml.safe_dump({"num_train_epochs": 1}))
    assert load_config(PRMConfig, recipe, {"num_train_epochs": "3"}).num_train_epochs == 3.0


def test_an_unknown_train_key_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.learning_rat'\. Did you mean 'learning_rate'"):
        load_config(PipelineConfig, None, {"train.learning_rat": 1})


def test_the_pipeline_command_line_takes_any_train_prm_option(monkeypatch):
    from codetool import cli
    from codetool.commands import pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "pipeline_command", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    assert cli.main(["pipeline", "--train.num_train_epochs", "3", "--train.optim=adafactor", "--train.gradient_checkpointing",
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
