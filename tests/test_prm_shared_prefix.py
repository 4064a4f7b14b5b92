"""Training with shared prompt prefixes: same logits and gradients as full rows, fewer positions."""

from __future__ import annotations

import pytest
import torch

from codetool.prm.data import PrefixGroupSampler, PRMCollator, tokenize_rows
from codetool.prm.format import PRMFormat, PromptEncoder
from codetool.prm.synthetic import synthetic_rows


@pytest.fixture(scope="module")
def lora_prm(tiny_model_dir):
    from codetool.config import load_config
    from codetool.prm.config import PRMConfig
    from codetool.prm.trainer import build_model

    cfg = load_config(PRMConfig, None, {"model": str(tiny_model_dir), "format.max_length": 512,
                                          "format.max_suffix_length": 192})
    model, tokenizer = build_model(cfg)
    with torch.no_grad():  # LoRA B starts at zero: give the adapters a part in the result
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    return model.train(), PromptEncoder(tokenizer, cfg.format)


def _batch(encoder, rows):
    features, _ = tokenize_rows(rows, encoder)
    return PRMCollator(encoder.label_ids, pad_id=0)(features)


def _loss_and_grads(model, batch, shared: bool):
    model.zero_grad(set_to_none=True)
    logits = model(batch["input_ids"], batch["last_index"], share_prefix=shared)
    loss = torch.nn.functional.cross_entropy(logits, batch["target"])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _positions(model, batch, shared: bool) -> int:
    """Token positions the decoder computes in one forward."""
    seen = []
    hook = model.decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True)
    try:
        with torch.no_grad():
            model(batch["input_ids"], batch["last_index"], share_prefix=shared)
    finally:
        hook.remove()
    return sum(seen)


@pytest.mark.parametrize("mode", ["packed", "trie"])
def test_shared_prefix_gives_the_same_logits_and_gradients_with_fewer_positions(lora_prm, mode):
    model, encoder = lora_prm
    # two queries x two steps x two candidates, interleaved, plus a lone row of a third query
    rows = synthetic_rows(2, steps=2, candidates=2, extra_tools=0)
    rows = rows[::2] + rows[1::2] + synthetic_rows(1, steps=1, candidates=1, extra_tools=0, seed=7)
    batch = _batch(encoder, rows)
    full_logits, full_grads = _loss_and_grads(model, batch, shared=False)
    shared_logits, shared_grads = _loss_and_grads(model, batch, shared=mode)
    torch.testing.assert_close(shared_logits, full_logits, atol=1e-5, rtol=1e-4)
    assert full_grads.keys() == shared_grads.keys() and any("lora_A" in n for n in full_grads)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-3, msg=name)
    full, shared = _positions(model, batch, False), _positions(model, batch, mode)
    real = int((batch["last_index"] + 1).sum())
    assert shared < 0.6 * real <= full, (shared, real, full)


@pytest.mark.parametrize("mode", ["packed", "trie"])
def test_identical_rows_and_rows_that_are_prefixes_of_others(lora_prm, mode):
    model, _ = lora_prm
    base = list(range(5, 45))
    rows = [base, base, base[:30], base[:30] + [3, 4], [7] * 20 + base[:10], base[:18] + [9] * 5]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    last = torch.tensor([len(r) - 1 for r in rows])
    with torch.no_grad():
        torch.testing.assert_close(model(ids, last, share_prefix=mode), model(ids, last), atol=1e-5, rtol=1e-4)
        assert model(ids[:1], last[:1], share_prefix=mode).shape == (1, 2)


