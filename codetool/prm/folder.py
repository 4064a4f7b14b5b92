"""A PRM folder: write it, read it, load it, export it for vLLM.

Layout (one folder, loadable by path): ``prm_config.json`` (base model, prompt format, label ids,
seed), the tokenizer with the label tokens, either a PEFT adapter (``adapter_config.json``) or a
full model (whose LM head rows hold the trained label rows, so vLLM and plain ``generate`` see the
same scores), and ``label_head.safetensors``. :func:`export_merged` writes the folder vLLM serves:
the full model alone (LoRA merged, label rows in the LM head, the checkpoint's dtype), without
``label_head.safetensors``. The model itself is :mod:`codetool.prm.modeling`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from codetool import CodetoolError
from codetool.models.loading import load_model
from codetool.prm.format import PRMFormat, label_token_ids
from codetool.prm.modeling import PRMModel, add_label_tokens, write_label_rows

logger = logging.getLogger(__name__)

PRM_CONFIG = "prm_config.json"
LABEL_HEAD = "label_head.safetensors"


def new_prm(name: str, fmt: PRMFormat, *, dtype: str = "auto", device: str = "auto", seed: int = 0):
    """An untrained PRM from a base model (label tokens added): ``(PRMModel, tokenizer)``, eval mode.

    Its scores are those of the base model's label rows; use it for benchmarks and tests.
    """
    lm, tokenizer = load_model(name, dtype=dtype, device=device)
    label_ids = add_label_tokens(lm, tokenizer, fmt, seed=seed)
    model = PRMModel(lm, label_ids)
    model.to(next(lm.parameters()).device)
    return model.eval(), tokenizer


def _output_keys(lm, state: dict) -> list[str]:
    """State-dict keys of the output rows (both embedding keys when tied)."""
    out = lm.get_output_embeddings()
    keys = [n for n, p in lm.named_parameters(remove_duplicate=False) if out is not None and p is out.weight]
    keys = [k for k in keys if k in state] or [k for k in ("lm_head.weight",) if k in state]
    return keys


def save_prm(out_dir: str | Path, model: PRMModel, tokenizer, meta: dict, state_dict: dict | None = None) -> None:
    """Write a PRM checkpoint folder (see the module docstring for the layout).

    Args:
        out_dir (`str` or `Path`): created if needed.
        model (`PRMModel`): the unwrapped model.
        tokenizer: saved alongside (it carries the label tokens).
        meta (`dict`): ``base_model``, ``format``, ``seed`` and anything else for ``prm_config.json``.
        state_dict (`dict`, *optional*): a consolidated state dict (DeepSpeed/FSDP); defaults to
            ``model.state_dict()``. Keys are ``lm.*`` and ``label_head``.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = dict(state_dict if state_dict is not None else model.state_dict())
    on_meta = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_meta]
    if on_meta:
        raise CodetoolError(f"save_prm: {len(on_meta)} weights (e.g. {on_meta[0]}) are on the meta device and hold no "
                            "values; pass the consolidated state_dict (FSDP/DeepSpeed) or materialise the model first.")
    head = state.pop("label_head").detach().float().cpu().contiguous()
    lm_state = {k[len("lm."):]: v for k, v in state.items() if k.startswith("lm.")}
    adapter = hasattr(model.lm, "peft_config")
    if adapter:
        model.lm.save_pretrained(out_dir, state_dict=lm_state, save_embedding_layers=False)
    else:
        for key in _output_keys(model.lm, lm_state):  # label rows into the LM head: plain generate agrees
            weight = lm_state[key].detach().clone()  # any device and dtype (cuda bf16 after training)
            write_label_rows(weight, model.label_ids, head)
            lm_state[key] = weight
        model.lm.save_pretrained(out_dir, state_dict=lm_state)
    save_file({"weight": head}, str(out_dir / LABEL_HEAD))
    tokenizer.save_pretrained(out_dir)
    config = {**meta, "label_ids": list(model.label_ids), "adapter": adapter}
    (out_dir / PRM_CONFIG).write_text(json.dumps(config, indent=2, default=str))


def read_prm_config(path: str | Path) -> dict:
    """The ``prm_config.json`` of a checkpoint folder.

    Raises:
        CodetoolError: if ``path`` is not a PRM checkpoint written by ``codetool train-prm``.
    """
    file = Path(path) / PRM_CONFIG
    if not file.is_file():
        raise CodetoolError(f"{path} is not a PRM checkpoint (no {PRM_CONFIG}); pass the output_dir of "
                            "'codetool train-prm' (or one of its checkpoint-N folders).")
    return json.loads(file.read_text())


