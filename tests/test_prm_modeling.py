"""Label tokens, the PRM model and its checkpoints (codetool.prm.modeling)."""

from __future__ import annotations

import pytest
import torch

from codetool import CodetoolError
from codetool.models.loading import load_model
from codetool.prm.folder import load_prm, new_prm, read_prm_config, save_prm
from codetool.prm.format import PRMFormat
from codetool.prm.modeling import PRMModel, add_label_tokens, is_tied


def _base(path):
    return load_model(str(path), dtype="float32", device="cpu")


def test_labels_are_added_as_new_special_tokens(tiny_model_dir):
    model, tok = _base(tiny_model_dir)
    rows = model.get_input_embeddings().weight.shape[0]
    pos, neg = add_label_tokens(model, tok, PRMFormat())
    assert (pos, neg) == (len(tok) - 2, len(tok) - 1)
    assert model.get_input_embeddings().weight.shape[0] == rows + 2
    assert tok.convert_ids_to_tokens([pos, neg]) == ["<|prm_pos|>", "<|prm_neg|>"]
    # calling again (a reloaded tokenizer) adds nothing
    assert add_label_tokens(model, tok, PRMFormat()) == (pos, neg)
    assert model.get_input_embeddings().weight.shape[0] == rows + 2


def test_shrink_embeddings_case_matrix_never_shrinks(tiny_model_dir):
    """Field case shrink-embeddings: with spare rows (tokenizer smaller than the matrix, like
    Qwen2.5), adding the labels keeps the matrix size and uses rows inside it."""
    model, tok = _base(tiny_model_dir)
    model.resize_token_embeddings(len(tok) + 30, mean_resizing=False)
    before = model.get_input_embeddings().weight.shape[0]
    ids = add_label_tokens(model, tok, PRMFormat())
    assert model.get_input_embeddings().weight.shape[0] == before == len(tok) + 28
    assert max(ids) < before


def test_new_rows_are_deterministic_and_near_the_mean(tiny_model_dir):
    rows = []
    for _ in range(2):
        model, tok = _base(tiny_model_dir)
        ids = add_label_tokens(model, tok, PRMFormat(), seed=5)
        rows.append(model.get_input_embeddings().weight[list(ids)].detach().clone())
    assert torch.equal(rows[0], rows[1])
    weight = model.get_input_embeddings().weight.detach()
    mean = weight[: min(ids)].mean(0)
    assert torch.allclose(rows[0], mean.expand(2, -1), atol=0.1 * weight[: min(ids)].std().item())
    assert not torch.equal(rows[0][0], rows[0][1])


def test_existing_label_mode_leaves_model_and_tokenizer_alone(tiny_model_dir):
    model, tok = _base(tiny_model_dir)
    n, weight = len(tok), model.get_input_embeddings().weight.detach().clone()
    single = [t for t in ("+", "-") if len(tok.encode(t, add_special_tokens=False)) == 1]
    assert len(single) == 2
    ids = add_label_tokens(model, tok, PRMFormat(label_tokens=single, label_mode="existing"))
    assert len(tok) == n and torch.equal(model.get_input_embeddings().weight, weight)
    assert ids == (tok.convert_tokens_to_ids("+"), tok.convert_tokens_to_ids("-"))


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_untied_model_dir"])
def test_label_logits_equal_the_lm_head_logits(fixture, request):
    """The (2, hidden) label head gives exactly the LM's logits for the two label tokens."""
    model, tok = new_prm(str(request.getfixturevalue(fixture)), PRMFormat(), dtype="float32", device="cpu")
    assert is_tied(model.lm) == (fixture == "tiny_model_dir")
    ids = torch.tensor([[5, 9, 13, 21, 34], [3, 4, 5, 6, 7]])
    with torch.no_grad():
        ours = model(ids, torch.tensor([4, 4]))
        full = model.lm(input_ids=ids).logits[:, -1, list(model.label_ids)]
    assert ours.shape == (2, 2) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("adapter", [False, True])
