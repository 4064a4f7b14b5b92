"""VLLMScorer against LocalPRMScorer on the same checkpoints and items, with the real vLLM (CPU build).

Runs in CI's vLLM stage (``scripts/ci_vllm.sh``) as ``pytest -m vllm``; skipped elsewhere. The
checkpoints are made from the embedded 135M model in float32, their label rows copied from two
real tokens' rows so that the scores vary with the item: a full one and a LoRA one (random,
non-zero adapter weights, so the merge matters). Scores must agree within ``TOLERANCE`` (absolute, on the [0, 1] score) for one
call with every item (siblings share a prefix) and one call per item, with vLLM's prefix caching
on and off. The largest difference seen is printed (``vllm-agreement ...``) for the record.
"""

from __future__ import annotations

import dataclasses
import gc
import json

import pytest
import torch

from tests.vllm_support import ENGINE, default_model, require_vllm

pytestmark = pytest.mark.vllm
require_vllm()

TOLERANCE = 1e-4  # float32 on both sides; vLLM's CPU attention and torch's sdpa round differently


def _format():
    from codetool.prm.format import PRMFormat

    return PRMFormat(max_length=1024, max_suffix_length=256)


def _label_rows_from(model, tokenizer, pair: tuple[str, str]) -> None:
    """Label rows = the output rows of two real tokens: the score then depends on the item (with
    the untrained mean-plus-noise rows every score is ~0.5, which would test nothing)."""
    weight = model.lm.get_input_embeddings().weight  # tied: the output rows too
    model.label_head.data = weight[[tokenizer.convert_tokens_to_ids(t) for t in pair]].detach().float().clone()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    from codetool.prm.folder import new_prm, save_prm
    from codetool.prm.modeling import PRMModel

    root = tmp_path_factory.mktemp("vllm-prm")
    fmt = _format()
    meta = {"base_model": default_model(), "format": dataclasses.asdict(fmt), "seed": 0}
    full, tokenizer = new_prm(default_model(), fmt, dtype="float32", device="cpu", seed=0)
    _label_rows_from(full, tokenizer, ("yes", "no"))
    save_prm(root / "full", full, tokenizer, meta)
    torch.manual_seed(0)
    lm = get_peft_model(full.lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False, task_type="CAUSAL_LM"))
    lora = PRMModel(lm, full.label_ids)
    _label_rows_from(lora, tokenizer, ("result", "print"))
    save_prm(root / "lora", lora, tokenizer, meta)
    return root


@pytest.fixture(scope="module")
def items():
    from codetool.prm.format import item_from_row
    from codetool.prm.synthetic import synthetic_rows

    rows = synthetic_rows(3, steps=2, candidates=2, extra_tools=1)  # 12 items, sibling pairs
    return [item_from_row(r) for r in rows]


def _local(path):
    from codetool.prm.scorer import LocalPRMScorer

    return LocalPRMScorer.from_checkpoint(path, device="cpu", dtype="float32")


def test_export_is_what_vllm_loads(checkpoints):
    """The served folder holds the merged model alone (no label_head.safetensors), in float32."""
    from codetool.prm.vllm_backend import served_folder

    folder = served_folder(checkpoints / "lora")
    assert folder == checkpoints / "lora" / "vllm"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    assert json.loads((folder / "prm_config.json").read_text())["dtype"] == "float32"
    assert served_folder(checkpoints / "lora") == folder  # exported once


@pytest.mark.parametrize("kind,prefix_caching", [("full", True), ("full", False), ("lora", True)])
def test_scores_equal_local(checkpoints, items, kind, prefix_caching):
    from codetool.prm.vllm_backend import VLLMScorer

    path = checkpoints / kind
    local = _local(path)
    expected = local.score(items)
    assert max(expected) - min(expected) > 0.05  # a test that can tell scores apart
    assert local.score(items[:1]) == pytest.approx(expected[:1], abs=1e-5)
    scorer = VLLMScorer(str(path), enable_prefix_caching=prefix_caching, max_num_seqs=8,
                        enforce_eager=ENGINE["enforce_eager"])
    try:
        assert scorer.dtype == "float32"  # the checkpoint's own dtype, not vLLM's bfloat16 default
        batched = scorer.score(items)
        single = [scorer.score([item])[0] for item in items]
    finally:
        scorer.llm = None
        gc.collect()
    worst = max(max(abs(a - b) for a, b in zip(batched, expected)), max(abs(a - b) for a, b in zip(single, expected)))
    print(f"vllm-agreement {kind} prefix_caching={prefix_caching}: {len(items)} items, max |vLLM - local| = "
          f"{worst:.2e} (tolerance {TOLERANCE:g})")
    assert worst < TOLERANCE, (batched, single, expected)
