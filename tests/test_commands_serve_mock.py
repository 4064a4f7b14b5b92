"""``codetool serve-mock`` (codetool.commands.serve_mock): its bind check, its help, its settings."""

import pytest

from codetool import CodetoolError
from codetool.commands.serve_mock import ServeMockConfig, serve_mock
from codetool.config import ConfigError


def test_serve_mock_needs_a_key_off_loopback(monkeypatch):
    monkeypatch.delenv("CODETOOL_MOCK_API_KEY", raising=False)
    with pytest.raises(CodetoolError, match="CODETOOL_MOCK_API_KEY"):
        serve_mock(ServeMockConfig(kind="tmdb", host="0.0.0.0"))


def test_serve_mock_cli_help(capsys):
    from codetool.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve-mock", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "stabletoolbench" in shown
    assert "(ToolBench format) [default: the six test groups] (several" in shown  # one default, not "... [default: none]"


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="1-65535"):
        ServeMockConfig(port=0)
    with pytest.raises(ConfigError, match="positive"):
        ServeMockConfig(timeout_s=0)
