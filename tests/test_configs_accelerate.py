"""Every file in configs/accelerate/ launches ``codetool train-prm`` as shipped (issue 25).

The slow tests run ``accelerate launch --config_file <file> --num_processes 2`` (1 for the
single-GPU file) on the tiny model on CPU. DDP, single process and FSDP run as shipped: the
config's ``mixed_precision`` (bf16) decides the PRM's precision. accelerate 1.15 runs a job
without CUDA GPUs as plain DDP over gloo, so the FSDP file trains as DDP here and says so in one
warning. The DeepSpeed files run ZeRO-2/3 for real on DeepSpeed's CPU accelerator (``deepspeed``
is an extra; CI's slow stage installs it) with ``--mixed_precision no`` on the launch line:
transformers' Trainer takes no bf16 without CUDA unless ``use_cpu``, which turns DeepSpeed off;
launched as shipped they stop with a one-line error that says so. The fast tests pin the
precision rule and the config fields.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from codetool.config import ConfigError
from codetool.jsonl import read_jsonl, write_jsonl
from codetool.models.spec import ModelSpec
from codetool.prm.synthetic import synthetic_rows

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs" / "accelerate").glob("*.yaml"))


def test_every_config_is_covered():
    assert {p.stem for p in CONFIGS} == {"single_gpu", "multi_gpu", "deepspeed_zero2", "deepspeed_zero3", "fsdp"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_process_count_comes_from_the_command_line(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    text = path.read_text()
    if path.stem == "single_gpu":
        assert config.num_processes == 1
    else:  # unset: accelerate refuses to start without --num_processes
        assert "num_processes:" not in text.replace("# num_processes:", "")
        assert config.num_processes == -1
        assert "--num_processes" in text  # the usage line says so


@pytest.mark.parametrize("launcher,precision,bf16", [("bf16", "auto", True), ("no", "auto", False),
                                                     ("bf16", "bf16", True), ("no", "fp32", False)])
def test_launcher_mixed_precision_decides_auto(monkeypatch, tmp_path, launcher, precision, bf16):
    from codetool.prm.trainer import PRMConfig

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    cfg = PRMConfig(output_dir=str(tmp_path), precision=precision)
    assert cfg.bf16 is bf16


@pytest.mark.parametrize("launcher,precision", [("bf16", "fp32"), ("no", "bf16")])
def test_precision_disagreeing_with_the_launcher_is_refused(monkeypatch, tmp_path, launcher, precision):
    from codetool.prm.trainer import PRMConfig

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    with pytest.raises(ConfigError, match=f"precision {precision} disagrees with the accelerate config's "
                                          f"mixed_precision {launcher}"):
        PRMConfig(output_dir=str(tmp_path), precision=precision)


def _launch(path: Path, model_dir: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    data = tmp_path / "prm.jsonl"
    write_jsonl(data, synthetic_rows(8, steps=1, candidates=2, extra_tools=0))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "DS_ACCELERATOR": "cpu", "ACCELERATE_USE_CPU": "false"}
    procs = [] if path.stem == "single_gpu" else ["--num_processes", "2"]
    if path.stem.startswith("deepspeed"):
        procs += ["--mixed_precision", "no"]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), *procs, *extra,
               "-m", "codetool.cli", "train-prm", "--model", str(model_dir), "--dataset", str(data),
               "--output_dir", str(out), "--max_steps", "4", "--save_steps", "4", "--eval_steps", "0",
               "--format.max_length", "256", "--format.max_suffix_length", "96", "--resume", "none",
               "--per_device_train_batch_size", "2"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    return result, out


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_launches_train_prm(path, tiny_model_dir, tmp_path):
    if path.stem.startswith("deepspeed") and find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]'; CI's slow stage does)")
    result, out = _launch(path, tiny_model_dir, tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert f"training on {1 if path.stem == 'single_gpu' else 2} process(es)" in log
    deepspeed = path.stem.startswith("deepspeed")
    assert f"precision {'fp32' if deepspeed else 'bf16'} (from the accelerate config" in log
    if path.stem == "fsdp":  # no CUDA here: accelerate runs it as DDP, and we say so
        assert "asks for FSDP" in log and "DDP on 2 process(es)" in log
    if deepspeed:
        assert f"DeepSpeed ZeRO-{path.stem[-1]} on 2 process(es)" in log
    from codetool.prm.format import item_from_row
    from codetool.prm.scorer import load_scorer

    scores = load_scorer(ModelSpec.folder(out, role="prm"), device="cpu").score([item_from_row(r) for r in read_jsonl(tmp_path / "prm.jsonl")][:2])
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.slow
def test_deepspeed_as_shipped_on_cpu_is_a_one_line_error(tiny_model_dir, tmp_path):
    if find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]'; CI's slow stage does)")
    path = REPO / "configs" / "accelerate" / "deepspeed_zero2.yaml"
    result, _ = _launch(path, tiny_model_dir, tmp_path, "--mixed_precision", "bf16")
    log = result.stdout + result.stderr
    assert result.returncode != 0  # each process stops with our one line (torchrun then reports the exits)
    assert "codetool train-prm: error: DeepSpeed without CUDA" in log and "--mixed_precision no" in log
