"""The composition module (codetool.assemble) and the settings it refuses to mix (issue 18)."""

from __future__ import annotations

import json

import pytest

import codetool.assemble as assemble
from codetool.commands.pipeline import PipelineConfig
from codetool.config import ConfigError
from codetool.jobs.queries import RunConfig
from codetool.models.backends import ScriptedBackend
from codetool.models.remote import RemoteConfig
from codetool.models.spec import ModelSpec
from codetool.search.config import SearchConfig
from codetool.tree.config import TreeConfig


def test_make_policy_builds_the_spec_its_config_parsed(monkeypatch):
    seen = []
    monkeypatch.setattr("codetool.models.backends.make_backend",
                        lambda spec, **kw: seen.append((spec.text, spec.backend_kwargs(), kw)) or "B")
    assert assemble.make_policy(TreeConfig(policy_max_batch_size=4).policy_spec) == "B"
    assemble.make_policy(RunConfig(query="q", tools="t.json", policy="http://h/v1", remote_model="policy").policy_spec)
    assemble.make_policy(ModelSpec.parse("vllm:m", dtype="bfloat16"))
    assert seen == [("default", {"dtype": "auto", "max_batch_size": 4}, {}),
                    ("http://h/v1", {"model": "policy", "api_key_env": "OPENAI_API_KEY", "client": RemoteConfig(),
                                     "setting": "policy_client", "role": "policy"}, {}),
                    ("vllm:m", {"dtype": "bfloat16"}, {})]
    with pytest.raises(ConfigError, match="remote_model"):
        TreeConfig(remote_model="policy")


def test_make_policy_refuses_text_it_would_parse_again():
    with pytest.raises(TypeError, match="parsed ModelSpec"):
        assemble.make_policy("default")


def test_make_scorer_none_and_rollout_need_no_prm():
    assert assemble.make_scorer(None) is None
    for text in ("none", "rollout", ""):
        assert assemble.make_scorer(ModelSpec.parse(text, role="prm")) is None


def test_tool_backend_options_and_lifetime():
    assert assemble.tool_backend_options("stabletoolbench", "http://h", "c") == {"url": "http://h", "cache_dir": "c"}
    assert assemble.tool_backend_options("cache", None, "c") == {"root": "c"}
    with pytest.raises(ConfigError, match="tool_server_url"):
        assemble.tool_backend_options("server", None, None)
    with assemble.tool_backend("auto", benchmark="stabletoolbench") as backend:
        assert type(backend).__name__ == "SimulatorBackend"


def test_prm_decides_the_latent_reward_and_a_contrary_latent_is_refused():
    assert RunConfig(query="q", tools="t.json", prm="rollout", search=SearchConfig(latent="rollout")).prm == "rollout"
    RunConfig(query="q", tools="t.json", prm="ckpt")  # latent left at its default: follows --prm
    with pytest.raises(ConfigError, match="--search.latent none disagrees with --prm 'ckpt'"):
        RunConfig(query="q", tools="t.json", prm="ckpt", search=SearchConfig(latent="none"))
    with pytest.raises(ConfigError, match="--search.latent rollout disagrees with --prm 'none'"):
        RunConfig(query="q", tools="t.json", search=SearchConfig(latent="rollout"))
    with pytest.raises(ConfigError, match="remote_model"):
        RunConfig(query="q", tools="t.json", remote_model="policy")


def test_pipeline_refuses_a_trees_policy_it_would_replace():
    assert PipelineConfig(policy="http://h/v1", remote_model="p", trees=TreeConfig(policy="http://h/v1")).trees
    with pytest.raises(ConfigError, match="trees.policy is 'other' but the pipeline's policy is 'default'"):
        PipelineConfig(trees=TreeConfig(policy="other"))
    with pytest.raises(ConfigError, match="trees.tool_doc"):
        PipelineConfig(trees=TreeConfig(tool_doc="brief"))
    with pytest.raises(ConfigError, match="remote_model"):
        PipelineConfig(remote_model="p")


