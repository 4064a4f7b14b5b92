"""Load a causal LM and its tokenizer from ``default``, a local directory, a ``.gguf`` file or a Hub id.

``default`` is the embedded SmolLM2-135M-Instruct that ``codetool setup`` caches as safetensors
under ``checkpoints/base/smollm2-135m-instruct/`` (docs/DESIGN.md §6). Dtype and device are chosen
sensibly (bf16 on CUDA, fp32 on CPU) and can be overridden; a combination the device cannot run
is a :class:`codetool.CodetoolError` with the fix.

Guarantees: every returned tokenizer has a pad token, pads on the left for generation (on the
right when ``for_training``), and the model's generation config knows the pad id. A name that
matches nothing gives one error that lists what was tried.

Not handled here: quantised inference (GGUF files are dequantised to float32 by transformers),
multi-GPU sharding (``device_map="auto"`` is left to callers that need it), downloads when
``HF_HUB_OFFLINE`` is set (the error then says to pre-fetch the model).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from codetool import CodetoolError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_MODEL_SUBDIR = Path("base") / "smollm2-135m-instruct"
TESTBED_MODEL = "testbed"  # the default model warm-started on the synthetic world (codetool setup --testbed)
TESTBED_MODEL_SUBDIR = Path("testbed") / "world-policy"
# Written last by `codetool setup`; a directory without it is an interrupted save.
MANIFEST_NAME = "codetool-manifest.json"
DTYPES = ("auto", "float32", "bfloat16", "float16")
# owner/name, as the Hub spells repository ids (a bare name such as "gpt2" is also an id).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def checkpoints_dir() -> Path:
    """Where models and PRM checkpoints live.

    Order: the ``CODETOOL_CHECKPOINTS`` environment variable; ``./checkpoints`` of the current
    directory if it exists; the ``checkpoints/`` folder of the repository checkout this package
    was imported from, if it exists; else ``./checkpoints`` (created on first save).
    """
    env = os.environ.get("CODETOOL_CHECKPOINTS")
    if env:
        return Path(env).expanduser()
    local = Path.cwd() / "checkpoints"
    if local.is_dir():
        return local
    repo = Path(__file__).resolve().parents[2] / "checkpoints"
    if repo.is_dir():
        return repo
    return local


def default_model_dir() -> Path:
    """The directory of the cached embedded default model (it may not exist yet)."""
    return checkpoints_dir() / DEFAULT_MODEL_SUBDIR


def resolve_model(name: str) -> str:
    """Turn a model name into something ``from_pretrained`` can load.

    Args:
        name (`str`): ``"default"``, ``"testbed"`` (the warm-started world policy), a local model directory
            (with ``config.json``), a ``.gguf`` file, or a Hugging Face Hub id (``owner/name``).

    Returns:
        `str`: a directory path, a ``.gguf`` file path, or the Hub id unchanged. Whether a Hub
        id exists is only known when loading (see :func:`load_model`).

    Raises:
        CodetoolError: ``default`` before ``codetool setup`` ran, a directory without a model, a
            missing ``.gguf`` file, a path that does not exist (one that starts with ``.``, ``/`` or
            ``~``, or whose first part is a folder here: ``runs/missing``; never tried as a Hub id),
            or a name that is neither a path nor a Hub id.
    """
    name = str(name).strip()
    if name == DEFAULT_MODEL:
        path = default_model_dir()
        if (path / MANIFEST_NAME).is_file() and (path / "config.json").is_file():
            return str(path)
        state = "is incomplete (an interrupted save)" if path.exists() else "does not exist"
        raise CodetoolError(f"the default model was asked for, but {path} {state}. Run `codetool setup` "
                            f"(or set CODETOOL_CHECKPOINTS to the checkpoints folder that holds it).")
    if name == TESTBED_MODEL:
        path = checkpoints_dir() / TESTBED_MODEL_SUBDIR
        if (path / MANIFEST_NAME).is_file() and (path / "config.json").is_file():
            return str(path)
        raise CodetoolError(f"the testbed policy was asked for, but {path} does not hold it. Run `codetool setup "
                            f"--testbed` (about 15 min on 2 CPU cores; docs/TESTBED.md).")
    path = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        if path.is_file():
            return str(path)
        raise CodetoolError(f"model '{name}': no such .gguf file. Pass an existing GGUF path, a model "
                            f"directory, a Hub id, or 'default'.")
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(ggufs[0])
        raise CodetoolError(f"model '{name}': the directory has no config.json"
                            + (f" and {len(ggufs)} .gguf files (pass one)" if ggufs else "")
                            + ". Pass a directory saved with save_pretrained, a .gguf file, a Hub id, or 'default'.")
    if name.startswith((".", "/", "~")) or ("/" in name and Path(name.split("/")[0]).is_dir()):
        # a path that does not exist ("runs/missing" with a runs/ folder here), not a Hub id: asking
        # the Hub would only fail, after a minute of retries when offline
        found = next((p for p in path.parents if p.is_dir()), None)
        raise CodetoolError(f"model '{name}' not found: it looks like a path, not a Hub id, and {path} does not exist"
                            + (f" ({str(found).rstrip('/')}/ exists, the rest does not)" if found is not None else "")
                            + ". Check the path (a train-prm or train-policy run writes its output_dir when it "
                              "finishes), or pass a Hub id (owner/name, where no folder 'owner' is here) or 'default'.")
    if _HUB_ID.match(name):  # owner/name, with no folder "owner" here
        return name
    raise CodetoolError(f"model '{name}' not found: it is not 'default', not a local directory, not a .gguf "
                        f"file and not a Hub id (owner/name). Check the path, or run `codetool setup` "
                        f"and pass 'default' (e.g. --policy default, --judge.model default).")


def _torch_dtype(dtype: str, device: str):
    import torch

    if dtype not in DTYPES:
        raise CodetoolError(f"dtype '{dtype}' is not supported; choose one of {list(DTYPES)}.")
    if dtype == "auto":
        if device.startswith("cuda"):  # GPUs before Ampere have no bfloat16
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype == "float16" and device == "cpu":
        raise CodetoolError("dtype float16 is not supported on CPU (CPUs emulate half precision: slow, and "
                            "float16 overflows where bfloat16 does not); use --dtype float32 (or bfloat16), "
                            "or a CUDA device.")
    return getattr(torch, dtype)


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; an unavailable device is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CodetoolError(f"device '{device}' was asked for, but torch sees no CUDA GPU "
                            f"(torch {torch.__version__}); use --device cpu or auto.")
    if device == "mps" and not torch.backends.mps.is_available():
        raise CodetoolError("device 'mps' is not available on this machine; use --device cpu or auto.")
    return device


def prepare_tokenizer(tokenizer, model=None, *, for_training: bool = False):
    """Give ``tokenizer`` a pad token (EOS, else UNK) and set the padding side.

    Left padding for generation (the new tokens follow the prompt directly), right padding for
    training. The model's generation config gets the pad id so ``generate`` does not warn.
    """
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
            logger.warning("tokenizer had no pad, EOS or UNK token; added <|pad|> (the embedding "
                           "matrix must grow before training)")
        else:
            tokenizer.pad_token = fallback
    tokenizer.padding_side = "right" if for_training else "left"
    if model is not None and getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


def load_model(name: str = DEFAULT_MODEL, *, dtype: str = "auto", device: str = "auto",
               for_training: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer.

    Args:
        name (`str`, *optional*, defaults to `"default"`): see :func:`resolve_model`.
        dtype (`str`, *optional*, defaults to `"auto"`): ``auto`` (bf16 on CUDA, fp16 on GPUs
            without bf16, fp32 on CPU),
            ``float32``, ``bfloat16`` or ``float16`` (not on CPU).
        device (`str`, *optional*, defaults to `"auto"`): ``auto``, ``cpu``, ``cuda``, ``cuda:1``...
        for_training (`bool`, *optional*, defaults to `False`): leave the model in train mode and
            pad on the right; otherwise eval mode, left padding, no gradients needed.

    Returns:
        `(model, tokenizer)`: the model on ``device`` in the chosen dtype.

    Raises:
        CodetoolError: unknown name, missing files, a corrupt GGUF, an unavailable device or a
            dtype the device cannot run.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model(name)
    device = resolve_device(device)
    torch_dtype = _torch_dtype(dtype, device)
    kwargs: dict = {}
    where = source
    if source.lower().endswith(".gguf"):
        gguf = Path(source)
        where, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200].rstrip(". ")
        if "gguf_file" in kwargs:
            fix = "the GGUF file may be corrupt or truncated; re-download it (for the default: `codetool setup --force`)"
        elif Path(where).is_dir():
            fix = "the directory may hold a partial save; save the model again with save_pretrained"
        else:
            fix = ("no local directory has that name; as a Hub id, check the spelling and the network "
                   "(offline, with HF_HUB_OFFLINE=1, it must already be in the Hugging Face cache), or "
                   "pass a local directory, a .gguf file or 'default'")
        raise CodetoolError(f"could not load model '{name}' from {source}: {first}. Fix: {fix}.") from e
    model.to(device)
    if for_training:
        model.train()
    else:
        model.eval()
    prepare_tokenizer(tokenizer, model, for_training=for_training)
    logger.debug("loaded %s (%s, %s, %.0fM parameters)", source, device, torch_dtype,
                 sum(p.numel() for p in model.parameters()) / 1e6)
    return model, tokenizer
