"""``codetool train-prm`` as a command (issue 40): an empty held-out file (a few trees held no pair
out) trains without evaluation instead of stopping."""

from __future__ import annotations

import json

import codetool.commands.train_prm as train_prm
from codetool.config import load_config
from codetool.prm.config import PRMConfig


def test_an_empty_validation_file_trains_without_evaluation(tmp_path, monkeypatch, caplog):
    """Before: `no PRM rows in [...validation.jsonl]; the file is empty.`, after build-trees on 3 queries."""
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"query": "q", "tools": "", "history": [], "candidate": "x", "label": 1}) + "\n")
    (tmp_path / "validation.jsonl").write_text("")
    seen = {}

    def stop(cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(train_prm, "build_trainer", stop)
    cfg = load_config(PRMConfig, overrides={"dataset": [str(train)], "eval_dataset": [str(tmp_path / "validation.jsonl")],
                                            "output_dir": str(tmp_path / "prm")})
    try:
        train_prm.train_command(cfg)
    except SystemExit:
        pass
    assert seen["cfg"].eval_dataset == [] and "training without evaluation" in caplog.text