def test_run_takes_its_policy_from_the_composition_module(monkeypatch, tmp_path):
    import json

    from codetool.commands.run import execute_run

    tools = tmp_path / "apis.json"
    tools.write_text(json.dumps([{"category_name": "Data", "tool_name": "weather", "api_name": "forecast",
                                  "api_description": "forecast", "required_parameters": [], "optional_parameters": []}]))
    monkeypatch.setattr(assemble, "make_policy", lambda *a, **k: ScriptedBackend(lambda p: "finish('sunny')\n```"))
    out = execute_run(RunConfig(query="Weather?", tools=str(tools), output=str(tmp_path / "t.jsonl"),
                                search=SearchConfig(k=1, max_steps=2), executor=_executor()), show_summary=False)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["finish_type"] == "finish" and record["query_id"] == "query"


def _executor():
    from codetool.executor import ExecutorConfig

    return ExecutorConfig(isolation="fallback", timeout_s=10)


def test_the_mock_tmdb_server_lives_as_long_as_the_block(shared_data):
    import socket

    with assemble.tool_backend("auto", benchmark="restbench-tmdb", data_dir=str(shared_data)) as backend:
        host, port = backend.base_url.removeprefix("http://").rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()  # serving
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_the_strategy_table_covers_every_strategy_with_one_signature():
    import dataclasses
    import inspect

    choices = {f.name: f for f in dataclasses.fields(SearchConfig)}["strategy"].metadata["choices"]
    assert sorted(assemble.STRATEGIES) == sorted(choices) == ["beam", "best_of_n", "compute_optimal", "dvts", "greedy",
                                                              "lookahead"]
    for name, strategy in assemble.STRATEGIES.items():
        assert list(inspect.signature(strategy).parameters) == ["tasks", "parts", "cfg", "on_done"], name
        assert strategy.__module__ == f"codetool.search.{name}"


def test_make_search_binds_the_configured_strategy_and_refuses_a_prm_it_lacks():
    policy = ScriptedBackend([])
    search = assemble.make_search(policy, SearchConfig(latent="none", strategy="beam"), lambda task: None,
                                  config_hash="abc")
    assert search.strategy is assemble.STRATEGIES["beam"]
    assert (search.policy, search.config_hash, search.episodes) == (policy, "abc", 4)
    with pytest.raises(ConfigError, match="no PRM was given"):
        assemble.make_search(policy, SearchConfig(latent="prm"), lambda task: None)


def test_the_http_backend_calls_your_api_with_your_token_only(monkeypatch):
    """Issue 40: `--tools_backend http` plugs a real API in: the spec's server (or --tool_server_url),
    a bearer token from CODETOOL_TOOL_TOKEN, never TMDB's."""
    import httpx

    from codetool.tools.backends import make_tool_backend
    from codetool.tools.files import load_tools

    options = assemble.tool_backend_options("http", "http://127.0.0.1:9999/api", None)
    assert options == {"base_url": "http://127.0.0.1:9999/api", "token_env": "CODETOOL_TOOL_TOKEN"}
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"loan_id": 1})

    monkeypatch.setenv("CODETOOL_TOOL_TOKEN", "my-own-token-123")
    monkeypatch.setenv("TMDB_ACCESS_TOKEN", "tmdb-token-456")
    backend = make_tool_backend("http", **options, client=httpx.Client(transport=httpx.MockTransport(handler)))
    from pathlib import Path

    apis = {a.api: a for a in load_tools(Path(__file__).resolve().parents[1] / "examples" / "library" / "openapi.json")}
    response = backend.call(apis["POST /loans"], {"book_id": 17, "member_id": "m-204"})
    assert response.ok and seen[0].method == "POST" and str(seen[0].url) == "http://127.0.0.1:9999/api/loans"
    assert seen[0].headers["authorization"] == "Bearer my-own-token-123" and json.loads(seen[0].content) == {"book_id": 17, "member_id": "m-204"}
    spec_url = make_tool_backend("http", **assemble.tool_backend_options("http", None, None),
                                 client=httpx.Client(transport=httpx.MockTransport(handler)))
    spec_url.call(apis["GET /books"], {"q": "Le Guin"})
    assert str(seen[1].url) == "https://library.example.org/api/books?q=Le+Guin"  # the spec's server