def test_prefix_group_sampler_fills_batches_with_one_group_where_it_can():
    # groups of 8, 4, 2, 2, 3 rows; batch 4
    groups = [0] * 8 + [1] * 4 + [2] * 2 + [3] * 2 + [4] * 3
    lengths = list(range(len(groups)))
    sampler = PrefixGroupSampler(groups, lengths, batch_size=4, seed=3)
    batches = sampler.batches()
    assert sorted(i for b in batches for i in b) == list(range(len(groups))) == sorted(sampler)
    assert len(sampler) == len(groups) and all(len(b) == 4 for b in batches[:-1]) and len(batches[-1]) == 3
    whole = sorted(tuple(sorted({groups[i] for i in b})) for b in batches)
    assert whole.count((0,)) == 2 and whole.count((1,)) == 1  # groups of >= 4 rows fill their own batches
    for b in batches:  # rows of a group keep dataset order inside a batch
        for g in {groups[i] for i in b}:
            rows = [i for i in b if groups[i] == g]
            assert rows == sorted(rows)
    assert sampler.batches() == batches  # same epoch, same order
    sampler.set_epoch(1)
    assert sorted(sampler) == list(range(len(groups)))


def test_rows_of_one_query_share_a_query_group(tiny_model_dir):
    from transformers import AutoTokenizer

    from codetool.prm.modeling import add_label_tokens

    fmt = PRMFormat(max_length=512, max_suffix_length=192)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    add_label_tokens(None, tokenizer, fmt)
    rows = synthetic_rows(2, steps=2, candidates=2, extra_tools=0)
    features, _ = tokenize_rows(rows, PromptEncoder(tokenizer, fmt))
    by_query: dict[str, set[int]] = {}
    for row, feature in zip(rows, features):
        by_query.setdefault(row["query_id"], set()).add(feature["query_group"])
    assert sorted(len(v) for v in by_query.values()) == [1, 1] and len(set.union(*by_query.values())) == 2


