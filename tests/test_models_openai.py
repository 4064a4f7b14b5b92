"""OpenAIBackend against a stub OpenAI-compatible server on 127.0.0.1 (started in the test)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from codetool import CodetoolError
from codetool.models.openai_backend import OpenAIBackend, _split_tokens


class StubServer:
    """Answers from a script: each entry is (status, body dict or text, delay_s, headers).

    With the script empty it answers a default chat completion with ``n`` choices. Every
    request is recorded as (path, headers, body).
    """

    def __init__(self):
        self.script: list[tuple] = []
        self.requests: list[tuple[str, dict, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                stub.requests.append((self.path, dict(self.headers), body))
                if stub.script:
                    status, payload, delay, headers = stub.script.pop(0)
                elif self.path.endswith("/models"):
                    status, payload, delay, headers = 200, {"data": [{"id": "stub-model"}]}, 0, {}
                else:
                    n = body.get("n", 1)
                    content = body["messages"][-1]["content"]
                    choices = [{"index": i, "message": {"role": "assistant", "content": f"re:{content}:{i}"},
                                "finish_reason": "stop"} for i in range(n)]
                    status, payload, delay, headers = 200, {"choices": choices, "usage": {
                        "prompt_tokens": 7, "completion_tokens": 3 * n}}, 0, {}
                time.sleep(delay)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


def backend(stub, **kwargs):
    kwargs = {"model": "m", "retries": 2, "backoff_s": 0.01, "timeout": 5.0, **kwargs}
    return OpenAIBackend(stub.url, **kwargs)


def test_success_sends_openai_fields(stub, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-test-123456")
    b = backend(stub, api_key_env="STUB_KEY")
    [[c]] = b.generate(["hi"], temperature=0.7, top_p=0.9, max_new_tokens=12, stop=["```"], seed=3)
    assert (c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) == ("re:hi:0", 7, 3, "stop")
    path, headers, body = stub.requests[-1]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test-123456"
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1, "temperature": 0.7,
                    "top_p": 0.9, "max_tokens": 12, "stop": ["```"], "seed": 3}


def test_n_samples_and_several_prompts_in_order(stub):
    results = backend(stub).generate([f"p{i}" for i in range(5)], n=3)
    assert [[c.text for c in row] for row in results] == [[f"re:p{i}:{j}" for j in range(3)] for i in range(5)]
    assert all(sum(c.completion_tokens for c in row) == 9 for row in results)
    assert "Authorization" not in stub.requests[0][1]  # no key variable set: no header


def test_server_that_ignores_n_is_asked_again(stub):
    one = {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "length"}],
           "usage": {"prompt_tokens": 2, "completion_tokens": 4}}
    stub.script = [(200, one, 0, {}), (200, one, 0, {})]
    [row] = backend(stub).generate(["x"], n=2)
    assert [(c.text, c.finish_reason, c.completion_tokens) for c in row] == [("a", "length", 4)] * 2
    assert [r[2]["n"] for r in stub.requests] == [2, 1]


def test_model_discovered_from_server(stub):
    b = OpenAIBackend(stub.url.removesuffix("/v1"), retries=0)  # no path: /v1 is added
    b.generate(["hi"])
    assert b.model == "stub-model" and stub.requests[0][0] == "/v1/models"


def test_429_then_success_is_retried(stub, caplog):
    stub.script = [(429, {"error": "slow down"}, 0, {"Retry-After": "0"}), (503, "busy", 0, {})]
    with caplog.at_level(logging.WARNING):
        [[c]] = backend(stub).generate(["hi"])
    assert c.text == "re:hi:0" and len(stub.requests) == 3
    assert "HTTP 429" in caplog.text and "retry 1/2" in caplog.text


def test_retries_exhausted_is_one_line(stub):
    stub.script = [(500, "boom", 0, {})] * 3
    with pytest.raises(CodetoolError, match="HTTP 500.*after 3 attempts") as e:
        backend(stub).generate(["hi"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key", [None, "sk-canary-7f3a9c2e1b5d4f60a8e2"])
def test_401_names_the_variable_never_the_key(stub, monkeypatch, caplog, key):
    if key:
        monkeypatch.setenv("MY_LLM_KEY", key)
    stub.script = [(401, {"error": f"bad key {key}"}, 0, {})]
    with caplog.at_level(logging.DEBUG), pytest.raises(CodetoolError, match="MY_LLM_KEY") as e:
        backend(stub, api_key_env="MY_LLM_KEY").generate(["hi"])
    message = str(e.value)
    assert ("is not set" if key is None else "rejected") in message and "\n" not in message
    assert len(stub.requests) == 1  # not retried
    if key:
        assert key not in message and key not in caplog.text


def test_other_4xx_echo_is_redacted(stub, canary_env):
    stub.script = [(400, {"error": f"unknown model; your key {canary_env}"}, 0, {})]
    with pytest.raises(CodetoolError, match="HTTP 400") as e:
        backend(stub).generate(["hi"])
    assert canary_env not in str(e.value) and "[REDACTED]" in str(e.value)


def test_timeout(stub):
    stub.script = [(200, {"choices": []}, 1.0, {})] * 2
    start = time.perf_counter()
    with pytest.raises(CodetoolError, match="no answer within 0.2 s after 2 attempts"):
        backend(stub, timeout=0.2, retries=1).generate(["hi"])
    assert time.perf_counter() - start < 1.5


def test_unreachable_endpoint_names_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(CodetoolError, match="cannot connect") as e:
        OpenAIBackend(url, model="m", retries=1, backoff_s=0.01).generate(["hi"])
    assert url in str(e.value) and "server is running" in str(e.value)


def test_non_json_body(stub):
    stub.script = [(200, "<html>hello</html>", 0, {})]
    with pytest.raises(CodetoolError, match="not JSON"):
        backend(stub).generate(["hi"])


def test_option_logprobs_walks_the_greedy_tokens(stub):
    def pos(token, logprob, alts):
        return {"token": token, "logprob": logprob,
                "top_logprobs": [{"token": t, "logprob": lp} for t, lp in alts]}

    content = [pos("search", -0.1, [("search", -0.1), ("get", -2.5)]),
               pos("_movie", -0.2, [("_movie", -0.2), ("_person", -1.7)]),
               pos("\n", -0.3, [("\n", -0.3)])]
    stub.script = [(200, {"choices": [{"index": 0, "message": {"content": "search_movie\n"},
                                       "logprobs": {"content": content}, "finish_reason": "length"}]}, 0, {})]
    [scores] = backend(stub).option_logprobs(["which tool?"], ["search_movie", "search_person", "get_x", "zzz"])
    assert scores == pytest.approx([-0.3, -1.8, -2.5, -2.5])
    body = stub.requests[-1][2]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["temperature"] == 0.0


def test_option_logprobs_unsupported(stub):
    stub.script = [(400, {"error": "logprobs not supported"}, 0, {})]
    with pytest.raises(NotImplementedError):
        backend(stub).option_logprobs(["x"], ["a"])
    stub.script = [(200, {"choices": [{"index": 0, "message": {"content": "a"}}]}, 0, {})]
    with pytest.raises(NotImplementedError):
        backend(stub).option_logprobs(["x"], ["a"])


def test_split_tokens_keeps_total():
    assert _split_tokens(10, ["aaa", "a", "aaaaaa"]) == [3, 1, 6]
    assert sum(_split_tokens(7, ["ab", "ab", "ab"])) == 7


def test_bad_base_url():
    with pytest.raises(CodetoolError, match="http://host:port/v1"):
        OpenAIBackend("localhost:8000")
