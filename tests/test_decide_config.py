"""``codetool.decide.config``: the decide-first commands' settings parse their model specs once.

The parsed :class:`ModelSpec` is kept beside the settings (not in ``to_dict``, hashes or flags)
and is what the command hands to ``assemble.make_policy``.
"""

from __future__ import annotations

import pytest

from codetool import CodetoolError
from codetool.config import config_hash, to_dict
from codetool.decide.config import DecisionEvalConfig, TrainProbeConfig
from codetool.decide.stage import RouterConfig
from codetool.models.spec import ModelSpec


def test_eval_decision_parses_the_policy_decider_and_probe_model_once():
    cfg = DecisionEvalConfig(model="http://127.0.0.1:9/v1", decider="vllm:some/model", dtype="bfloat16",
                             device="cpu", router=RouterConfig(probe_model="default"))
    assert (cfg.model_spec.kind, cfg.model_spec.location) == ("openai", "http://127.0.0.1:9/v1")
    assert (cfg.decider_spec.kind, cfg.decider_spec.location, cfg.decider_spec.dtype) == ("vllm", "some/model", "bfloat16")
    assert (cfg.probe_spec.kind, cfg.probe_spec.device) == ("local", "cpu")
    assert "model_spec" not in to_dict(cfg) and config_hash(cfg) == config_hash(DecisionEvalConfig(
        model="http://127.0.0.1:9/v1", decider="vllm:some/model", dtype="bfloat16", device="cpu",
        router=RouterConfig(probe_model="default")))


def test_eval_decision_without_a_decider_or_probe_model_has_no_spec_for_them():
    cfg = DecisionEvalConfig()
    assert cfg.model_spec == ModelSpec.parse("default", dtype="auto", device="auto")
    assert cfg.decider_spec is None and cfg.probe_spec is None


@pytest.mark.parametrize("make", [lambda: DecisionEvalConfig(model=""), lambda: TrainProbeConfig(model=" ")])
def test_an_empty_model_is_refused_when_the_config_is_built(make):
    with pytest.raises(CodetoolError, match="no model given for the policy"):
        make()


def test_train_probe_parses_its_model_once():
    cfg = TrainProbeConfig(model="some/model", dtype="float32")
    assert (cfg.model_spec.kind, cfg.model_spec.location, cfg.model_spec.dtype) == ("local", "some/model", "float32")
    assert "model_spec" not in to_dict(cfg)


def test_the_commands_hand_the_parsed_spec_to_make_policy(monkeypatch, tmp_path):
    from codetool.commands import train_probe

    seen = []

    def make_policy(spec, **kwargs):
        seen.append(spec)
        raise RuntimeError("stop here")

    monkeypatch.setattr("codetool.assemble.make_policy", make_policy)
    monkeypatch.setattr("codetool.decide.necessity.draw_items", lambda cfg: (["an item"], {}))
    cfg = TrainProbeConfig(model="some/model", output=str(tmp_path / "o"))
    with pytest.raises(RuntimeError, match="stop here"):
        train_probe.train_probe_command(cfg)
    assert seen == [cfg.model_spec] and isinstance(seen[0], ModelSpec)
