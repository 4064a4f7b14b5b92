"""Keys redacted by value whatever their variable's name; blank keys refused (issue 19)."""

from __future__ import annotations

import pytest

from codetool import CodetoolError
from codetool.jsonl import append_jsonl
from codetool.models.openai_backend import OpenAIBackend
from tests.test_models_openai import StubServer


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


def test_key_of_any_variable_echoed_by_the_endpoint_never_reaches_a_record(stub, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_BEARER", "vllm-canary-98765")
    llm = OpenAIBackend(stub.url, model="m", api_key_env="VLLM_BEARER", retries=0)
    echoed = stub.requests  # the stub records headers; answer with the Authorization header echoed
    stub.script.append((200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                    "content": "your key: vllm-canary-98765"},
                                           "finish_reason": "stop"}], "usage": {"prompt_tokens": 1,
                                                                                "completion_tokens": 3}}, 0, {}))
    text = llm.generate(["hi"], n=1)[0][0].text
    assert echoed[-1][1]["Authorization"] == "Bearer vllm-canary-98765"
    append_jsonl(tmp_path / "t.jsonl", {"answer": text, "log": ["Authorization: Bearer vllm-canary-98765"]})
    assert "vllm-canary-98765" not in (tmp_path / "t.jsonl").read_text()


@pytest.mark.parametrize("value", ["", "  \t"])
def test_blank_policy_key_is_refused(stub, monkeypatch, value):
    monkeypatch.setenv("VLLM_BEARER", value)
    with pytest.raises(CodetoolError, match="VLLM_BEARER is set but empty"):
        OpenAIBackend(stub.url, model="m", api_key_env="VLLM_BEARER")


def test_lone_surrogate_in_a_prompt_is_sent(stub):
    llm = OpenAIBackend(stub.url, model="m", retries=0)
    assert llm.generate(["caf\ud800e"], n=1)[0][0].text == "re:caf\ufffde:0"
