"""PRM scoring (codetool.prm.scorer): shared-prefix batching equals the plain forward."""

from __future__ import annotations

import math

import pytest
import torch

from codetool import CodetoolError
from codetool.models.spec import ModelSpec
from codetool.prm.folder import new_prm
from codetool.prm.format import PRMFormat, item_from_row
from codetool.prm.scorer import LocalPRMScorer, load_scorer, reference_scores
from codetool.prm.synthetic import synthetic_rows
from codetool.rewards import PRMItem, PRMScorer

FMT = PRMFormat(max_length=768, max_suffix_length=160)


def _items(n_queries=2, candidates=3):
    return [item_from_row(r) for r in synthetic_rows(n_queries, steps=2, candidates=candidates, extra_tools=1)]


@pytest.fixture(scope="module")
def tied(tiny_model_dir):
    return new_prm(str(tiny_model_dir), FMT, dtype="float32", device="cpu")


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_untied_model_dir"])
def test_shared_prefix_scores_equal_the_unbatched_reference(fixture, request):
    model, tok = new_prm(str(request.getfixturevalue(fixture)), FMT, dtype="float32", device="cpu")
    # a spread of scores, not all ~0.5: the tiny tokenizer is trained on the package's own source, so the
    # tiny model changes with every change to the code; x400 keeps the spread well above 1e-3 (x40 gave 9e-4)
    with torch.no_grad():
        model.label_head.mul_(400.0)
        model.lm.get_output_embeddings().weight[list(model.label_ids)] = model.label_head
    scorer = LocalPRMScorer(model, tok, FMT)
    assert isinstance(scorer, PRMScorer)
    items = _items()
    fast = scorer.score(items)
    ref = reference_scores(model, scorer.encoder, items)
    assert max(abs(a - b) for a, b in zip(fast, ref)) < 1e-4
    assert max(fast) - min(fast) > 1e-3, (max(fast), min(fast))
    assert scorer.stats["groups"] == 4 and scorer.stats["items"] == len(items)


def test_order_lone_items_and_small_batches(tied):
    model, tok = tied
    items = _items(2, candidates=3)
    lone = PRMItem(query="a different query", tools="", history=[], candidate="print(1)", candidate_output="1")
    mixed = [items[0], lone, items[1], items[5], items[2]]
    want = reference_scores(model, LocalPRMScorer(model, tok, FMT).encoder, mixed)
    for max_tokens in (16384, 600):  # 600 forces one suffix per forward and full prompts one by one
        got = LocalPRMScorer(model, tok, FMT, max_batch_tokens=max_tokens).score(mixed)
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    no_share = LocalPRMScorer(model, tok, FMT, share_prefix=False).score(mixed)
    assert max(abs(a - b) for a, b in zip(no_share, want)) < 1e-4
    assert LocalPRMScorer(model, tok, FMT).score([]) == []


def test_score_range_case_negative_logits_give_a_softmax_not_a_ratio(tied):
    """Field case score-range: label logits -3 and -1 give softmax 1/(1+e^2) = 0.1192, in [0, 1],
    where the public code's ratio of raw logits would give 3.0."""
    model, tok = tied
    scorer = LocalPRMScorer(model, tok, FMT)
    item = _items(1, candidates=2)[0]
    enc = scorer.encoder.encode(item)
    with torch.no_grad():
        hidden = model.decoder()(input_ids=torch.tensor([enc.input_ids])).last_hidden_state[0, -1]
        direction = hidden / hidden.dot(hidden)
        original = model.label_head.detach().clone()
        model.label_head.copy_(torch.stack([-3.0 * direction, -1.0 * direction]))
    try:
        logits = model(torch.tensor([enc.input_ids]), torch.tensor([len(enc.input_ids) - 1]))[0]
        assert logits[0].item() == pytest.approx(-3.0, abs=1e-4) and logits[1].item() == pytest.approx(-1.0, abs=1e-4)
        (score,) = scorer.score([item])
        assert score == pytest.approx(1.0 / (1.0 + math.exp(2.0)), abs=1e-4)
        assert 0.0 <= score <= 1.0
    finally:
        with torch.no_grad():
            model.label_head.copy_(original)


def _prm(text: str) -> ModelSpec:
    return ModelSpec.parse(text, role="prm")


def test_load_scorer_specs(tmp_path):
    assert load_scorer(_prm("none")) is None and load_scorer(_prm("")) is None
    with pytest.raises(CodetoolError, match="no such PRM folder"):
        load_scorer(_prm(str(tmp_path / "missing")))
    with pytest.raises(CodetoolError, match="not a PRM checkpoint"):
        load_scorer(_prm(str(tmp_path)))
    with pytest.raises(TypeError, match="parsed PRM ModelSpec"):
        load_scorer(str(tmp_path))
    from codetool.prm.client import HTTPScorer

    client = load_scorer(_prm("http://127.0.0.1:9"))
    assert isinstance(client, HTTPScorer) and isinstance(client, PRMScorer)
    with pytest.raises(CodetoolError, match="cannot connect"):
        client.score(_items(1, candidates=2)[:1])


def test_vllm_spec_without_vllm_says_how_to_install(tmp_path):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    with pytest.raises(CodetoolError, match="pip install 'codetool\\[vllm\\]'"):
        load_scorer(_prm(f"vllm:{tmp_path}"))
