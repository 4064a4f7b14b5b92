"""The hidden-state probe: features from a tiny transformers model, fitting, the saved format,
hand-computed predictions, AUROC and its bootstrap interval, probe decisions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from codetool import CodetoolError
from codetool.decide.probe import (
    Probe,
    auroc,
    auroc_interval,
    fit_probe,
    last_token_states,
    probe_decisions,
    resolve_layers,
)
from codetool.decide.stage import NONE, RouterConfig
from codetool.models.backends import ScriptedBackend


def small_probe(**kw):
    return Probe(coef=np.array([1.0, -2.0]), intercept=0.5, mean=np.array([1.0, 1.0]), scale=np.array([2.0, 1.0]),
                 layers=[3], n_states=4, hidden_size=2, model="tiny", **kw)


def test_prediction_by_hand():
    probe = small_probe()
    # standardised x = ((3 - 1) / 2, (2 - 1) / 1) = (1, 1); logit = 1 - 2 + 0.5 = -0.5
    assert probe.logits(np.array([[3.0, 2.0]])) == pytest.approx([-0.5])
    assert probe.predict(np.array([[3.0, 2.0]])) == pytest.approx([1 / (1 + math.exp(0.5))])
    assert probe.predict(np.array([[3.0, 2.0]]), temperature=2.0) == pytest.approx([1 / (1 + math.exp(0.25))])
    with pytest.raises(CodetoolError, match=r"must be \(n, 2\)"):
        probe.predict(np.zeros((1, 3)))
    with pytest.raises(CodetoolError, match="expected 2"):
        Probe(coef=np.zeros(3), intercept=0.0, mean=np.zeros(2), scale=np.ones(2), layers=[0], n_states=1,
              hidden_size=2, model="x")


def test_resolve_layers():
    assert resolve_layers("all", 4) == [0, 1, 2, 3]
    assert resolve_layers([-1, 0, -1], 4) == [0, 3]
    with pytest.raises(CodetoolError, match="out of range"):
        resolve_layers([4], 4)


def test_fit_save_load_round_trip_without_pickle(tmp_path):
    rng = np.random.default_rng(0)
    y = np.array([0, 1] * 20)
    x = rng.normal(size=(40, 6)) + np.outer(y, [4.0, 0, 0, 0, 0, -4.0])  # two informative features
    probe = fit_probe(x[:30], y[:30], C=1.0, layers=[0, 1], n_states=2, hidden_size=3, model="tiny",
                      info={"split": {"heldout": ["a"]}})
    assert auroc(probe.predict(x[30:]), y[30:]) == 1.0
    assert probe.mean == pytest.approx(x[:30].mean(0), abs=1e-6)  # the scaler's statistics are kept
    folder = probe.save(tmp_path / "p")
    assert sorted(f.name for f in folder.iterdir()) == ["probe.json", "probe.safetensors"]
    meta = json.loads((folder / "probe.json").read_text())
    assert meta["layers"] == [0, 1] and meta["model"] == "tiny" and meta["C"] == 1.0 and "coef" not in meta
    loaded = Probe.load(folder)
    assert loaded.predict(x) == pytest.approx(probe.predict(x), abs=1e-6)
    assert loaded.info == {"split": {"heldout": ["a"]}}
    with pytest.raises(CodetoolError, match="both labels"):
        fit_probe(x[:4], [1, 1, 1, 1], layers=[0, 1], n_states=2, hidden_size=3, model="tiny")
    with pytest.raises(CodetoolError, match="train-probe"):
        Probe.load(tmp_path / "nothing")


def test_auroc_and_its_interval():
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auroc_interval([0.1, 0.9], [0, 1], samples=50) == (1.0, 1.0)
    lo, hi = auroc_interval([0.1, 0.4, 0.35, 0.8, 0.2, 0.7], [0, 0, 1, 1, 0, 1], samples=200, seed=1)
    assert 0.0 <= lo <= auroc([0.1, 0.4, 0.35, 0.8, 0.2, 0.7], [0, 0, 1, 1, 0, 1]) <= hi <= 1.0
    assert auroc_interval([0.1, 0.2], [1, 1]) is None and math.isnan(auroc([0.1], [1]))


def test_features_are_the_last_prompt_token_states(tiny_model_dir):
    import torch

    from codetool.models.backends import TransformersBackend

    backend = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")
    prompts = ["What is the capital of France?", [{"role": "user", "content": "Weather in Paris?"}]]
    config = backend.model.config
    every = last_token_states(backend, prompts)
    assert every.shape == (2, (config.num_hidden_layers + 1) * config.hidden_size) and every.dtype == np.float32
    two = last_token_states(backend, prompts, [0, -1])
    h = config.hidden_size
    assert two[:, :h] == pytest.approx(every[:, :h]) and two[:, h:] == pytest.approx(every[:, -h:])
    # state 0 is the embedding of the prompt's last token (the assistant header's end)
    last = backend.encode(prompts[0])[-1]
    embedding = backend.model.get_input_embeddings().weight[last].detach().float().numpy()
    assert two[0, :h] == pytest.approx(embedding, abs=1e-6)
    alone = last_token_states(backend, prompts[1:], [0, -1])  # one forward per prompt: no padding effects
    assert alone[0] == pytest.approx(two[1], abs=1e-5)
    probe = fit_probe(np.concatenate([two, two + 1]), [0, 0, 1, 1], layers=resolve_layers([0, -1], config.num_hidden_layers + 1),
                      n_states=config.num_hidden_layers + 1, hidden_size=h, model=str(tiny_model_dir))
    decisions = probe_decisions(backend, prompts, probe, RouterConfig(t_probe=0.5))
    p = probe.predict(two)
    for d, value in zip(decisions, p):
        assert d.method == "probe" and d.p_tool == pytest.approx(value)
        assert (d.choice == NONE) == (value < 0.5) and d.prompt_tokens > 5 and d.seconds >= 0
    assert torch.is_grad_enabled()  # inference mode does not leak


def test_backends_without_hidden_states_and_other_models_are_refused(tiny_model_dir):
    with pytest.raises(CodetoolError, match="probe_model"):
        last_token_states(ScriptedBackend(["x"]), ["hi"])
    from codetool.models.backends import TransformersBackend

    backend = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")
    with pytest.raises(CodetoolError, match="train a probe for it"):
        probe_decisions(backend, ["hi"], small_probe(), RouterConfig())
