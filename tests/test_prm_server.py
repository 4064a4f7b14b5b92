"""The PRM server and its HTTP client (codetool.prm.server, codetool.prm.client)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from codetool import CodetoolError
from codetool.prm.client import HTTPScorer
from codetool.prm.server import create_app, serve_in_thread
from codetool.rewards import PRMItem

ITEM = {"query": "weather in Paris?", "tools": "def f(): ...", "history": [{"code": "x = 1", "output": ""}],
        "candidate": "print(f())", "candidate_output": "{}"}


class RecordingScorer:
    """Scores by candidate length; records the size of every call (to see the batching)."""

    def __init__(self, delay_s: float = 0.0):
        self.calls: list[int] = []
        self.delay_s = delay_s

    def score(self, items):
        self.calls.append(len(items))
        time.sleep(self.delay_s)
        return [min(len(item.candidate) / 100.0, 1.0) for item in items]


def _client(scorer, **kwargs):
    from fastapi.testclient import TestClient

    return TestClient(create_app(scorer, **kwargs))


def test_score_and_health():
    with _client(RecordingScorer()) as client:
        assert client.get("/health").json()["status"] == "ok"
        response = client.post("/score", json={"items": [ITEM, {**ITEM, "candidate": "x" * 50}]})
        assert response.status_code == 200
        assert response.json() == {"scores": [0.1, 0.5]}


@pytest.mark.parametrize("body, status, reason", [
    (b"not json", 400, "not valid JSON"),
    (json.dumps([1, 2]).encode(), 400, "'items' list"),
    (json.dumps({"items": [{"candidate": "x"}]}).encode(), 400, "items[0]"),
    (json.dumps({"items": [{**ITEM, "history": "nope"}]}).encode(), 400, "history"),
    (json.dumps({"items": [{**ITEM, "tools": 5}]}).encode(), 400, "items[0].tools"),
    (json.dumps({"items": [ITEM] * 5}).encode(), 413, "limit is 4"),
    (b"x" * 3000, 413, "limit is 2000"),
])
def test_bad_requests_get_one_line_4xx(body, status, reason):
    with _client(RecordingScorer(), max_items=4, max_body_bytes=2000) as client:
        response = client.post("/score", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert reason in error and "\n" not in error and "Traceback" not in response.text


def test_bearer_key_is_checked_on_every_request():
    with _client(RecordingScorer(), api_key="s3cret-key-123") as client:
        assert client.get("/health").status_code == 401
        assert client.post("/score", json={"items": [ITEM]},
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = client.post("/score", json={"items": [ITEM]}, headers={"Authorization": "Bearer s3cret-key-123"})
        assert ok.status_code == 200


def test_scorer_failures_and_timeouts_are_one_line_errors():
    class Broken:
        def score(self, items):
            raise RuntimeError("boom\nwith a second line")

    with _client(Broken()) as client:
        response = client.post("/score", json={"items": [ITEM]})
    assert response.status_code == 500 and response.json()["error"] == "scoring failed (RuntimeError); see the server log"
    with _client(RecordingScorer(delay_s=0.5), request_timeout_s=0.1) as client:
        response = client.post("/score", json={"items": [ITEM]})
    assert response.status_code == 504 and "not scored within" in response.json()["error"]


def test_concurrent_requests_are_batched_and_the_client_works():
    scorer = RecordingScorer(delay_s=0.05)
    app = create_app(scorer, batch_wait_ms=100, max_batch_items=64)
    with serve_in_thread(app) as url:
        assert url.startswith("http://127.0.0.1:")
        client = HTTPScorer(url)
        results = [None] * 6

        def call(i):
            results[i] = client.score([PRMItem(**{**ITEM, "candidate": "y" * (10 * i)})])

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r[0] for r in results] == pytest.approx([0.1 * i for i in range(6)])
        assert max(scorer.calls) > 1 and sum(scorer.calls) == 6  # several requests shared a call
        many = client.score([PRMItem(**ITEM)] * 300)  # split into requests of <= 256 items
        assert len(many) == 300
        # chunked upload without Content-Length is refused
        response = httpx.post(f"{url}/score", content=iter([b'{"items": []}']))
        assert response.status_code == 411
    with pytest.raises(CodetoolError, match="cannot connect"):
        HTTPScorer(url, timeout_s=2, retries=1, backoff_s=0.01).score([PRMItem(**ITEM)])


def test_client_reports_server_errors(monkeypatch):
    monkeypatch.setenv("CODETOOL_PRM_API_KEY", "k-123456")
    with serve_in_thread(create_app(RecordingScorer(), api_key="other-key")) as url:
        with pytest.raises(CodetoolError, match="401: missing or wrong bearer token"):
            HTTPScorer(url).score([PRMItem(**ITEM)])


def test_real_prm_over_http_matches_local_scores(tiny_model_dir):
    from codetool.prm.folder import new_prm
    from codetool.prm.format import PRMFormat
    from codetool.prm.scorer import LocalPRMScorer

    fmt = PRMFormat(max_length=512, max_suffix_length=128)
    scorer = LocalPRMScorer(*new_prm(str(tiny_model_dir), fmt, dtype="float32", device="cpu"), fmt)
    items = [PRMItem(**ITEM), PRMItem(**{**ITEM, "candidate": "print(2)"})]
    local = scorer.score(items)
    with serve_in_thread(create_app(scorer)) as url:
        remote = HTTPScorer(url).score(items)
    assert remote == pytest.approx(local, abs=1e-6)


@pytest.mark.parametrize("sources", [["127.0.0.1"], [f"127.0.0.{i}" for i in range(2, 18)]],
                         ids=["same-address", "16-addresses"])
def test_a_one_item_request_is_scored_next_whatever_another_client_queued(sources):
    """Issue 39: clients were addresses, so an abuser on 16 loopback addresses was 16 clients
    (the victim's p99 rose x13-21), and short requests behind long ones of another connection
    from the same address waited their turn (18x). Now each connection is a client with a
    fair-queuing tag: with both workers held by the abuser's batches and its 8 connections
    queueing more, the victim's one item is in the very next batch a worker takes."""
    gate, calls, lock = threading.Semaphore(0), [], threading.Lock()

    class GateScorer:
        def score(self, items):
            with lock:
                calls.append([item.query for item in items])
            gate.acquire(timeout=120)
            return [0.5] * len(items)

    app = create_app(GateScorer(), workers=2, max_batch_tokens=600, batch_wait_ms=0, request_timeout_s=300)
    item = {"tools": "def f(): ...", "history": [], "candidate": "x" * 2000}  # ~500 tokens: one per batch
    with serve_in_thread(app) as url:
        scheduler = app.app.state.scheduler
        abusers = []
        for k in range(8):
            body = {"items": [{**item, "query": f"abuse {k}-{j}"} for j in range(4)]}
            client = httpx.Client(base_url=url, timeout=300,
                                  transport=httpx.HTTPTransport(local_address=sources[k % len(sources)]))
            abusers.append((client, threading.Thread(target=client.post, args=("/score",), kwargs={"json": body})))
            abusers[-1][1].start()
        while len(calls) < 2 or sum(len(q) for q in list(scheduler.queues.values())) < 8:
            threading.Event().wait(0.01)  # both workers held, every abuser request queued
        answers = []
        victim = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/score", json={"items": [{**item, "query": "victim", "candidate": "print(1)"}]}, timeout=300)))
        victim.start()
        while not any("victim" in [j.items[0].query for j in q] for q in list(scheduler.queues.values())):
            threading.Event().wait(0.01)
        before = len(calls)
        gate.release()  # one worker frees: what does it take?
        while len(calls) == before:
            threading.Event().wait(0.01)
        for _ in range(64):
            gate.release()
        victim.join(120)
        for client, thread in abusers:
            thread.join(120)
            client.close()
    assert calls[before] == ["victim"] and answers[0].status_code == 200


def test_a_prm_server_that_refuses_connections_stops_the_run_before_any_generation():
    import http.server
    import threading

    from codetool.prm.client import HTTPScorer
    from codetool.resume import FatalError

    with pytest.raises(FatalError, match=r"the PRM server cannot be reached \(http://127.0.0.1:9/health: cannot "
                                         r"connect \(ConnectError\) after 3 attempts"):
        HTTPScorer("http://127.0.0.1:9", backoff_s=0.0).check_reachable(timeout_s=2)
    # any HTTP answer counts as reachable, even a 404 (the first /score reports what is wrong)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        HTTPScorer(f"http://127.0.0.1:9,{url}", backoff_s=0.0).check_reachable(timeout_s=2)  # one live of two
    finally:
        server.shutdown()


def test_an_empty_batch_is_answered_at_once_and_harms_nothing():
    """Before (issue 40): {"items": []} killed both scoring threads with IndexError; every later
    request got 504 while /health still said ok."""
    with _client(RecordingScorer(), request_timeout_s=3) as client:
        for _ in range(3):
            response = client.post("/score", json={"items": []})
            assert response.status_code == 200 and response.json() == {"scores": []}
        assert client.post("/score", json={"items": [ITEM]}).json() == {"scores": [0.1]}
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "prm": "prm", "workers": 2, "workers_alive": 2, "worker_restarts": 0}


