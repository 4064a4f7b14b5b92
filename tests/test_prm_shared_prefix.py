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
    from codetool.prm.train import TrainConfig, build_model

    cfg = load_config(TrainConfig, None, {"model": str(tiny_model_dir), "format.max_length": 512,
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


def test_shared_prefix_gives_the_same_logits_and_gradients_with_fewer_positions(lora_prm):
    model, encoder = lora_prm
    # two queries x two steps x two candidates, interleaved, plus a lone row of a third query
    rows = synthetic_rows(2, steps=2, candidates=2, extra_tools=0)
    rows = rows[::2] + rows[1::2] + synthetic_rows(1, steps=1, candidates=1, extra_tools=0, seed=7)
    batch = _batch(encoder, rows)
    full_logits, full_grads = _loss_and_grads(model, batch, shared=False)
    shared_logits, shared_grads = _loss_and_grads(model, batch, shared=True)
    torch.testing.assert_close(shared_logits, full_logits, atol=1e-5, rtol=1e-4)
    assert full_grads.keys() == shared_grads.keys() and any("lora_A" in n for n in full_grads)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-3, msg=name)
    full, shared = _positions(model, batch, False), _positions(model, batch, True)
    real = int((batch["last_index"] + 1).sum())
    assert shared < 0.6 * real <= full, (shared, real, full)


def test_identical_rows_and_rows_that_are_prefixes_of_others(lora_prm):
    model, _ = lora_prm
    base = list(range(5, 45))
    rows = [base, base, base[:30], base[:30] + [3, 4], [7] * 20 + base[:10], base[:18] + [9] * 5]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    last = torch.tensor([len(r) - 1 for r in rows])
    with torch.no_grad():
        torch.testing.assert_close(model(ids, last, share_prefix=True), model(ids, last), atol=1e-5, rtol=1e-4)
        assert model(ids[:1], last[:1], share_prefix=True).shape == (1, 2)


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


def test_trainer_shares_prefixes_unless_activation_checkpointing(tiny_model_dir, tmp_path):
    from codetool.config import load_config
    from codetool.jsonl import write_jsonl
    from codetool.prm.train import TrainConfig, build_trainer

    data = tmp_path / "rows.jsonl"
    write_jsonl(data, synthetic_rows(6, steps=1, candidates=2, extra_tools=0))
    for checkpointing, expected in ((False, True), (True, False)):
        cfg = load_config(TrainConfig, None, {
            "model": str(tiny_model_dir), "dataset": [str(data)], "output_dir": str(tmp_path / str(checkpointing)),
            "format.max_length": 512, "format.max_suffix_length": 192, "max_steps": 3, "batch_size": 4,
            "eval_fraction": 0.0, "resume": "none", "gradient_checkpointing": checkpointing, "save_steps": 100})
        trainer = build_trainer(cfg)
        assert trainer.share_prefix is expected
        assert isinstance(trainer._get_train_sampler(), PrefixGroupSampler) is expected
        result = trainer.train()
        assert result.global_step == 3 and torch.isfinite(torch.tensor(result.training_loss))
