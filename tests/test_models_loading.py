"""Model resolution and loading: names, dtypes, devices, tokenizer padding, error messages."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from codetool import CodetoolError
from codetool.models import loading
from codetool.models.loading import (
    DEFAULT_MODEL_SUBDIR,
    MANIFEST_NAME,
    checkpoints_dir,
    load_model,
    prepare_tokenizer,
    resolve_model,
)


@pytest.fixture
def empty_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("CODETOOL_CHECKPOINTS", str(tmp_path / "ckpt"))
    return tmp_path / "ckpt"


@pytest.fixture
def cached_default(tmp_path, monkeypatch, tiny_model_dir):
    """A checkpoints folder whose 'default' is the tiny model, as `codetool setup` leaves it."""
    root = tmp_path / "ckpt"
    target = root / DEFAULT_MODEL_SUBDIR
    shutil.copytree(tiny_model_dir, target)
    (target / MANIFEST_NAME).write_text(json.dumps({"model": "tiny"}))
    monkeypatch.setenv("CODETOOL_CHECKPOINTS", str(root))
    return target


def test_checkpoints_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("CODETOOL_CHECKPOINTS", str(tmp_path / "from-env"))
    assert checkpoints_dir() == tmp_path / "from-env"
    monkeypatch.delenv("CODETOOL_CHECKPOINTS")
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.chdir(tmp_path)
    assert checkpoints_dir() == tmp_path / "checkpoints"


def test_default_before_setup_says_run_setup(empty_checkpoints):
    with pytest.raises(CodetoolError, match="codetool setup") as e:
        resolve_model("default")
    assert "does not exist" in str(e.value) and "\n" not in str(e.value)


def test_default_interrupted_save_is_not_accepted(cached_default):
    (cached_default / MANIFEST_NAME).unlink()
    with pytest.raises(CodetoolError, match="incomplete"):
        resolve_model("default")


def test_resolve_default_and_local_forms(cached_default, tmp_path):
    assert resolve_model("default") == str(cached_default)
    assert resolve_model(str(cached_default)) == str(cached_default)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)) == str(gguf)
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "x.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(lone)) == str(lone / "x.gguf")
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("name, message", [
    ("/no/such/model.gguf", "no such .gguf file"),
    ("./no/such/dir", "not a Hub id"),
    ("two words", "not a Hub id"),
])
def test_resolve_errors_name_what_was_tried(name, message):
    with pytest.raises(CodetoolError, match=message) as e:
        resolve_model(name)
    assert name in str(e.value)


def test_directory_without_config(tmp_path):
    with pytest.raises(CodetoolError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_load_tiny_model_defaults(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert next(model.parameters()).dtype == torch.float32  # auto on CPU
    assert not model.training
    assert tok.pad_token is not None and tok.padding_side == "left"
    assert model.generation_config.pad_token_id == tok.pad_token_id


def test_load_dtype_override_and_training(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir), dtype="bfloat16", for_training=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.training and tok.padding_side == "right"


def test_load_default(cached_default):
    model, _ = load_model("default")
    assert model.config.hidden_size == 32


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "float16", "device": "cpu"}, "float16 is not supported on CPU"),
    ({"dtype": "int8"}, "not supported"),
])
def test_bad_dtype_is_one_line_with_fix(tiny_model_dir, kwargs, message):
    with pytest.raises(CodetoolError, match=message) as e:
        load_model(str(tiny_model_dir), **kwargs)
    assert "\n" not in str(e.value) and "float32" in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_missing_cuda(tiny_model_dir):
    with pytest.raises(CodetoolError, match="no CUDA GPU"):
        load_model(str(tiny_model_dir), device="cuda")


def test_uncached_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CodetoolError, match="could not load model 'nobody-xyz/not-a-model'") as e:
        load_model("nobody-xyz/not-a-model")
    assert "Hub id" in str(e.value) and "local directory" in str(e.value)


def test_corrupt_gguf_says_force(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(CodetoolError, match="setup --force"):
        load_model(str(bad))


def test_partial_save_directory(tmp_path, tiny_model_dir):
    partial = tmp_path / "partial"
    shutil.copytree(tiny_model_dir, partial)
    (partial / "model.safetensors").unlink()
    with pytest.raises(CodetoolError, match="partial save"):
        load_model(str(partial))


def test_prepare_tokenizer_adds_pad(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.pad_token = None
    prepare_tokenizer(tok)
    assert tok.pad_token == tok.eos_token and tok.padding_side == "left"


def test_config_import_is_light():
    # Configs must stay importable without torch (fast `codetool <cmd> --help`).
    import subprocess
    import sys

    code = ("import sys, codetool.models.backends, codetool.models.setup, codetool.models; "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert loading.DEFAULT_MODEL == "default"


@pytest.mark.parametrize("name, exists", [
    ("runs/missing", "runs/"),           # the first part is a folder here: a path, not owner/name
    ("runs/deeper/missing", "runs/"),
    ("./missing", "./"),
    ("/no-such-root-folder/model", "/"),
])
def test_a_path_that_does_not_exist_fails_at_once_and_is_never_tried_on_the_hub(tmp_path, monkeypatch, name,
                                                                               exists):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    import transformers

    def hub(*args, **kwargs):
        raise AssertionError("tried the Hub")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub)
    with pytest.raises(CodetoolError, match="not found: it looks like a path, not a Hub id, and .* does not exist") as e:
        load_model(name)
    assert f"({exists} exists, the rest does not)" in str(e.value) and name in str(e.value)


def test_owner_name_without_such_a_folder_here_is_still_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model("runs/missing") == "runs/missing"
    (tmp_path / "runs").mkdir()
    with pytest.raises(CodetoolError, match="looks like a path"):
        resolve_model("runs/missing")
    with pytest.raises(CodetoolError, match=r"~/"):
        resolve_model("~/no-such-codetool-model-folder")
