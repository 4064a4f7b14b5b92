"""PRMConfig (a TRL SFTConfig) and PRMTrainer (an SFTTrainer): options reach the trainer, model card, hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from codetool import CodetoolError
from codetool.config import ConfigError, load_config
from codetool.jsonl import write_jsonl
from codetool.prm.synthetic import synthetic_rows

REPO = Path(__file__).resolve().parents[1]
trainer_mod = pytest.importorskip("codetool.prm.trainer")
PRMConfig, build_trainer = trainer_mod.PRMConfig, trainer_mod.build_trainer
train_command = pytest.importorskip("codetool.commands.train_prm").train_command


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trainer-data") / "prm.jsonl"
    write_jsonl(path, synthetic_rows(6, steps=1, candidates=2, extra_tools=0))
    return path


def _values(model_dir, data, out, **extra) -> dict:
    return {"model": str(model_dir), "dataset": [str(data)], "output_dir": str(out), "format.max_length": 384,
            "format.max_suffix_length": 128, "max_steps": 2, "eval_fraction": 0.0, "resume": "none",
            "save_steps": 100, **extra}


def test_prm_config_is_an_sft_config_with_the_old_recipe_keys():
    from trl import SFTConfig

    cfg = load_config(PRMConfig, REPO / "configs" / "train" / "qwen2.5-7b.yaml")
    assert isinstance(cfg, SFTConfig)
    # aliases of the earlier recipe keys land on the TRL fields
    assert (cfg.finetune, cfg.learning_rate, cfg.num_train_epochs) == ("full", 1e-6, 2.0)
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (1, 2)  # the paper: 1 x 2 accumulation x 8 GPUs
    assert str(cfg.lr_scheduler_type.value if hasattr(cfg.lr_scheduler_type, "value") else cfg.lr_scheduler_type) == "cosine"
    assert cfg.max_length == cfg.format.max_length == 8192 and cfg.bf16 is True
    assert cfg.dataset_kwargs == {"skip_prepare_dataset": True} and cfg.remove_unused_columns is False
    with pytest.raises(ConfigError, match="unknown config key 'optimm'.*optim"):
        load_config(PRMConfig, None, {"optimm": "sgd"})
    with pytest.raises(ConfigError, match="share_prefix"):
        load_config(PRMConfig, None, {"share_prefix": "sometimes"})
    assert load_config(PRMConfig, None, {"share_prefix": True}).share_prefix == "auto"


def test_an_sft_option_not_named_in_our_code_takes_effect_from_yaml_and_cli(tiny_model_dir, data, tmp_path):
    """``optim: sgd`` (a TrainingArguments option) gives a torch SGD optimizer; from YAML and --optim."""
    import yaml

    from codetool.config_args import add_arguments, config_from_args

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"optim": "sgd", "num_train_epochs": 1, "adam_beta1": 0.5}))
    cfg = load_config(PRMConfig, recipe, _values(tiny_model_dir, data, tmp_path / "a"))
    trainer = build_trainer(cfg)
    assert isinstance(trainer.create_optimizer(), torch.optim.SGD)
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser, PRMConfig)
    args = parser.parse_args(["--optim", "adafactor", "--per-device-train-batch-size", "3", "--model", str(tiny_model_dir),
                              "--dataset", str(data), "--output_dir", str(tmp_path / "b"), "--eval_fraction", "0",
                              "--format.max_length", "384", "--format.max_suffix_length", "128"])
    cfg = config_from_args(PRMConfig, args)
    assert cfg.per_device_train_batch_size == 3
    from transformers.optimization import Adafactor

    assert isinstance(build_trainer(cfg).create_optimizer(), Adafactor)


@pytest.mark.parametrize("recipe", sorted((REPO / "configs" / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_train_recipe_loads_as_a_prm_config(recipe):
    cfg = load_config(PRMConfig, recipe)
    assert cfg.output_dir.startswith("checkpoints/prm/") and cfg.max_length == cfg.format.max_length


def test_the_cli_entry_point_passes_trl_options_through(tiny_model_dir, data, tmp_path):
    """The real ``codetool train-prm``: --optim reaches the saved TrainingArguments; the CLI's own
    --log-level does not leak into SFTConfig's log_level field."""
    from codetool.cli import main

    out = tmp_path / "cli"
    assert main(["train-prm", "--model", str(tiny_model_dir), "--dataset", str(data), "--output_dir", str(out),
                 "--max_steps", "1", "--eval_fraction", "0", "--resume", "none", "--format.max_length", "384",
                 "--format.max_suffix_length", "128", "--optim", "sgd", "--log-level", "WARNING"]) == 0
    args = torch.load(out / "training_args.bin", weights_only=False)
    assert str(getattr(args.optim, "value", args.optim)) == "sgd" and args.log_level == "passive"
    assert (out / "README.md").is_file()