@pytest.mark.parametrize("item, where, hint", [
    ({**ITEM, "candiate_output": "x"}, "items[0].candiate_output", "did you mean 'candidate_output'?"),
    ({**ITEM, "history": [{"code": "x", "ouput": "y"}]}, "items[0].history[0].ouput", "did you mean 'output'?"),
])
def test_unknown_fields_are_refused_by_name(item, where, hint):
    with _client(RecordingScorer()) as client:
        response = client.post("/score", json={"items": [item]})
        assert response.status_code == 422
        assert response.json()["error"].startswith(f"{where}: unknown field; {hint}")
        top = client.post("/score", json={"items": [ITEM], "itmes": []})
        assert top.status_code == 422 and top.json()["error"].startswith("itmes: unknown field")


def test_the_openapi_schema_and_docs_describe_every_field():
    from codetool.prm.parse import _TEXT_FIELDS
    from codetool.prm.schema import ITEM_FIELDS, ScoreRequest

    assert set(ITEM_FIELDS) == {*_TEXT_FIELDS, "history"}  # the parser and the schema accept the same fields
    with _client(RecordingScorer()) as client:
        document = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
        schemas = document["components"]["schemas"]
        assert document["paths"]["/score"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ScoreRequest"}
        assert all(field.get("description") for field in schemas["ScoreItem"]["properties"].values())
        assert set(schemas["ScoreItem"]["properties"]) == set(ITEM_FIELDS)
        assert "scores" in schemas["ScoreResponse"]["properties"]
        example = schemas["ScoreRequest"]["example"]
        ScoreRequest.model_validate(example)
        assert client.post("/score", json=example).status_code == 200  # the documented example works as sent


class Die(BaseException):
    """Not an Exception: it gets past every handler and ends the thread, as a crash would."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_tells_the_truth_about_dead_workers_and_they_are_restarted():
    class Deadly(RecordingScorer):
        def score(self, items):
            if items[0].candidate == "die":
                raise Die()
            return super().score(items)

    with _client(Deadly(), workers=1, request_timeout_s=0.5) as client:
        assert client.post("/score", json={"items": [{**ITEM, "candidate": "die"}]}).status_code == 504
        for _ in range(100):  # the thread ends just after the 504 is written
            health = client.get("/health")
            if health.status_code == 503:
                break
        assert health.status_code == 503
        assert health.json()["status"] == "unhealthy" and health.json()["workers_alive"] == 0
        again = client.get("/health").json()
        assert again["status"] == "ok" and again["workers_alive"] == 1 and again["worker_restarts"] == 1
        assert client.post("/score", json={"items": [ITEM]}).json() == {"scores": [0.1]}


def test_the_last_idle_worker_is_kept_for_short_items_while_they_keep_coming():
    """With short items arriving, long batches hold every worker but one: a one-item request is
    scored while two workers' worth of another client's long batches wait (no long batch ends
    before it)."""
    gate, calls, lock = threading.Semaphore(0), [], threading.Lock()

    class GateScorer:
        def score(self, items):
            with lock:
                calls.append([item.query for item in items])
            if items[0].query.startswith("abuse"):
                gate.acquire(timeout=120)
            return [0.5] * len(items)

    app = create_app(GateScorer(), workers=2, max_batch_tokens=600, batch_wait_ms=0, request_timeout_s=300)
    long_item = {"tools": "", "history": [], "candidate": "x" * 2000}
    short = {"items": [{"query": "short", "candidate": "print(1)"}]}
    with serve_in_thread(app) as url:
        assert httpx.post(f"{url}/score", json=short, timeout=60).status_code == 200  # short items are coming
        abusers = [threading.Thread(target=httpx.post, args=(f"{url}/score",), daemon=True,
                                    kwargs={"json": {"items": [{**long_item, "query": f"abuse {k}-{j}"} for j in range(3)]},
                                            "timeout": 300}) for k in range(4)]
        for t in abusers:
            t.start()
        scheduler = app.app.state.scheduler
        while sum(len(q) for q in list(scheduler.queues.values())) < 3 or len(calls) < 2:
            time.sleep(0.01)  # one long batch in work, the other requests queued
        answer = httpx.post(f"{url}/score", json=short, timeout=60)  # scored with every long batch still held
        held = len(calls)
        for _ in range(64):
            gate.release()
        for t in abusers:
            t.join(120)
    assert answer.status_code == 200
    assert [c[0].split()[0] for c in calls[:held]] == ["short", "abuse", "short"]