def load_prm(path: str | Path, *, device: str = "auto", dtype: str = "auto", merge: bool = True):
    """Load a PRM checkpoint folder for scoring.

    Args:
        path (`str` or `Path`): a folder written by :func:`save_prm`.
        device, dtype (`str`, *optional*, default `"auto"`): see ``codetool.models.loading.load_model``.
        merge (`bool`, *optional*, defaults to `True`): merge a LoRA adapter into the weights
            (faster scoring); ``False`` keeps it as a separate PEFT module.
    Returns:
        ``(PRMModel, tokenizer, PRMFormat, meta)``, the model in eval mode.
    Raises:
        CodetoolError: if the folder is not a PRM checkpoint.
    """
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    path = Path(path)
    meta = read_prm_config(path)
    fmt = PRMFormat.from_saved(meta["format"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    if meta.get("adapter"):
        from peft import PeftModel

        base, _ = load_model(meta["base_model"], dtype=dtype, device=device)
        add_label_tokens(base, tokenizer, fmt, seed=int(meta.get("seed", 0)), init_rows=True)
        lm = PeftModel.from_pretrained(base, str(path))
        if merge:
            lm = lm.merge_and_unload()
    else:
        lm, _ = load_model(str(path), dtype=dtype, device=device)
    label_ids = label_token_ids(tokenizer, fmt)
    head = load_file(str(path / LABEL_HEAD))["weight"] if (path / LABEL_HEAD).is_file() else None
    model = PRMModel(lm, label_ids, head)
    out = lm.get_output_embeddings()  # the LM head agrees with the label head: plain generate scores the same
    write_label_rows((out if out is not None else lm.get_input_embeddings()).weight, label_ids, model.label_head)
    model.to(next(lm.parameters()).device)
    return model.eval(), tokenizer, fmt, meta


def checkpoint_dtype(path: str | Path) -> str:
    """The dtype a PRM checkpoint's weights are stored in (``float32``, ``bfloat16``, ...): its own
    ``config.json`` for a full model, its base model's for a LoRA adapter; ``float32`` if neither says."""
    from codetool.models.loading import resolve_model

    path = Path(path)
    meta = read_prm_config(path)
    folder = Path(resolve_model(meta["base_model"])) if meta.get("adapter") else path
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):  # a Hub id not cached here, a GGUF file: the safe choice
        return "float32"
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return dtype.removeprefix("torch.")


def export_merged(path: str | Path, out_dir: str | Path, *, dtype: str = "auto") -> Path:
    """Write a plain full-model copy of a PRM checkpoint (LoRA merged), for vLLM.

    The folder holds the causal LM with the trained label rows in its LM head (the scores come
    from the head alone), ``config.json`` with the dtype, the tokenizer with the label tokens and
    ``prm_config.json``, and no ``label_head.safetensors``: vLLM loads every ``*.safetensors``
    file of a folder, and a second one would not match its model. :func:`load_prm` reads the
    label rows back from the LM head.

    Args:
        path (`str` or `Path`): a ``codetool train-prm`` checkpoint folder (LoRA or full).
        out_dir (`str` or `Path`): created if needed.
        dtype (`str`, *optional*, defaults to `"auto"`): the stored dtype; ``auto`` keeps the
            checkpoint's own (:func:`checkpoint_dtype`).
    Returns:
        ``out_dir``.
    """
    dtype = checkpoint_dtype(path) if dtype == "auto" else dtype
    # float16 cannot be loaded on the CPU (codetool.models.loading): merge in float32, then cast
    model, tokenizer, _, meta = load_prm(path, device="cpu", dtype="float32" if dtype == "float16" else dtype,
                                         merge=True)
    model.lm.to(getattr(torch, dtype))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.lm.save_pretrained(out_dir)  # load_prm wrote the label head into the LM head rows
    tokenizer.save_pretrained(out_dir)
    config = {k: v for k, v in meta.items() if k not in ("adapter", "label_ids")}
    config.update(label_ids=list(model.label_ids), adapter=False, exported_from=str(path), dtype=dtype)
    (out_dir / PRM_CONFIG).write_text(json.dumps(config, indent=2, default=str))
    return out_dir
