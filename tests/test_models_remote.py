"""RemoteClient and its settings (issue 28): in-flight limit, backoff, Retry-After, endpoints, failover."""

from __future__ import annotations

import email.utils
import threading
import time

import httpx
import pytest

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.models.remote import InFlight, RemoteClient, RemoteConfig, split_urls
from codetool.retry import retry_after_s


def client(handler, urls=("http://a.invalid",), **cfg) -> RemoteClient:
    c = RemoteClient(list(urls), RemoteConfig(**{"backoff_s": 0.0, **cfg}))
    c._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return c


def test_config_is_validated():
    for bad in ({"max_in_flight": 0}, {"timeout_s": 0}, {"retries": -1}, {"backoff_s": -1}):
        with pytest.raises(ConfigError):
            RemoteConfig(**bad)
    assert "64 in flight" in RemoteConfig().summary()


def test_retry_after_seconds_or_http_date():
    assert retry_after_s("3") == 3.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(when) <= 31


def test_split_urls():
    assert split_urls("http://a/v1, http://b/v1,") == ["http://a/v1", "http://b/v1"]
    assert split_urls(["http://a"]) == ["http://a"]


def test_in_flight_counts_sequences_first_come_first_served():
    limit = InFlight(4)
    order, peak = [], []

    def take(name, units, hold):
        limit.acquire(units)
        order.append(name)
        peak.append(limit.current)
        time.sleep(hold)
        limit.release(min(units, 4))

    first = threading.Thread(target=take, args=("a", 3, 0.1))
    first.start()
    time.sleep(0.02)
    big = threading.Thread(target=take, args=("big", 9, 0.0))  # more than the limit: waits to be alone
    small = threading.Thread(target=take, args=("small", 1, 0.0))
    big.start()
    time.sleep(0.02)
    small.start()  # fits beside "a", but arrived after "big"
    for t in (first, big, small):
        t.join()
    assert order == ["a", "big", "small"] and max(peak) <= 4
    stats = limit.stats()
    assert stats["peak"] == 4 and 0 < stats["effective"] <= 4


def test_backoff_doubles_up_to_the_cap_and_honours_retry_after(monkeypatch):
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    answers = iter([httpx.Response(503), httpx.Response(503), httpx.Response(503),
                    httpx.Response(429, headers={"Retry-After": "7"}), httpx.Response(429, headers={"Retry-After": "900"}),
                    httpx.Response(200, json={"ok": 1})])
    c = client(lambda request: next(answers), backoff_s=1.0, max_backoff_s=3.0, retries=6)
    assert c.request("POST", "/x", {}).json() == {"ok": 1}
    assert waits == [1.0, 2.0, 3.0, 3.0, 3.0]  # 1, 2, then capped; Retry-After 7 and 900 capped at 3
    assert c.stats()["retries"] == 5 and c.stats()["requests"] == 6


def test_a_60_s_outage_is_ridden_out_with_the_defaults(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))

    def handler(request):
        if 0.5 <= clock[0] < 60.5:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={})

    c = client(handler, backoff_s=RemoteConfig().backoff_s)  # the default retries, backoff and cap
    c.request("POST", "/x", {})  # the server answers ...
    clock[0] = 0.5  # ... then goes away for 60 s
    c.request("POST", "/x", {})
    assert clock[0] >= 60.5 and c.stats()["retries"] == 6  # waited 1 + 2 + 4 + 8 + 16 + 32 s


def test_never_reached_fails_fast(monkeypatch):
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)

    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(CodetoolError, match="cannot connect .* after 3 attempts") as e:
        client(refuse, backoff_s=1.0, retries=8).request("POST", "/x", {})
    assert "\n" not in str(e.value) and len(waits) == 2


def test_a_4xx_is_not_retried_and_is_described():
    c = client(lambda request: httpx.Response(422, text="bad field n"))
    with pytest.raises(CodetoolError, match="n is wrong") as e:
        c.request("POST", "/x", {}, describe=lambda url, status, text: f"{status} {text}: n is wrong")
    assert e.value.status == 422 and c.stats()["requests"] == 1


def test_equal_keys_stay_on_one_endpoint_and_fail_over():
    urls = [f"http://e{i}.invalid" for i in range(3)]
    hits: dict[str, list[str]] = {}

    def handler(request):
        if request.url.host == "e0.invalid":
            raise httpx.ConnectError("down")
        hits.setdefault(request.url.host, []).append(request.content.decode())
        return httpx.Response(200, json={})

    c = client(handler, urls=urls, retries=3, failover_s=60)
    c._answered.add(urls[1])  # the service has answered before: failures are outages, not a wrong URL
    keys = [f"query {i}" for i in range(30)]
    first = {k: c.ranked(k)[0] for k in keys}
    assert len(set(first.values())) == 3  # keys spread over the endpoints
    for k in keys * 2:
        c.request("POST", "/x", {"k": k}, key=k)
    served: dict[str, set[str]] = {}
    for host, bodies in hits.items():
        for body in bodies:
            served.setdefault(body, set()).add(host)
    assert len(served) == 30 and all(len(hosts) == 1 for hosts in served.values())  # one endpoint per key
    moved = [k for k in keys if first[k] == urls[0]]
    assert moved and c.stats()["failovers"] == 1  # e0 failed once, then was left out
    assert all(c.ranked(k)[-1] == urls[0] for k in keys)


def test_unreachable_is_set_by_spent_connect_retries_and_cleared_by_an_answer(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    state = {"mode": "ok"}

    def handler(request):
        if state["mode"] == "down":
            raise httpx.ConnectError("refused")
        if state["mode"] == "slow":
            raise httpx.ReadTimeout("slow")
        return httpx.Response(400 if state["mode"] == "bad" else 200, json={}, text="bad request")

    c = client(handler, retries=2)
    c.request("POST", "/x", {})
    assert c.unreachable is None
    state["mode"] = "down"
    with pytest.raises(CodetoolError, match="cannot connect"):
        c.request("POST", "/x", {})
    assert c.unreachable.startswith("http://a.invalid/x: cannot connect (ConnectError) after 3 attempts")
    state["mode"] = "bad"  # an answer, even a 4xx, means the server is there
    with pytest.raises(CodetoolError, match="HTTP 400"):
        c.request("POST", "/x", {})
    assert c.unreachable is None
    state["mode"] = "slow"  # timeouts are the request's trouble, not a dead server
    with pytest.raises(CodetoolError, match="no answer within"):
        c.request("POST", "/x", {})
    assert c.unreachable is None
