"""``train-policy``'s config: its rollout composes the search's step group and nothing else (issue 38)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from codetool.config import ConfigError, from_dict, load_config
from codetool.policy.config import TrainPolicyConfig
from codetool.search.config import STEP_KEYS, SearchConfig, StepGroup

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "policy" / "quickstart.yaml"
NOT_READ = sorted(f.name for f in dataclasses.fields(SearchConfig) if f.name not in STEP_KEYS)


def test_the_rollout_is_the_step_group():
    cfg = load_config(TrainPolicyConfig, QUICKSTART)
    assert isinstance(cfg.rollout, StepGroup) and not isinstance(cfg.rollout, SearchConfig)
    assert (cfg.rollout.max_steps, cfg.rollout.constrain, cfg.rollout.observation_cut) == (2, "line", "middle")
    assert len(NOT_READ) >= 22  # the search keys the rollout used to accept and ignore


def test_a_search_key_the_rollout_does_not_read_is_refused_by_name():
    home = {"k": "num_generations", "temperature": "set temperature", "top_p": "set top_p", "seed": "seeds"}
    for key in NOT_READ:
        with pytest.raises(ConfigError) as err:
            from_dict(TrainPolicyConfig, {"rollout": {"max_steps": 2, key: 1}})
        message = str(err.value)
        assert f"rollout.{key} is not read by train-policy" in message and "\n" not in message
        assert home.get(key, f"eval_search.{key}") in message
    with pytest.raises(ConfigError, match="rollout.strategy is not read"):  # on the command line too
        load_config(TrainPolicyConfig, QUICKSTART, {"rollout.strategy": "beam"})


def test_the_step_keys_are_read_and_checked():
    cfg = load_config(TrainPolicyConfig, QUICKSTART, {"rollout.observation_cut": "head"})
    assert cfg.rollout.observation_cut == "head"
    with pytest.raises(ConfigError, match="max_steps must be >= 1"):
        load_config(TrainPolicyConfig, QUICKSTART, {"rollout.max_steps": 0})


def test_the_old_advantage_name_is_refused_naming_the_new_one():
    # 0.2.0 drops the alias: `advantage: process` used to train silently as deepseekmath (issue 42 A.1)
    for where in ({"advantage": "process"}, None):
        with pytest.raises(ConfigError) as err:
            if where:
                from_dict(TrainPolicyConfig, where)
            else:
                load_config(TrainPolicyConfig, QUICKSTART, {"advantage": "process"})
        message = str(err.value)
        assert message == "advantage: 'process' was renamed to 'deepseekmath' in 0.2.0 (docs/MIGRATING.md)."
    assert load_config(TrainPolicyConfig, QUICKSTART, {"advantage": "deepseekmath"}).advantage == "deepseekmath"
    assert TrainPolicyConfig.__dataclass_fields__["advantage"].default == "anchored"
