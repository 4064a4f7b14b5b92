"""OpenAIBackend against stub OpenAI-compatible servers on 127.0.0.1 (started in the test).

The stub plays three servers as they are (issue 25): ``vllm`` (takes every field), ``tfserve``
(``transformers serve``: HTTP 422 for fields it does not know, one choice whatever ``n``,
samples only when ``generation_config`` asks for ``do_sample``, no logprobs or tool calls) and
``sglang`` (its constraint field is ``regex``). The real ``transformers serve`` is tested in
``tests/test_models_transformers_serve.py`` (slow).
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.models.openai_backend import OpenAIBackend, _split_tokens, sample_seed
from codetool.models.openai_probe import CONSTRAINT_REGEX
from codetool.models.remote import EndpointError
from codetool.retry import RetryPolicy

OPENAI_FIELDS = {"model", "messages", "n", "temperature", "top_p", "max_tokens", "stop", "seed", "logprobs",
                 "top_logprobs", "tools", "tool_choice", "response_format", "stream"}
TFSERVE_FIELDS = OPENAI_FIELDS | {"generation_config", "chat_template_kwargs"}


class StubServer:
    """Answers from a script, else as its ``profile`` would (module docstring).

    A script entry is (status, body dict or text, delay_s, headers). Every request is recorded
    as (path, headers, body); ``peak`` counts requests answered at once; ``disconnects`` counts
    requests whose client hung up while the stub was still delaying its answer.
    """

    def __init__(self, profile: str = "vllm"):
        self.profile = profile
        self.script: list[tuple] = []
        self.requests: list[tuple[str, dict, dict]] = []
        self.delay = 0.0
        self.active = self.peak = self.disconnects = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _wait(self, seconds: float) -> bool:
                """Sleep ``seconds``; False as soon as the client closed the connection."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    readable, _, _ = select.select([self.connection], [], [], min(0.02, end - time.monotonic()))
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        return False
                return True

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub.lock:
                    stub.requests.append((self.path, dict(self.headers), body))
                    stub.active += 1
                    stub.peak = max(stub.peak, stub.active)
                    scripted = stub.script.pop(0) if stub.script else None
                try:
                    status, payload, delay, headers = scripted or stub.reply(self.path, body)
                    answered = self._wait(delay or stub.delay)
                    with stub.lock:  # before the answer leaves: the client may send its next request at once
                        stub.active -= 1
                        stub.disconnects += not answered
                    if not answered:
                        return
                    data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
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
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def reply(self, path: str, body: dict) -> tuple:
        if path.endswith("/models"):
            return 200, {"data": [{"id": "stub-model"}]}, 0, {}
        if self.profile == "tfserve" and set(body) - TFSERVE_FIELDS:
            return 422, {"detail": f"Unexpected fields in the request: {set(body) - TFSERVE_FIELDS}"}, 0, {}
        content = body["messages"][-1]["content"]
        n = 1 if self.profile == "tfserve" else body.get("n", 1)
        regex = {"vllm": (body.get("structured_outputs") or {}).get("regex") or body.get("guided_regex"),
                 "sglang": body.get("regex")}.get(self.profile)
        samples = "do_sample" in (body.get("generation_config") or "") if self.profile == "tfserve" else True
        choices = []
        for i in range(n):
            text = "qx1" if regex == CONSTRAINT_REGEX else (f"re:{content}:{i}" if samples else f"re:{content}")
            if samples and self.profile == "tfserve":
                text = f"{text}:s{body.get('seed')}"
            choice = {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if body.get("logprobs") and self.profile != "tfserve":
                choice["logprobs"] = {"content": [{"token": "yes", "logprob": -0.1,
                                                   "top_logprobs": [{"token": "yes", "logprob": -0.1}]}]}
            if body.get("tool_choice") and self.profile != "tfserve":
                choice["message"]["tool_calls"] = [{"type": "function", "function": {
                    "name": "answer", "arguments": '{"value": "yes"}'}}]
            choices.append(choice)
        return 200, {"choices": choices, "usage": {"prompt_tokens": 7, "completion_tokens": 3 * n}}, 0, {}

    def chats(self) -> list[dict]:
        return [body for path, _, body in self.requests if path.endswith("/chat/completions")]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


@pytest.fixture
def tfserve():
    server = StubServer("tfserve")
    yield server
    server.close()


def backend(stub, **kwargs):
    kwargs = {"model": "m", "retries": 2, "backoff_s": 0.01, "timeout": 5.0, **kwargs}
    return OpenAIBackend(stub.url, **kwargs)


FENCED = [{"role": "user", "content": "write code"}, {"role": "assistant", "content": "```python\n"}]


def test_success_sends_openai_fields(stub, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-test-123456")
    b = backend(stub, api_key_env="STUB_KEY")
    [[c]] = b.generate(["hi"], temperature=0.7, top_p=0.9, max_new_tokens=12, stop=["```"], seed=3)
    assert (c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) == ("re:hi:0", 7, 3, "stop")
    path, headers, body = stub.requests[-1]
    assert path == "/v1/chat/completions" and len(stub.requests) == 1  # one sample: nothing to probe
    assert headers["Authorization"] == "Bearer sk-test-123456"
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1, "temperature": 0.7,
                    "top_p": 0.9, "max_tokens": 12, "stop": ["```"], "seed": 3}


def test_n_samples_and_several_prompts_in_order(stub):
    results = backend(stub).generate([f"p{i}" for i in range(5)], n=3)
    assert [[c.text for c in row] for row in results] == [[f"re:p{i}:{j}" for j in range(3)] for i in range(5)]
    assert all(sum(c.completion_tokens for c in row) == 9 for row in results)
    assert "Authorization" not in stub.requests[0][1]  # no key variable set: no header
    assert sum(b["n"] == 3 for b in stub.chats()) == 5  # one request per prompt; n probed once before


def test_vllm_like_server_gets_continuation_and_one_request(stub):
    b = backend(stub)
    [row] = b.generate([FENCED], n=2, temperature=0.9, stop=["```"], seed=5)
    body = stub.chats()[-1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["n"] == 2 and body["stop"] == ["```"] and body["messages"] == FENCED
    assert [c.text for c in row] == ["re:```python\n:0", "re:```python\n:1"]
    features = b.serving_record()["features"]
    assert features["n"] and features["sampling"] == "yes" and features["continuation"]
    assert b.serving_record()["adaptations"] == []


def test_transformers_serve_like_server_is_adapted(tfserve, caplog):
    b = backend(tfserve)
    with caplog.at_level(logging.INFO):
        [row] = b.generate([FENCED], n=2, temperature=0.9, stop=["```"], seed=5)
    real = [body for body in tfserve.chats() if body["messages"][0]["content"].startswith("write code")
            and "generation_config" in body and body.get("max_tokens") == 256]
    assert len(real) == 2 and all(body["n"] == 1 for body in real)
    assert sorted(body["seed"] for body in real) == sorted([5, sample_seed(5, 1)]) and sample_seed(5, 1) != 5
    for body in real:
        assert "continue_final_message" not in body and "stop" not in body  # applied to the reply instead
        assert [m["role"] for m in body["messages"]] == ["user"]  # the fence is asked for in the prompt
        assert "```python" in body["messages"][0]["content"] and "Begin your reply" in body["messages"][0]["content"]
    assert len({c.text for c in row}) == 2  # distinct samples
    adaptations = " | ".join(b.serving_record()["adaptations"])
    assert "own request with its own seed" in adaptations and "generation_config" in adaptations
    assert "code prefix: asked for in the prompt" in adaptations


@pytest.mark.parametrize("reply,code", [
    ("```python\nx = 1\nprint(x)\n```\nThat prints 1.", "x = 1\nprint(x)\n"),
    ("Here is the step:\n```python\ny = 2\n```", "y = 2\n"),
    ("```\nz = 3\n```", "z = 3\n"),
    ("w = 4", "w = 4"),
])
def test_reply_that_writes_the_prefix_reads_as_its_continuation(tfserve, reply, code):
    body = {"choices": [{"index": 0, "message": {"content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
    b = backend(tfserve)
    b.feature("continuation")  # probed before the scripted reply
    tfserve.script = [(200, body, 0, {})]
    [[c]] = b.generate([FENCED], n=1, stop=["```"])
    assert c.text == code


def test_server_that_ignores_n_gets_new_seeds_never_the_same(tfserve):
    b = backend(tfserve)
    [row] = b.generate(["q"], n=3, temperature=0.8, seed=11)
    seeds = {body["seed"] for body in tfserve.chats() if body["messages"][0]["content"] == "q"}
    assert seeds == {11, sample_seed(11, 1), sample_seed(11, 2)} and len(seeds) == 3
    assert len({c.text for c in row}) == 3


def test_identical_samples_are_counted_and_warned(stub, caplog):
    same = {"choices": [{"index": i, "message": {"content": "same"}, "finish_reason": "stop"} for i in range(2)]}
    b = backend(stub)
    b.feature("sampling")
    stub.script = [(200, same, 0, {})] * 5
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            b.generate(["p"], n=2, temperature=0.9)
    assert b.serving_record()["identical_samples"] == "5 of 5 prompts"
    assert caplog.text.count("identical samples") == 1


def test_constraint_field_auto_finds_the_one_that_works():
    from codetool.models.constraint import CallConstraint

    for profile, field in (("vllm", "structured_outputs"), ("sglang", "regex")):
        server = StubServer(profile)
        try:
            b = backend(server)
            b.check_constraints("search.constrain", "line")
            assert b.constraint_field == field
            b.generate(["p"], constraint=CallConstraint.for_functions(["f_a"]))
            sent = server.chats()[-1]
            assert (field in sent) and not ({"structured_outputs", "guided_regex", "regex"} - {field}) & set(sent)
        finally:
            server.close()


def test_constraints_the_server_cannot_apply(tfserve, caplog):
    from codetool.models.constraint import CallConstraint

    with pytest.raises(ConfigError) as e:
        backend(tfserve).check_constraints("search.constrain", "line")
    message = str(e.value)
    assert "search.constrain" in message and "policy_client.constraint_field" in message and "\n" not in message
    b = backend(tfserve, require_constraints=False)
    with caplog.at_level(logging.WARNING):
        b.check_constraints("search.constrain", "line")
        b.generate(["p"], constraint=CallConstraint.for_functions(["f_a"]))
    assert not {"structured_outputs", "guided_regex", "regex"} & set(tfserve.chats()[-1])
    assert "constraint: off" in " ".join(b.serving_record()["adaptations"])


@pytest.mark.parametrize("detail,named", [
    ("Unexpected fields in the request: {'continue_final_message'}", "search.code_prefix"),
    ("This model's maximum context length is 2048 tokens", "search.max_new_tokens"),
    ("n must be at most 1", "search.k"),
])
def test_4xx_names_the_setting(stub, detail, named):
    b = backend(stub)
    b.feature("continuation")
    stub.script = [(400, {"detail": detail}, 0, {})]
    with pytest.raises(EndpointError) as e:
        b.generate([FENCED], n=1, max_new_tokens=10)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_404_names_the_url_and_model(stub):
    stub.script = [(404, {"detail": "The model `x` does not exist."}, 0, {})]
    with pytest.raises(EndpointError, match="remote_model"):
        backend(stub).generate(["hi"])


def test_judge_role_names_judge_settings(stub):
    stub.script = [(400, {"detail": "max_tokens is too large"}, 0, {})]
    with pytest.raises(EndpointError, match="judge.max_new_tokens"):
        backend(stub, role="judge", setting="judge.client").generate(["hi"])


def test_server_that_ignores_n_is_asked_again(stub):
    one = {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "length"}],
           "usage": {"prompt_tokens": 2, "completion_tokens": 4}}
    b = backend(stub)
    b.feature("n")  # n honoured per the probe; this reply still carries fewer choices
    stub.script = [(200, one, 0, {}), (200, one, 0, {})]
    [row] = b.generate(["x"], n=2, seed=4)
    assert [(c.text, c.finish_reason, c.completion_tokens) for c in row] == [("a", "length", 4)] * 2
    bodies = stub.chats()[-2:]
    assert [r["n"] for r in bodies] == [2, 1] and bodies[0]["seed"] != bodies[1]["seed"]


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
    assert "\n" not in str(e.value) and "policy_client.max_in_flight" in str(e.value)


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


def test_timeout_closes_the_request(stub):
    stub.script = [(200, {"choices": []}, 30.0, {})] * 2  # answers long after the client gave up
    with pytest.raises(CodetoolError, match="no answer within 0.2 s .*after 2 attempts") as e:
        backend(stub, timeout=0.2, retries=1).generate(["hi"])
    assert "policy_client.timeout_s" in str(e.value)
    deadline = time.monotonic() + 60  # a cap on the wait, not a bound on the code
    while stub.disconnects < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stub.disconnects == 2  # the server saw both requests closed before it answered


def test_in_flight_limit_counts_sequences(stub):
    stub.delay = 0.1
    b = backend(stub, max_in_flight=4)
    b.feature("n")
    b.generate([f"p{i}" for i in range(8)], n=2)
    assert stub.peak == 2  # two requests of two samples each
    stats = b.stats()
    assert stats["in_flight_peak"] == 4 and 3.0 <= stats["in_flight_effective"] <= 4.0


def test_unreachable_endpoint_names_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(CodetoolError, match="cannot connect") as e:
        OpenAIBackend(url, model="m", retries=1, backoff_s=0.01).generate(["hi"])
    assert url in str(e.value) and "server is running" in str(e.value)


def test_failover_to_the_endpoint_that_answers(stub, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    b = OpenAIBackend(f"{dead},{stub.url}", model="m", retries=2, backoff_s=5.0)
    waits = []
    real = RetryPolicy.wait_s
    monkeypatch.setattr(RetryPolicy, "wait_s", lambda self, *a: waits.append(a) or real(self, *a))
    rows = b.generate([f"q{i}" for i in range(6)])
    assert [row[0].text for row in rows] == [f"re:q{i}:0" for i in range(6)]
    assert waits == [] and b.stats()["failovers"] >= 1  # failed over at once, no backoff wait
    assert b.stats()["endpoints"] == 2


def test_a_body_that_is_not_json_is_retried_then_named(stub):
    """A 200 whose body is not a JSON object (a proxy's error page, a list) is a fault like a 5xx:
    retried and counted by kind (issue 39: it failed the query at once); when every retry gets one,
    the error names it."""
    stub.script = [(200, "<html>bad gateway</html>", 0, {}), (200, [1, 2], 0, {})]
    b = backend(stub)
    [[completion]] = b.generate(["hi"])  # the second retry gets the stub's own reply
    assert completion.text and b.stats()["faults"] == {"connection": 0, "timeout": 0, "http_429": 0,
                                                       "http_5xx": 0, "bad_body": 2}
    stub.script = [(200, "<html>hello</html>", 0, {})] * 3
    with pytest.raises(CodetoolError, match="not a JSON object.*after 3 attempts.*ends in /v1"):
        backend(stub).generate(["hi"])


def test_option_logprobs_walks_the_greedy_tokens(stub):
    def pos(token, logprob, alts):
        return {"token": token, "logprob": logprob,
                "top_logprobs": [{"token": t, "logprob": lp} for t, lp in alts]}

    content = [pos("search", -0.1, [("search", -0.1), ("get", -2.5)]),
               pos("_movie", -0.2, [("_movie", -0.2), ("_person", -1.7)]),
               pos("\n", -0.3, [("\n", -0.3)])]
    b = backend(stub)
    b.feature("logprobs")
    stub.script = [(200, {"choices": [{"index": 0, "message": {"content": "search_movie\n"},
                                       "logprobs": {"content": content}, "finish_reason": "length"}]}, 0, {})]
    [scores] = b.option_logprobs(["which tool?"], ["search_movie", "search_person", "get_x", "zzz"])
    assert scores == pytest.approx([-0.3, -1.8, -2.5, -2.5])
    body = stub.requests[-1][2]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["temperature"] == 0.0


def test_option_logprobs_unsupported(stub, tfserve):
    stub.script = [(400, {"error": "logprobs not supported"}, 0, {})]
    with pytest.raises(NotImplementedError, match="logprobs not supported"):
        backend(stub).option_logprobs(["x"], ["a"])
    with pytest.raises(NotImplementedError, match="no token log-probabilities"):
        backend(tfserve).option_logprobs(["x"], ["a"])


def test_forced_tool_calls_are_noted_from_the_first_reply(stub, tfserve):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for server, works in ((stub, True), (tfserve, False)):
        b = backend(server)
        for _ in range(2):
            b.chat("x", tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}})
        assert len(server.chats()) == 2  # no probe of its own
        assert b.serving_record()["features"]["tool_choice"] is works


def test_split_tokens_keeps_total():
    assert _split_tokens(10, ["aaa", "a", "aaaaaa"]) == [3, 1, 6]
    assert sum(_split_tokens(7, ["ab", "ab", "ab"])) == 7


def test_bad_base_url():
    with pytest.raises(CodetoolError, match="http://host:port/v1"):
        OpenAIBackend("localhost:8000")


def test_close_ends_the_requests_in_flight(stub):
    """An interrupted run closes its client: the server sees every request in flight go away."""
    stub.script = [(200, {"choices": []}, 5.0, {})] * 3
    b = backend(stub, retries=0)
    errors = []
    threads = [threading.Thread(target=lambda: errors.append(_error(b.generate, ["hi"]))) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 2
    while stub.active < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    b.close()
    for t in threads:
        t.join(timeout=3)
    deadline = time.monotonic() + 2
    while stub.disconnects < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stub.disconnects == 3 and len(errors) == 3 and all(errors)


def _error(func, *args):
    try:
        func(*args)
    except Exception as e:  # noqa: BLE001 - the test looks at it
        return e
    return None


def test_probe_notes_and_serving_records_never_carry_a_key(tfserve, canary_env, tmp_path):
    from codetool.jsonl import append_jsonl

    tfserve.script = [(422, {"detail": f"Unexpected fields; your key {canary_env}"}, 0, {})]
    b = backend(tfserve)
    b.generate([FENCED], n=1)
    record = b.serving_record()
    assert canary_env not in json.dumps(record) and "[REDACTED]" in record["features"]["notes"]["continuation"]
    append_jsonl(tmp_path / "t.jsonl", {"serving": record})
    assert canary_env not in (tmp_path / "t.jsonl").read_text()
