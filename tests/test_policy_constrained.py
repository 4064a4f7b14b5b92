"""Log-probabilities under the constrained distribution a step was sampled from (issue 38)."""

from __future__ import annotations

import math

import pytest
import torch

from codetool.models.call_mask import CallLogitsProcessor, TokenTrie, allowed_along
from codetool.models.constraint import CallConstraint
from codetool.models.transformers_backend import TransformersBackend
from codetool.policy.constrained import mask_ids, masked_logps

NAMES = ("get_weather_for_city", "search_movie")


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return TransformersBackend(str(tiny_model_dir), max_batch_size=4)


def test_masked_log_probabilities_by_hand():
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    table = [torch.tensor([True, False, True])]
    ids = torch.tensor([[0, -1]])
    logps, ent = masked_logps(logits, torch.tensor([[2, 1]]), ids, table, temperature=0.5, entropy=True)
    # position 0: temperature 0.5, token 1 masked: log(e^6 / (e^2 + e^6)); position 1: free, uniform
    assert logps[0, 0].item() == pytest.approx(6 - math.log(math.exp(2) + math.exp(6)), rel=1e-5)
    assert logps[0, 1].item() == pytest.approx(-math.log(3), rel=1e-6)
    p = torch.tensor([math.exp(2), math.exp(6)]) / (math.exp(2) + math.exp(6))
    assert ent[0, 0].item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-5)
    assert ent[0, 1].item() == pytest.approx(math.log(3), rel=1e-6)
    assert mask_ids([[(0, 0), (5, 0)], []], 3).tolist() == [[0, -1, -1], [-1, -1, -1]]


def test_the_replayed_masks_are_the_ones_generation_applied(backend):
    trie = TokenTrie(backend.tokenizer)
    constraint = CallConstraint.for_functions(NAMES, shape="line", assign=True, ends=False)
    [[sample]] = backend.generate_ids([backend.tokenizer("say it", add_special_tokens=False)["input_ids"]], n=1,
                                      temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, constraint=[constraint])
    tokens = sample.token_ids
    vocab = backend.model.get_output_embeddings().weight.shape[0]
    masks = allowed_along(trie, constraint, tokens, vocab)
    assert masks[0] is not None and all(m is None or bool(m[t]) for m, t in zip(masks, tokens))
    # the processor, fed the same tokens one at a time as generate() feeds it, masks the same entries
    processor = CallLogitsProcessor(trie, [constraint], 0, vocab)
    for k in range(len(tokens)):
        scores = processor(torch.tensor([tokens[:k]], dtype=torch.long).reshape(1, k), torch.zeros(1, vocab))
        finite = torch.isfinite(scores[0])
        assert torch.equal(finite, masks[k] if masks[k] is not None else torch.ones(vocab, dtype=torch.bool))
    # a free step has no mask
    assert allowed_along(trie, None, tokens, vocab) == [None] * len(tokens)
