"""serve-prm and its client under bad input (issue 19): isolation, depth, deadlines, retries."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from codetool import CodetoolError
from codetool.prm.client import HTTPScorer
from codetool.prm.server import create_app, serve_in_thread
from codetool.rewards import PRMItem
from codetool.secrets import REDACTED, key_from_env, redact

ITEM = {"query": "weather in Paris?", "tools": "def f(): ...", "history": [{"code": "x = 1", "output": ""}],
        "candidate": "print(f())", "candidate_output": "{}"}


class PickyScorer:
    """Raises on any item whose candidate contains 'BAD' (a tokenizer bug stand-in); else scores
    by candidate length. Records each call's size."""

    def __init__(self, delay_s: float = 0.0):
        self.calls: list[int] = []
        self.delay_s = delay_s

    def score(self, items):
        self.calls.append(len(items))
        time.sleep(self.delay_s)
        if any("BAD" in item.candidate for item in items):
            raise TypeError("cannot tokenize")
        return [min(len(item.candidate) / 100.0, 1.0) for item in items]


def _client(scorer, **kwargs):
    from fastapi.testclient import TestClient

    return TestClient(create_app(scorer, **kwargs))


def test_lone_surrogate_is_cleaned_and_scored():
    body = b'{"items": [{"query": "q", "candidate": "ab\\ud800c"}]}'
    with _client(PickyScorer()) as client:
        response = client.post("/score", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.json() == {"scores": [0.04]}  # "ab\ufffdc" is 4 characters


def test_one_bad_request_does_not_fail_its_batch_companions():
    scorer = PickyScorer(delay_s=0.02)
    app = create_app(scorer, batch_wait_ms=200)
    with serve_in_thread(app) as url:
        results: dict[int, httpx.Response] = {}

        def call(i, candidate):
            results[i] = httpx.post(f"{url}/score", json={"items": [ITEM, {**ITEM, "candidate": candidate}]})

        threads = [threading.Thread(target=call, args=(i, "BAD" if i == 1 else "y" * (10 * i))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results[1].status_code == 422
    assert "items[1]" in results[1].json()["error"]
    for i in (0, 2, 3):
        assert results[i].status_code == 200
        assert results[i].json()["scores"] == pytest.approx([0.1, 0.1 * i])
    assert max(scorer.calls) > 2  # they were batched together at first


def test_deep_json_is_a_400_not_a_500():
    body = b"[" * 100_000 + b"]" * 100_000
    with _client(PickyScorer(), max_body_bytes=1_000_000) as client:
        response = client.post("/score", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]


def test_history_longer_than_the_budget_is_a_413():
    item = {**ITEM, "history": [{"code": "x = 1", "output": "ok"}] * 20_000}
    with _client(PickyScorer(), max_history_steps=1000) as client:
        response = client.post("/score", json={"items": [ITEM, item]})
    assert response.status_code == 413
    assert response.json()["error"] == "items[1].history has 20000 steps; the limit is 1000"


def test_timed_out_request_gets_504_and_its_work_is_skipped():
    scorer = PickyScorer(delay_s=0.6)
    with serve_in_thread(create_app(scorer, request_timeout_s=0.3, batch_wait_ms=1)) as url:
        slow = httpx.post(f"{url}/score", json={"items": [ITEM]})
        assert slow.status_code == 504
        calls = len(scorer.calls)
        # a queued request whose budget ran out while the first was scored is never scored
        assert httpx.get(f"{url}/health").status_code == 200
    assert calls == 1


def test_slow_body_gets_408_and_silent_sockets_are_closed():
    from codetool.serving import serve_in_background

    app = create_app(PickyScorer(), read_timeout_s=0.5)
    with serve_in_background(app, header_timeout_s=0.5) as url:
        host, port = url[len("http://"):].split(":")
        silent = socket.create_connection((host, int(port)))
        silent.settimeout(5)
        assert silent.recv(100) == b""  # closed by the server, not hanging
        slow = socket.create_connection((host, int(port)))
        slow.settimeout(5)
        slow.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"items\"")
        reply = slow.recv(1000)
        assert b" 408 " in reply.split(b"\r\n")[0]
        silent.close()
        slow.close()


class _Flaky:
    """A transport that fails the first ``failures`` calls (connection error, then 503)."""

    def __init__(self, failures: int):
        self.failures, self.seen = failures, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        if self.seen <= self.failures:
            if self.seen % 2:
                raise httpx.ConnectError("refused")
            return httpx.Response(503, json={"error": "busy"})
        n = len(json.loads(request.content)["items"])
        return httpx.Response(200, json={"scores": [0.5] * n})


def _scorer(transport, **kwargs) -> HTTPScorer:
    client = HTTPScorer("http://prm.invalid", backoff_s=0.001, **kwargs)
    client.remote._client = httpx.AsyncClient(transport=httpx.MockTransport(transport))
    return client


def test_client_retries_connection_errors_and_5xx():
    flaky = _Flaky(3)
    assert _scorer(flaky, retries=4).score([PRMItem(**ITEM)]) == [0.5]
    assert flaky.seen == 4
    with pytest.raises(CodetoolError, match="after 2 attempts"):
        _scorer(_Flaky(5), retries=1).score([PRMItem(**ITEM)])


def test_client_does_not_retry_4xx():
    seen = []

    def handler(request):
        seen.append(1)
        return httpx.Response(400, json={"error": "items[0] must be an object"})

    with pytest.raises(CodetoolError, match="400: items"):
        _scorer(handler).score([PRMItem(**ITEM)])
    assert len(seen) == 1


def test_any_key_variable_is_redacted_by_value(monkeypatch):
    monkeypatch.setenv("VLLM_BEARER", "sk-canary-777")
    assert key_from_env("VLLM_BEARER") == "sk-canary-777"
    assert redact("echo: Bearer sk-canary-777") == f"echo: Bearer {REDACTED}"


@pytest.mark.parametrize("value", ["", "   ", "\n"])
def test_blank_key_is_refused(monkeypatch, value):
    monkeypatch.setenv("CODETOOL_PRM_API_KEY", value)
    with pytest.raises(CodetoolError, match="empty or whitespace"):
        key_from_env("CODETOOL_PRM_API_KEY")


def test_client_4xx_names_what_to_change():
    def handler(request):
        return httpx.Response(413, json={"error": "300 items in one request; the limit is 256"})

    with pytest.raises(CodetoolError, match="larger --max_items"):
        _scorer(handler, max_items=300).score([PRMItem(**ITEM)] * 300)


def test_an_item_that_cannot_be_read_is_a_422_alone_or_with_others():
    """The same unreadable item (the scorer raises TypeError on it) was a 422 beside other items
    but a 500 alone, which the client retries and then counts as the machine's failure (its query
    left out of every rate); a fault of the scorer itself (RuntimeError) stays a 500."""
    from fastapi.testclient import TestClient

    with TestClient(create_app(PickyScorer())) as client:
        alone = client.post("/score", json={"items": [{**ITEM, "candidate": "BAD"}]})
        beside = client.post("/score", json={"items": [ITEM, {**ITEM, "candidate": "BAD"}]})
    assert (alone.status_code, beside.status_code) == (422, 422)
    assert "items[0] cannot be scored (TypeError)" in alone.json()["error"]