def test_trainer_shares_prefixes_with_checkpointing_too_but_never_through_the_trie(tiny_model_dir, tmp_path):
    from codetool.config import load_config
    from codetool.jsonl import write_jsonl
    from codetool.prm.config import PRMConfig
    from codetool.prm.trainer import build_trainer

    data = tmp_path / "rows.jsonl"
    write_jsonl(data, synthetic_rows(6, steps=1, candidates=2, extra_tools=0))
    for checkpointing, asked, expected in ((False, "trie", "trie"), (True, "trie", "packed"), (False, "none", "none"),
                                           (True, "auto", "auto")):
        cfg = load_config(PRMConfig, None, {"share_prefix": asked,
            "model": str(tiny_model_dir), "dataset": [str(data)], "output_dir": str(tmp_path / str(checkpointing)),
            "format.max_length": 512, "format.max_suffix_length": 192, "max_steps": 3, "per_device_train_batch_size": 4,
            "eval_fraction": 0.0, "resume": "none", "gradient_checkpointing": checkpointing, "save_steps": 100})
        trainer = build_trainer(cfg)
        assert trainer.share_prefix == expected
        assert isinstance(trainer._get_train_sampler(), PrefixGroupSampler) is (expected != "none")
        result = trainer.train()
        assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
        if asked == "auto":  # measured on the first batch; the trie is out under checkpointing
            assert trainer.model.share_mode in ("packed", "none")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_the_unshared_one_on_qwen2_and_llama_shapes(arch, attn):
    """fp32 logits and gradients of the packed block-mask forward equal one causal forward per row."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from codetool.prm.modeling import PRMModel

    kwargs = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, attn_implementation=attn)
    config = Qwen2Config(**kwargs) if arch == "qwen2" else LlamaConfig(**kwargs)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config).float()
    model = PRMModel(lm, (95, 96)).train()
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 90, (40,), generator=g).tolist()
    rows = [prefix + torch.randint(3, 90, (n,), generator=g).tolist() for n in (5, 9, 1, 12)]
    rows += [prefix[:20] + [4] * 20, torch.randint(3, 90, (25,), generator=g).tolist()]  # a shorter share, a lone row
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    last = torch.tensor([len(r) - 1 for r in rows])
    target = torch.tensor([0, 1, 0, 1, 1, 0])
    results = {}
    for mode in ("none", "packed"):
        model.zero_grad(set_to_none=True)
        logits = model(ids, last, share_prefix=mode)
        torch.nn.functional.cross_entropy(logits, target).backward()
        results[mode] = logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(results["packed"][0], results["none"][0], atol=1e-5, rtol=1e-5)
    for name, grad in results["none"][1].items():
        torch.testing.assert_close(results["packed"][1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_plan_groups_shares_where_it_saves_positions():
    from codetool.prm.packing import pack_rows, plan_groups

    a, b = list(range(100, 140)), list(range(200, 240))
    rows = [a + [1, 2], a + [3], b + [4, 5, 6], [7, 8], a[:30] + [9]]
    plan = sorted((shared, sorted(members)) for shared, members in plan_groups(rows, min_shared=16))
    assert plan == [(0, [1 - 1 + 2]), (0, [3]), (30, [0, 1, 4])]  # rows 0, 1, 4 share a[:30]; b and [7, 8] alone
    packed = pack_rows(rows, min_shared=16, max_tokens=4096)
    assert packed.input_ids.shape == (1, 30 + 12 + 11 + 1 + 43 + 2)
    mask = packed.attention_mask[0, 0]
    row, pos = packed.gather[0].tolist()
    assert packed.position_ids[0, pos] == len(rows[0]) - 1
    assert int(mask[pos].sum()) == len(rows[0])  # the prefix and its own suffix, not its siblings


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_scores_match_per_row_scores_in_bf16_on_cuda():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from codetool.prm.modeling import PRMModel

    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    with torch.device("cuda"):
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = PRMModel(lm, (126, 127)).cuda().eval()
    prefix = list(range(3, 103))
    rows = [prefix + [5 + i] * (3 + i) for i in range(8)]
    with torch.inference_mode():
        packed = torch.softmax(model.logits_of_rows(rows, "packed"), -1)[:, 0]
        single = torch.cat([torch.softmax(model.logits_of_rows([r], "none"), -1)[:, 0] for r in rows])
    assert float((packed - single).abs().max()) < 1e-2  # bf16 rounding
    assert model.pick_share_mode(*_pad(rows, "cuda")) in ("packed", "trie", "none")


def _pad(rows, device):
    width = max(map(len, rows))
    return (torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device),
            torch.tensor([len(r) - 1 for r in rows], device=device))


def test_auto_decides_by_rule_without_running_the_batch(monkeypatch):
    """Before (issue 40): auto timed three forwards of the first batch (8 minutes for a 14-row
    dataset of a 7B model on CPU). Now it counts positions and runs nothing."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from codetool.prm.modeling import PRMModel, unique_positions

    assert unique_positions([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6], [9]]) == 7  # 1 2 3 4 | 5 | 6 | 9
    config = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")
    model = PRMModel(AutoModelForCausalLM.from_config(config), (126, 127)).eval()
    monkeypatch.setattr(model, "_full", lambda *a: (_ for _ in ()).throw(AssertionError("ran a forward")))
    monkeypatch.setattr(model, "_packed", lambda *a: (_ for _ in ()).throw(AssertionError("ran a forward")))
    shared = [list(range(3, 103)) + [5 + i] * 3 for i in range(4)]
    assert model.pick_share_mode(*_pad(shared, "cpu")) == "packed" and model.share_mode == "packed"
    apart = [[10 + i] * 50 for i in range(4)]
    assert model.pick_share_mode(*_pad(apart, "cpu")) == "none"
    monkeypatch.setattr(model, "packing_supported", lambda: False)  # e.g. FlashAttention-2
    assert model.pick_share_mode(*_pad(shared, "cpu")) == "trie"
    model.activation_checkpointing = True  # no KV cache to share through
    assert model.pick_share_mode(*_pad(shared, "cpu")) == "none"
