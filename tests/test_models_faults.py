"""Every transient fault a server makes is retried and counted by kind (issue 39), at start-up too.

A stub OpenAI-compatible server on 127.0.0.1 (with a ``serve-prm``-style ``/score``) answers its
``n``-th request with the fault scheduled for ``n``: HTTP 500, HTTP 429, a 200 whose body is not
JSON, a reply cut off mid-body (the connection drops), or no answer within the client's timeout.
The first requests of a run are its set-up (the model list, the server probes), so start-up
faults are among them.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from codetool.cli import main
from codetool.jsonl import read_jsonl
from codetool.models.openai_backend import OpenAIBackend
from codetool.models.remote import FAULTS, RemoteConfig
from codetool.prm.client import HTTPScorer
from codetool.rewards import PRMItem
from tests.test_run_remote import write_tools

TIMEOUT_S = 1.0  # the clients' timeout_s in these tests; a "timeout" fault answers after 1.5 s


class FaultyServer:
    """Answers well, except the requests numbered in ``faults`` (1-based, all paths counted).

    Args:
        faults (`dict[int, str]`): request number -> fault kind (one of ``FAULTS``).
    """

    def __init__(self, faults: dict[int, str]):
        self.faults = dict(faults)
        self.count = 0
        self.seen: list[tuple[int, str, str]] = []  # (number, path, fault or "")
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, data: bytes, length: int | None = None, headers: dict | None = None):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data) if length is None else length))
                self.end_headers()
                self.wfile.write(data)

            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.count += 1
                    number = server.count
                    fault = server.faults.get(number, "")
                    server.seen.append((number, self.path, fault))
                try:
                    if fault == "http_5xx":
                        return self._send(500, b"upstream failed")
                    if fault == "http_429":
                        return self._send(429, b'{"error": "slow down"}', headers={"Retry-After": "0"})
                    if fault == "bad_body":
                        return self._send(200, b"<html>502 bad gateway</html>")
                    if fault == "connection":  # the reply is cut off: the connection closes mid-body
                        self._send(200, b'{"choi', length=4096)
                        self.close_connection = True
                        return None
                    if fault == "timeout":
                        time.sleep(TIMEOUT_S * 1.5)
                    self._send(200, json.dumps(server.reply(self.path, body)).encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass
                return None

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @staticmethod
    def reply(path: str, body: dict) -> dict:
        if path.endswith("/models"):
            return {"data": [{"id": "stub-model"}]}
        if path.endswith("/health"):
            return {"status": "ok"}
        if path.endswith("/score"):
            return {"scores": [0.5] * len(body["items"])}
        messages, n = body["messages"], int(body.get("n") or 1)
        if "answer_status" in messages[0]["content"]:  # a judge prompt
            texts = ['{"answer_status": "Solved", "reason": "stub"}'] * n
        elif messages[0]["role"] == "system":  # a search step: a code step, then finish at the second
            step = sum(m["role"] == "assistant" for m in messages[:-1])
            texts = [f"x = {i + 10 * step}\nprint(x)\n```" if step == 0 else f'finish("{i}")\n```' for i in range(n)]
        else:  # a probe: samples differ by seed and index
            texts = [f"s{body.get('seed')}-{i}" for i in range(n)]
        return {"choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                            for i, t in enumerate(texts)], "usage": {"prompt_tokens": 5, "completion_tokens": 2 * n}}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def every_fault():
    """Each fault once at start-up, then two more. One query of ``run`` with a PRM server sends, in
    order: the PRM's reachability check (1), the model list (3), the sampling probe (5), the
    continuation probe (7), step 1 (9) and its scores, step 2 (12) and its scores (14); each fault
    adds its retry."""
    server = FaultyServer({1: "http_5xx", 3: "bad_body", 5: "connection", 7: "timeout", 9: "http_429",
                           12: "bad_body", 14: "http_5xx"})
    yield server
    server.close()


def client_flags(prefix: str) -> list[str]:
    return [f"--{prefix}.retries", "3", f"--{prefix}.backoff_s", "0", f"--{prefix}.timeout_s", str(TIMEOUT_S)]


def test_run_retries_every_fault_and_counts_them_by_kind(every_fault, tmp_path, capsys, monkeypatch):
    """``codetool run`` with a policy server and a PRM server that make every kind of fault, from
    the first request on (the PRM's reachability check, the model list, the probes): no query
    becomes an error record (before: a 200 whose body is not JSON failed its query, and a start-up
    probe got two retries), and the summary counts what was retried, by kind."""
    import codetool.jobs.run_summary as run_summary

    counted: dict[str, dict] = {}
    rows = run_summary.client_rows

    def spy(clients):  # what the summary shows, per client
        counted.update({name: client.stats()["faults"] for name, client in clients.items()})
        return rows(clients)

    monkeypatch.setattr(run_summary, "client_rows", spy)
    out = tmp_path / "t.jsonl"
    status = main(["run", "--query", "What is the weather in Paris?", "--tools", str(write_tools(tmp_path)),
                   "--policy", f"{every_fault.url}/v1", "--prm", every_fault.url, "--output", str(out),
                   "--search.max_steps", "2", "--executor.isolation", "fallback",
                   *client_flags("policy_client"), *client_flags("prm_client")])
    shown = capsys.readouterr().out
    assert status == 0
    [traj] = read_jsonl(out)
    assert traj["finish_type"] == "finish" and len(traj["steps"]) == 2
    assert all(c["r_latent"] == 0.5 for s in traj["steps"] for c in s["candidates"])  # the PRM answered
    injected = [fault for _, _, fault in every_fault.seen if fault]
    assert sorted(injected) == sorted(every_fault.faults.values())  # every scheduled fault happened
    assert set(counted) == {"policy", "prm"} and "policy faults retried" in shown and "prm faults retried" in shown
    assert {kind: counted["policy"][kind] + counted["prm"][kind] for kind in FAULTS} == {
        kind: injected.count(kind) for kind in FAULTS}


def test_a_backend_retries_each_fault_at_start_up(every_fault):
    """The model list and the sampling probe (the first requests of a backend) get every retry a
    request gets: before, a probe had two, and a 200 that is not JSON had none."""
    backend = OpenAIBackend(f"{every_fault.url}/v1", retries=3, backoff_s=0.0, timeout_s=TIMEOUT_S)
    [[a, b]] = backend.generate(["hi"], n=2, temperature=1.0)  # probes sampling first (n > 1)
    assert backend.model == "stub-model" and a.text != b.text
    faults = backend.stats()["faults"]
    assert sum(faults.values()) == backend.stats()["retries"] >= 3
    assert faults["http_5xx"] == 1 and faults["bad_body"] == 1 and faults["connection"] == 1


@pytest.mark.parametrize("kind", FAULTS)
def test_each_fault_of_the_prm_server_is_retried(kind):
    server = FaultyServer({1: kind, 2: kind})
    try:
        scorer = HTTPScorer(server.url, retries=3, backoff_s=0.0, timeout_s=TIMEOUT_S)
        item = PRMItem(query="q", tools="t", history=[], candidate="x = 1", candidate_output="1")
        assert scorer.score([item, item]) == [0.5, 0.5]
        assert scorer.stats()["faults"][kind] == 2 and scorer.stats()["retries"] == 2
    finally:
        server.close()


def test_the_judge_retries_faults_and_every_verdict_is_kept(tmp_path):
    """A judge on a server: its faults are retried per request, no verdict becomes an error."""
    from codetool.assemble import make_judge
    from codetool.judge.config import JudgeConfig
    from codetool.judge.records import AnswerRequest

    server = FaultyServer({2: "bad_body", 3: "http_5xx", 4: "connection", 6: "http_429", 7: "timeout"})
    try:
        judge = make_judge(JudgeConfig(model=f"{server.url}/v1", mode="json", cache=str(tmp_path / "c.jsonl"),
                                       client=RemoteConfig(retries=3, backoff_s=0.0, timeout_s=TIMEOUT_S)))
        verdicts = judge.judge_answers([AnswerRequest(f"q{i}", f"a{i}") for i in range(6)])
        assert [v.label for v in verdicts] == ["Solved"] * 6 and not any(v.error for v in verdicts)
        faults = judge.backend.stats()["faults"]
        assert {k: v for k, v in faults.items() if v} == {"bad_body": 1, "http_5xx": 1, "connection": 1,
                                                            "http_429": 1, "timeout": 1}
    finally:
        server.close()
