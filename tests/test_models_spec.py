"""One model-spec parser (codetool.models.spec) for policies, judges and PRMs (issue 18)."""

from __future__ import annotations

import pytest

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.models.backends import make_backend
from codetool.models.remote import RemoteConfig
from codetool.models.spec import ModelSpec


@pytest.mark.parametrize(("text", "role", "kind", "location"), [
    ("default", "policy", "local", "default"),
    ("  Qwen/Qwen2.5-Coder-7B-Instruct ", "policy", "local", "Qwen/Qwen2.5-Coder-7B-Instruct"),
    ("http://127.0.0.1:8001/v1", "policy", "openai", "http://127.0.0.1:8001/v1"),
    ("https://api.openai.com/v1", "judge", "openai", "https://api.openai.com/v1"),
    ("vllm:Qwen/Qwen2.5-7B", "policy", "vllm", "Qwen/Qwen2.5-7B"),
    ("vllm:", "policy", "vllm", "default"),
    ("checkpoints/prm/quickstart", "prm", "local", "checkpoints/prm/quickstart"),
    ("http://127.0.0.1:8000", "prm", "server", "http://127.0.0.1:8000"),
    ("vllm:runs/prm/merged", "prm", "vllm", "runs/prm/merged"),
    ("none", "prm", "none", ""), ("None", "prm", "none", ""), ("", "prm", "none", ""),
    ("rollout", "prm", "rollout", ""),
])
def test_kinds_by_form(text, role, kind, location):
    spec = ModelSpec.parse(text, role=role)
    assert (spec.kind, spec.location, spec.text) == (kind, location, text.strip())


def test_options_follow_the_kind():
    local = ModelSpec.parse("default", dtype="bfloat16", device="cpu", max_batch_size=4, api_key_env="K")
    assert local.backend_kwargs() == {"dtype": "bfloat16", "device": "cpu", "max_batch_size": 4}
    assert ModelSpec.parse("default").backend_kwargs() == {}
    assert ModelSpec.parse("vllm:m", dtype="float16", device="cuda", max_batch_size=4).backend_kwargs() == {
        "dtype": "float16"}
    server = ModelSpec.parse("http://h/v1", remote_model="policy", api_key_env="VLLM_KEY", dtype="float16")
    assert server.backend_kwargs() == {"model": "policy", "api_key_env": "VLLM_KEY", "setting": "policy_client",
                                       "role": "policy"} and server.remote
    assert ModelSpec.parse("http://h/v1", remote_model="").backend_kwargs() == {
        "model": None, "setting": "policy_client", "role": "policy"}
    limits = RemoteConfig(max_in_flight=16)
    judge = ModelSpec.parse("http://a/v1,http://b/v1", role="judge", client=limits)
    assert judge.backend_kwargs() == {"model": None, "client": limits, "setting": "judge.client", "role": "judge"}
    assert make_backend(judge).urls == ["http://a/v1", "http://b/v1"]
    assert ModelSpec.parse("http://p:8600", role="prm", client=limits).backend_kwargs() == {
        "model": None, "client": limits}
    with pytest.raises(ConfigError, match="comma-separated http"):
        ModelSpec.parse("http://a/v1,b:8000")


def test_latent_of_a_prm_spec():
    assert [ModelSpec.parse(s, role="prm").latent for s in ("none", "rollout", "ckpt", "http://h", "vllm:x")] == [
        "none", "rollout", "prm", "prm", "prm"]


def test_conflicting_settings_are_refused():
    with pytest.raises(ConfigError, match="remote_model 'gpt-4o'.*not a server URL"):
        ModelSpec.parse("default", remote_model="gpt-4o")
    with pytest.raises(ConfigError, match="remote_model"):
        ModelSpec.parse("vllm:m", role="judge", remote_model="x")
    with pytest.raises(CodetoolError, match="no model given"):
        ModelSpec.parse("  ")