def test_checkpoint_round_trip(adapter, tiny_model_dir, tmp_path):
    fmt = PRMFormat(max_length=512, max_suffix_length=128)
    model, tok = new_prm(str(tiny_model_dir), fmt, dtype="float32", device="cpu")
    lm = model.lm
    if adapter:
        from peft import LoraConfig, get_peft_model

        lm = get_peft_model(lm, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    prm = PRMModel(lm, model.label_ids)
    with torch.no_grad():
        prm.label_head.add_(torch.randn_like(prm.label_head))
    save_prm(tmp_path / "ckpt", prm, tok, {"base_model": str(tiny_model_dir), "format": fmt.__dict__, "seed": 0})
    assert read_prm_config(tmp_path / "ckpt")["adapter"] is adapter
    loaded, tok2, fmt2, _ = load_prm(tmp_path / "ckpt", device="cpu", dtype="float32")
    assert fmt2 == fmt and len(tok2) == len(tok)
    ids = torch.tensor([[5, 9, 13, 21, 34]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, torch.tensor([4])), prm.eval()(ids, torch.tensor([4])),
                                   atol=1e-5, rtol=1e-5)
        # the plain LM head carries the trained label rows too (generate/vLLM agree)
        head = loaded.lm(input_ids=ids).logits[:, -1, list(loaded.label_ids)]
        torch.testing.assert_close(head, loaded(ids, torch.tensor([4])), atol=1e-5, rtol=1e-5)


def test_load_prm_rejects_a_plain_folder(tmp_path):
    with pytest.raises(CodetoolError, match="not a PRM checkpoint"):
        load_prm(tmp_path)


# ---- the device bug class: label rows computed or written on another device / in another dtype

def test_label_rows_follow_a_bfloat16_model(tiny_model_dir):
    """bf16 weights get the same rows as fp32 ones, rounded (noise made in fp32, cast once)."""
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, tok = _base(tiny_model_dir)
        model.to(dtype)
        ids = add_label_tokens(model, tok, PRMFormat(), seed=3)
        weight = model.get_input_embeddings().weight
        assert weight.dtype == dtype
        rows[dtype] = weight[list(ids)].detach().float()
    torch.testing.assert_close(rows[torch.bfloat16], rows[torch.float32], atol=2e-2, rtol=1e-2)


def test_label_rows_on_the_meta_device(tiny_untied_model_dir):
    """A model on the meta device (no values: FSDP/ZeRO-3 init) stays there; CPU noise does not meet it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from codetool.prm.modeling import write_label_rows

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_untied_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_untied_model_dir)
    ids = add_label_tokens(model, tok, PRMFormat())
    assert model.get_input_embeddings().weight.is_meta and model.get_output_embeddings().weight.is_meta
    write_label_rows(model.get_output_embeddings().weight, ids, torch.ones(2, model.config.hidden_size))
    prm = PRMModel(model, ids)
    with pytest.raises(CodetoolError, match="meta device"):
        save_prm("/nonexistent/never-written", prm, tok, {})


def test_save_and_load_a_bfloat16_prm_keep_the_label_rows(tiny_untied_model_dir, tmp_path):
    """fp32 label head, bf16 model: saved and loaded LM-head rows are the head in bf16."""
    fmt = PRMFormat()
    model, tok = new_prm(str(tiny_untied_model_dir), fmt, dtype="bfloat16", device="cpu")
    with torch.no_grad():
        model.label_head.copy_(torch.linspace(-1, 1, model.label_head.numel()).view_as(model.label_head))
    assert model.label_head.dtype == torch.float32 and next(model.lm.parameters()).dtype == torch.bfloat16
    save_prm(tmp_path / "prm", model, tok, {"base_model": str(tiny_untied_model_dir), "format": {}, "seed": 0})
    loaded, *_ = load_prm(tmp_path / "prm", device="cpu", dtype="bfloat16")
    out = loaded.lm.get_output_embeddings().weight
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out[list(loaded.label_ids)], model.label_head.to(torch.bfloat16))
    torch.testing.assert_close(loaded.label_head, model.label_head)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_new_save_load_and_score_on_cuda(tiny_model_dir, tmp_path, finetune):
    from codetool.prm.format import item_from_row
    from codetool.prm.scorer import LocalPRMScorer
    from codetool.prm.synthetic import synthetic_rows

    fmt = PRMFormat(max_length=512, max_suffix_length=192)
    model, tok = new_prm(str(tiny_model_dir), fmt, dtype="bfloat16", device="cuda")
    assert model.label_head.device.type == "cuda"
    if finetune == "lora":
        from peft import LoraConfig, get_peft_model

        model.lm = get_peft_model(model.lm, LoraConfig(r=4, target_modules="all-linear"))
    save_prm(tmp_path / "p", model, tok, {"base_model": str(tiny_model_dir), "format": fmt.__dict__, "seed": 0})
    scorer = LocalPRMScorer.from_checkpoint(tmp_path / "p", device="cuda", dtype="bfloat16")
    scores = scorer.score([item_from_row(r) for r in synthetic_rows(2, steps=1, candidates=3, extra_tools=0)])
    assert all(0.0 <= s <= 1.0 for s in scores)
