"""``codetool run``/``eval`` against stub OpenAI-compatible servers as they are (issues 25, 28).

The stubs play vLLM and ``transformers serve`` (``tests/test_models_openai.py``); the real
``transformers serve`` runs in ``tests/test_models_transformers_serve.py`` (slow).
"""

from __future__ import annotations

import json

import pytest

from codetool.cli import main
from codetool.config import ConfigError
from codetool.jsonl import read_jsonl
from tests.test_models_openai import StubServer


def write_tools(folder):
    """A ``--tools`` file with one API (a city's weather forecast)."""
    path = folder / "tools.json"
    path.write_text(json.dumps([{"category_name": "Data", "tool_name": "weather", "api_name": "forecast",
                                 "api_description": "the weather forecast of a city", "method": "GET",
                                 "required_parameters": [{"name": "city", "type": "STRING", "description": "city"}],
                                 "optional_parameters": []}]))
    return path


@pytest.fixture
def tools(tmp_path):
    return write_tools(tmp_path)


def run_against(url, tools, out, *extra):
    """``codetool run`` of one weather query with the policy at ``url`` (two steps)."""
    return main(["run", "--query", "What is the weather in Paris?", "--tools", str(tools), "--policy", url,
                 "--output", str(out), "--search.max_steps", "2", "--executor.isolation", "fallback",
                 "--policy_client.retries", "0", *extra])


@pytest.mark.parametrize("profile", ["tfserve", "vllm"])
def test_run_with_default_settings_gives_distinct_candidates(tmp_path, tools, capsys, profile):
    server = StubServer(profile)
    try:
        assert run_against(server.url, tools, tmp_path / "t.jsonl") == 0
    finally:
        server.close()
    [traj] = read_jsonl(tmp_path / "t.jsonl")
    assert traj["finish_type"] != "error" and len(traj["steps"]) == 2
    for step in traj["steps"]:
        texts = [c["text"] for c in step["candidates"]]
        assert len(texts) == 2 and len(set(texts)) == 2  # k distinct candidates per step
    serving = traj["serving"]
    assert serving["schedule"] == "continuous" and serving["policy"]["endpoints"] == [server.url]
    # QueryRunner.done still re-runs the chosen steps as the public code (search.reference_steps)
    assert len(traj["extra"]["reference_steps"]) == 2 and traj["extra"]["fidelity"]["reference_steps"] is True
    shown = capsys.readouterr().out
    assert "policy server" in shown and "policy in flight" in shown
    if profile == "tfserve":
        adapted = " ".join(serving["policy"]["adaptations"])
        assert "own request with its own seed" in adapted and "asked for in the prompt" in adapted
        assert "adapted" in shown
    else:
        assert serving["policy"]["adaptations"] == []


def test_constraints_a_server_cannot_apply_stop_the_run_in_one_line(tmp_path, tools, capsys):
    server = StubServer("tfserve")
    try:
        assert run_against(server.url, tools, tmp_path / "t.jsonl", "--search.constrain", "line") == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("codetool run: error: search.constrain is 'line'") and "\n" not in err
        assert "policy_client.constraint_field" in err and "Traceback" not in err
        assert not (tmp_path / "t.jsonl").exists() or not list(read_jsonl(tmp_path / "t.jsonl"))
        # or run unconstrained when the recipe says constraints are not required
        assert run_against(server.url, tools, tmp_path / "u.jsonl", "--search.constrain", "line",
                    "--policy_client.require_constraints", "false") == 0
    finally:
        server.close()
    [traj] = read_jsonl(tmp_path / "u.jsonl")
    assert "constraint: off" in " ".join(traj["serving"]["policy"]["adaptations"])


def test_judge_options_mode_without_logprobs_is_one_line(tmp_path):
    from codetool.assemble import make_judge
    from codetool.judge.config import JudgeConfig

    server = StubServer("tfserve")
    try:
        with pytest.raises(ConfigError, match="judge.mode is 'options'.*--judge.mode json") as e:
            make_judge(JudgeConfig(model=server.url, mode="options", cache=str(tmp_path / "c.jsonl")))
        assert "\n" not in str(e.value)
        judge = make_judge(JudgeConfig(model=server.url, cache=str(tmp_path / "c.jsonl")))
        assert judge.batch_size == 64  # a server's judge batches fill its client
    finally:
        server.close()