def test_train_prm_help_all_lists_the_trl_options():
    """``--help`` lists the PRM's own options (no TRL import); ``--help-all`` every TRL one too."""
    out = subprocess.run([sys.executable, "-m", "codetool.cli", "train-prm", "--help-all"], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--optim", "--torch_compile", "--push_to_hub", "--hub_model_id", "--packing", "--lr_scheduler_type",
                 "--share_prefix", "--lora_r", "--num_train_epochs", "--format.max_length"):
        assert flag in out.stdout, flag
    assert "--epochs" not in out.stdout  # 0.1's name: refused, naming the new one


def test_model_card_and_push_to_hub_with_a_mocked_hub(tiny_model_dir, data, tmp_path):
    out = tmp_path / "prm"
    api = mock.MagicMock()
    api.create_repo.return_value = mock.MagicMock(repo_id="me/prm-test")
    cfg = load_config(PRMConfig, None, _values(tiny_model_dir, data, out, push_to_hub=True,
                                               hub_model_id="me/prm-test", share_prefix="packed"))
    with mock.patch("transformers.trainer.hf_api", return_value=api):
        assert train_command(cfg) == 0
    assert (out / "README.md").is_file() and "codetool" in (out / "README.md").read_text()
    assert (out / "prm_config.json").is_file()
    api.create_repo.assert_called()
    folders = [c.kwargs.get("folder_path") for c in api.upload_folder.call_args_list]
    assert str(out) in folders and all(c.kwargs.get("repo_id") == "me/prm-test" for c in api.upload_folder.call_args_list)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["share_prefix"] == "packed"


def test_stepwise_export_in_trl_layout(tmp_path):
    from codetool.prm.stepwise import main, to_stepwise

    rows = synthetic_rows(1, steps=2, candidates=2, extra_tools=0)
    out = to_stepwise(rows)
    assert len(out) == 4 and set(out[0]) >= {"prompt", "completions", "labels"}
    first, second = out[0], out[2]  # step 1 (no history), step 2 (one history step)
    assert len(first["completions"]) == len(first["labels"]) == 1 and first["labels"] == [bool(rows[0]["label"])]
    assert len(second["completions"]) == 2 and second["labels"][-1] == bool(rows[2]["label"])
    chosen = rows[2]["history"][0]["code"]
    step1_label = next(bool(r["label"]) for r in rows[:2] if r["candidate"] == chosen)
    assert second["labels"][0] == step1_label and chosen in second["completions"][0]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, rows)
    assert main([str(src), str(dst)]) == 0
    assert [json.loads(line)["labels"] for line in dst.read_text().splitlines()] == [r["labels"] for r in out]


def test_a_missing_dataset_is_reported_before_the_model_loads(tmp_path, monkeypatch):
    from codetool.prm import trainer

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the dataset was checked")

    monkeypatch.setattr(trainer, "build_model", no_model)
    cfg = load_config(PRMConfig, None, {"dataset": [str(tmp_path / "nope.jsonl")], "output_dir": str(tmp_path / "o")})
    with pytest.raises(CodetoolError, match="PRM dataset not found: .*nope.jsonl"):
        trainer.build_trainer(cfg)
