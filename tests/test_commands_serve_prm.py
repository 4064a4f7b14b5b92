"""``codetool serve-prm`` (codetool.commands.serve_prm): the checks before it serves, its settings."""

from __future__ import annotations

import pytest

from codetool import CodetoolError
from codetool.commands.serve_prm import ServePRMConfig, serve_prm
from codetool.config import ConfigError


def test_refuses_public_bind_without_key(monkeypatch):
    monkeypatch.delenv("CODETOOL_PRM_API_KEY", raising=False)
    with pytest.raises(CodetoolError, match="needs an API key"):
        serve_prm(ServePRMConfig(host="0.0.0.0"))
    with pytest.raises(CodetoolError, match="checkpoint folder"):
        serve_prm(ServePRMConfig(prm="http://elsewhere:1"))


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="1..65535"):
        ServePRMConfig(port=70000)
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        ServePRMConfig(workers=0)
    with pytest.raises(ConfigError, match="request_timeout_s must be > 0"):
        ServePRMConfig(request_timeout_s=float("nan"))
