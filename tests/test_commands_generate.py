"""``codetool generate`` (codetool.commands.generate) on the tiny model."""

from __future__ import annotations

import pytest

from codetool.commands.generate import GenerateConfig, generate_command
from codetool.config import ConfigError


def test_generate_command_prints_completion_and_speed(tiny_model_dir, capsys):
    cfg = GenerateConfig(model=str(tiny_model_dir), prompt="hello", n=2, temperature=1.0, max_new_tokens=5, seed=1)
    assert generate_command(cfg) == 0
    out = capsys.readouterr().out
    assert "completion 2/2" in out and "tokens/s" in out


def test_generate_config_refuses_bad_sampling():
    with pytest.raises(ConfigError, match="n and max_new_tokens"):
        GenerateConfig(n=0)
    with pytest.raises(ConfigError, match="top_p"):
        GenerateConfig(top_p=0.0)
