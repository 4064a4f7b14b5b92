"""The one retry policy (codetool.retry): the waits both HTTP clients use."""

from __future__ import annotations

import time

from codetool.retry import RetryPolicy
from codetool.tools.clients import StableToolBenchClient
from codetool.tools.spec import APISpec, ToolResponse


def test_waits_double_up_to_the_cap_and_retry_after_replaces_them():
    policy = RetryPolicy(retries=5, backoff_s=1.0, max_backoff_s=3.0)
    assert [policy.wait_s(k) for k in range(1, 5)] == [1.0, 2.0, 3.0, 3.0]
    assert policy.wait_s(1, "2.5") == 2.5 and policy.wait_s(1, "900") == 3.0 and policy.wait_s(3, "soon") == 3.0
    assert RetryPolicy(2, 0.0).wait_s(2) == 0.0


def test_the_stabletoolbench_client_waits_by_the_policy(monkeypatch):
    waits, answers = [], iter([ToolResponse("timeout", error="t", outage=True),
                               ToolResponse("http_error", http_status=503, outage=True),
                               ToolResponse("ok", content='{"response": "fine"}')])
    monkeypatch.setattr(time, "sleep", waits.append)
    monkeypatch.setattr("codetool.tools.clients.http_call", lambda *args, **kwargs: next(answers))
    client = StableToolBenchClient("http://127.0.0.1:9/virtual", retries=2, backoff_s=0.5)
    response = client.call(APISpec(category="c", tool="t", api="a"), {})
    assert response.ok and response.content == "fine" and waits == [0.5, 1.0]
