"""Whole checkpoints only (issue 28): a save cut short by a kill or a full disk is never resumed from."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from codetool import CodetoolError
from codetool.config import load_config
from codetool.jsonl import write_jsonl
from codetool.prm.checkpoints import (
    COMPLETE,
    check_resumable,
    last_complete_checkpoint,
    mark_complete,
    resume_checkpoint,
)
from codetool.prm.synthetic import synthetic_rows

trainer_mod = pytest.importorskip("codetool.prm.trainer")
train_command = pytest.importorskip("codetool.commands.train_prm").train_command


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt-data") / "prm.jsonl"
    write_jsonl(path, synthetic_rows(6, steps=1, candidates=2, extra_tools=0))
    return path


def _cfg(model_dir, data, out, **extra):
    return load_config(trainer_mod.PRMConfig, None, {
        "model": str(model_dir), "dataset": [str(data)], "output_dir": str(out), "format.max_length": 384,
        "format.max_suffix_length": 128, "max_steps": 3, "eval_fraction": 0.0, "save_steps": 1,
        "save_total_limit": 5, "per_device_train_batch_size": 2, "finetune": "lora", **extra})


def test_a_save_cut_short_by_a_full_disk_is_not_resumed_from(tiny_model_dir, data, tmp_path, monkeypatch, caplog):
    """The save of checkpoint-2 runs out of space after its first file; the next run with
    ``--resume auto`` resumes from checkpoint-1 (before: it picked checkpoint-2 and stopped)."""
    import codetool.prm.folder as modeling

    out = tmp_path / "prm"
    real_save = modeling.save_prm

    def full_disk(out_dir, *args, **kwargs):
        if Path(out_dir).name == "checkpoint-2":
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / "label_head.safetensors").write_bytes(b"\0" * 10)  # a torn first file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(out_dir, *args, **kwargs)

    monkeypatch.setattr(modeling, "save_prm", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train_command(_cfg(tiny_model_dir, data, out, resume="none"))
    assert (out / "checkpoint-1" / COMPLETE).is_file() and (out / "checkpoint-2").is_dir()
    assert not (out / "checkpoint-2" / COMPLETE).exists()
    with pytest.raises(CodetoolError, match="not a whole checkpoint"):
        check_resumable(out / "checkpoint-2")

    monkeypatch.setattr(modeling, "save_prm", real_save)
    caplog.set_level("INFO", logger="codetool")
    assert train_command(_cfg(tiny_model_dir, data, out, resume="auto")) == 0
    assert "resuming from " + str(out / "checkpoint-1") in caplog.text
    assert "removing " + str(out / "checkpoint-2") in caplog.text
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert all((out / f"checkpoint-{n}" / COMPLETE).is_file() for n in (1, 2, 3))
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3


def test_folders_from_before_the_marker_count_when_their_trainer_state_parses(tmp_path):
    for step, state in ((1, '{"global_step": 1}'), (2, '{"global_st')):  # 2: torn while writing
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-3").mkdir()  # nothing written yet
    assert last_complete_checkpoint(tmp_path, remove_incomplete=False) == str(tmp_path / "checkpoint-1")
    assert (tmp_path / "checkpoint-2").is_dir()
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    assert last_complete_checkpoint(tmp_path / "missing") is None
    check_resumable(tmp_path / "checkpoint-1")


def test_a_run_begun_before_the_marker_and_resumed_since_keeps_its_old_checkpoints(tmp_path):
    """Unmarked checkpoint-100 and -200 (whole, from before the marker), then a marked -300 and an
    unmarked -400 (its save cut short). Before: once one folder had the marker, every unmarked one
    counted as cut short: -100 and -200 were removed with a false warning, and an explicit resume
    of -200 refused."""
    for step in (100, 200, 300, 400):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    mark_complete(tmp_path / "checkpoint-300", 300)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-300")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-100", "checkpoint-200", "checkpoint-300"]
    check_resumable(tmp_path / "checkpoint-200")


def test_resume_names_none_the_newest_whole_or_a_whole_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # not the first process: it leaves unmarked folders alone
    assert resume_checkpoint("none", tmp_path) is None and resume_checkpoint("", tmp_path) is None
    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-1" / COMPLETE).write_text("{}")
    assert resume_checkpoint("auto", tmp_path) == str(tmp_path / "checkpoint-1")
    assert (tmp_path / "checkpoint-2").is_dir()
    assert resume_checkpoint(str(tmp_path / "checkpoint-1"), tmp_path) == str(tmp_path / "checkpoint-1")
    with pytest.raises(CodetoolError, match="not a whole checkpoint"):
        resume_checkpoint(str(tmp_path / "checkpoint-2"), tmp_path)
