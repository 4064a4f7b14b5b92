"""Judges: reply parsing, retries, the on-disk cache, redaction, option scoring, a real tiny model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from codetool.assemble import make_judge
from codetool.config import ConfigError
from codetool.judge.config import JudgeConfig
from codetool.judge.llm import LLMJudge, extract_json, parse_choice, render_prompt
from codetool.judge.records import AnswerRequest, CompareRequest, ScriptedJudge


@dataclass
class FakeCompletion:
    text: str
    prompt_tokens: int = 1
    completion_tokens: int = 1
    finish_reason: str = "stop"


class FakeBackend:
    """Replies from a function of the prompt text; records every prompt."""

    name = "fake"

    def __init__(self, reply=None, logps=None):
        self.reply, self.logps = reply, logps
        self.supports_logprobs = logps is not None
        self.prompts: list[str] = []
        self.kwargs: list[dict] = []

    def generate(self, prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=256, stop=None, seed=None):
        self.kwargs.append({"temperature": temperature, "seed": seed})
        texts = [p[-1]["content"] for p in prompts]
        self.prompts += texts
        return [[FakeCompletion(self.reply(t, len(self.prompts)))] for t in texts]

    def option_logprobs(self, prompts, options):
        texts = [p[-1]["content"] for p in prompts]
        self.prompts += texts
        return [self.logps(t, options) for t in texts]


def test_extract_and_parse_replies():
    assert extract_json('Sure! ```json\n{"answer_status": "Solved", "reason": "ok"}\n```') == \
        {"answer_status": "Solved", "reason": "ok"}
    assert extract_json("no json {here") is None
    labels = ("Solved", "Unsure", "Unsolved")
    assert parse_choice('{"answer_status": "unsolved", "reason": "r"}', "answer_status", labels) == ("Unsolved", "r")
    # a reply cut off by max_new_tokens still names its label
    assert parse_choice('{"answer_status": "Solved", "reason": "the answer li', "answer_status", labels)[0] == "Solved"
    assert parse_choice('{"answer_status": "Maybe"}', "answer_status", labels) is None
    assert parse_choice('{"preferred": "B"}', "preferred", ("A", "B", "tie")) == ("B", "")


def test_render_prompt_is_one_pass():
    out = render_prompt("Q: {query}\nA: {answer}", query="what is {answer}?", answer="42")
    assert out == "Q: what is {answer}?\nA: 42"


def test_json_judge_retries_then_caches(tmp_path):
    def reply(prompt, count):
        return "I think it is fine" if count == 1 else '{"answer_status": "Solved", "reason": "complete"}'
    backend = FakeBackend(reply)
    cache = tmp_path / "cache.jsonl"
    judge = LLMJudge(backend, name="fake", cache_path=str(cache), temperature=0.0, retries=2)
    v = judge.judge_answer("How many people live in Paris?", "2.1 million", round=0)
    assert (v.label, v.reason, v.parse_failed, v.cached) == ("Solved", "complete", False, False)
    assert len(backend.prompts) == 2 and backend.kwargs[1]["temperature"] >= 0.7  # the retry samples
    assert "How many people live in Paris?" in backend.prompts[0] and "2.1 million" in backend.prompts[0]
    # a second judge on the same cache file answers without calling the model
    def refuse(prompt, count):
        raise RuntimeError("the cache should answer")
    again_backend = FakeBackend(refuse)
    again = LLMJudge(again_backend, name="fake", cache_path=str(cache), temperature=0.0)
    v2 = again.judge_answer("How many people live in Paris?", "2.1 million", round=0)
    assert (v2.label, v2.cached) == ("Solved", True) and again.calls == 0
    # another round is another verdict
    with pytest.raises(RuntimeError, match="cache should answer"):
        again.judge_answer("How many people live in Paris?", "2.1 million", round=1)


def test_unreadable_replies_count_as_unsolved_and_ties():
    backend = FakeBackend(lambda p, c: "no idea")
    judge = LLMJudge(backend, retries=1, temperature=0.0)
    v = judge.judge_answer("q", "a")
    assert (v.label, v.parse_failed) == ("Unsolved", True) and len(backend.prompts) == 2
    p = judge.compare("q", "a", "b")
    assert (p.winner, p.parse_failed) == ("tie", True)


def test_compare_and_trajectory_prompts():
    backend = FakeBackend(lambda p, c: '{"preferred": "A", "reason": "more complete"}' if "Answer A" in p
                          else '{"answer_status": "Unsure"}')
    judge = LLMJudge(backend, temperature=0.0)
    assert judge.compare("q", "first", "second").winner == "a"
    v = judge.judge_answer("q", "ans", trajectory="Step 1:\ncode:\nprint(1)")
    assert v.label == "Unsure" and "What the assistant did" in backend.prompts[-1]
    assert "print(1)" in backend.prompts[-1]


def test_no_secret_reaches_the_judge(canary_env, tmp_path):
    backend = FakeBackend(lambda p, c: '{"answer_status": "Solved"}')
    judge = LLMJudge(backend, cache_path=str(tmp_path / "c.jsonl"))
    judge.judge_answer(f"query {canary_env}", f"the tool said token={canary_env}",
                       trajectory=f"printed {canary_env}")
    judge.compare("q", f"a {canary_env}", "b")
    assert backend.prompts and not any(canary_env in p for p in backend.prompts)
    assert canary_env not in (tmp_path / "c.jsonl").read_text()


def test_option_scoring_argmax_and_sampling():
    def logps(prompt, options):
        assert options[0] == '{"answer_status": "Solved"'
        return [-0.3, -2.0, -1.5]
    judge = LLMJudge(FakeBackend(logps=logps), kind="local", temperature=0.0)
    assert judge.mode == "options"
    assert judge.judge_answer("q", "a").label == "Solved"
    backend = FakeBackend(logps=logps)
    sampler = LLMJudge(backend, kind="local", temperature=5.0)
    picks = [v.label for v in sampler.judge_answers([AnswerRequest("q", "a", None, r) for r in range(30)])]
    assert len(backend.prompts) == 1 and sampler.calls == 1  # one scoring serves every round
    again = LLMJudge(FakeBackend(logps=logps), kind="local", temperature=5.0)
    assert picks == [again.judge_answer("q", "a", round=r).label for r in range(30)]  # seeded by the request
    assert len(set(picks)) > 1  # a high temperature spreads the labels


def test_tiny_local_model_judges(tiny_model_dir, tmp_path):
    from codetool.models.transformers_backend import TransformersBackend

    backend = TransformersBackend(str(tiny_model_dir), dtype="float32", device="cpu")
    judge = LLMJudge(backend, kind="local", weak=True, name="local:tiny", cache_path=str(tmp_path / "c.jsonl"))
    verdicts = judge.judge_answers([])
    assert verdicts == []
    v = judge.judge_answer("How many people live in Paris?", "About 2.1 million people.")
    p = judge.compare("q", "a", "b")
    assert v.label in ("Solved", "Unsure", "Unsolved") and p.winner in ("a", "b", "tie")
    assert judge.describe()["weak"] and "smoke test" in judge.describe()["note"]


def test_local_judge_loads_on_first_miss(tiny_model_dir, tmp_path):
    cfg = JudgeConfig(model=str(tiny_model_dir), dtype="float32", device="cpu", rounds=2)
    judge = make_judge(cfg, cache_path=str(tmp_path / "c.jsonl"))
    assert judge.name == f"local:{tiny_model_dir}" and judge.weak and judge.mode == "options" and judge._lazy
    first = judge.judge_answer("q", "a")
    assert not judge._lazy
    again = make_judge(cfg, cache_path=str(tmp_path / "c.jsonl"))
    assert again.judge_answer("q", "a").cached and again._lazy  # a cached rerun never loads the model
    assert again.judge_answer("q", "a").label == first.label
    with pytest.raises(Exception, match="not found"):
        make_judge(JudgeConfig(model=str(tmp_path / "no-such-model")))


def test_make_judge_and_scripted():
    assert make_judge(JudgeConfig(model="none")) is None
    with pytest.raises(Exception, match="rounds"):
        JudgeConfig(rounds=0)
    judge = ScriptedJudge(lambda req: "Unsure" if "maybe" in req.answer else "Solved", winner="b")
    assert judge.judge_answer("q", "maybe").label == "Unsure"
    assert judge.compare("q", "x", "y").winner == "b"
    with pytest.raises(Exception, match="label"):
        ScriptedJudge("Great").judge_answer("q", "a")


def test_http_judge_sends_no_key_in_the_prompt(canary_env, tmp_path):
    """make_judge on an OpenAI-compatible URL: loopback fake server, JSON replies, cached rerun."""
    import json

    bodies = []

    def solved(body):
        bodies.append(json.dumps(body))
        reply = '{"answer_status": "Solved", "reason": "it answers"}'
        return ({"choices": [{"index": 0, "message": {"content": reply}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 10, "completion_tokens": 8}}, 200)

    server, url = _fake_server(solved)
    try:
        cfg = JudgeConfig(model=url, cache=str(tmp_path / "cache.jsonl"))
        judge = make_judge(cfg)
        assert judge.name == f"openai:judge-model@{url}" and judge.mode == "tools" and not judge.weak
        v = judge.judge_answer("q", f"the key is {canary_env}")
        assert v.label == "Solved" and len(bodies) == 1
        sent = json.loads(bodies[0])  # a forced function call at the protocol's temperature
        assert sent["tool_choice"]["function"]["name"] == "record_answer_status" and sent["temperature"] == 0.2
        assert sent["tools"][0]["function"]["parameters"]["properties"]["answer_status"]["enum"] == \
            ["Solved", "Unsure", "Unsolved"]
        assert canary_env not in bodies[0] and "[REDACTED]" in bodies[0]
        again = make_judge(JudgeConfig(model=url, remote_model="judge-model", cache=str(tmp_path / "cache.jsonl")))
        assert again.judge_answer("q", f"the key is {canary_env}").cached and len(bodies) == 1
    finally:
        server.shutdown()


@pytest.mark.slow
def test_default_local_judge(tmp_path):
    """The embedded default model as a judge (needs `codetool setup`); flagged weak."""
    from codetool.models.loading import default_model_dir

    if not (default_model_dir() / "config.json").is_file():
        pytest.skip("the default model is not installed (run `codetool setup`)")
    judge = make_judge(JudgeConfig(model="default", dtype="float32", device="cpu"),
                       cache_path=str(tmp_path / "c.jsonl"))
    assert judge.name == "local:default" and judge.weak and judge.mode == "options"
    v = judge.judge_answer("How many people live in Paris?", "About 2.1 million people live in Paris.")
    assert v.label in ("Solved", "Unsure", "Unsolved") and v.reason.startswith("option log-probs")


def _fake_server(handle):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, data, status=200):
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            self._send({"data": [{"id": "judge-model"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])).decode())
            self._send(*handle(body))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def test_forced_function_call_replies_and_json_fallback(tmp_path):
    import json

    def tool_reply(body):
        compare = body["tool_choice"]["function"]["name"] == "record_preference"
        assert '"tie"' not in json.dumps(body["tools"])  # StableToolBench's comparison has no tie
        args = json.dumps({"preferred": "B"} if compare else {"answer_status": "Unsure"})
        call = {"id": "c0", "type": "function", "function": {"name": "x", "arguments": args}}
        return ({"choices": [{"index": 0, "message": {"content": None, "tool_calls": [call]}}]}, 200)
    server, url = _fake_server(tool_reply)
    try:
        judge = make_judge(JudgeConfig(model=url, cache=str(tmp_path / "a.jsonl")))
        assert judge.judge_answer("q", "a").label == "Unsure" and judge.tool_fallbacks == 0
        pref = judge.compare_many([CompareRequest("q", "a", "b", details_a="{}", details_b="{}", allow_tie=False)])
        assert pref[0].winner == "b"
    finally:
        server.shutdown()

    def refuse_tools(body):
        if "tools" in body:
            return {"error": {"message": "tools are not supported"}}, 400
        reply = '{"answer_status": "Solved", "reason": "ok"}'
        return {"choices": [{"index": 0, "message": {"content": reply}, "finish_reason": "stop"}]}, 200
    server, url = _fake_server(refuse_tools)
    try:
        judge = make_judge(JudgeConfig(model=url, cache=str(tmp_path / "b.jsonl")))
        assert judge.judge_answer("q", "a").label == "Solved"
        assert judge.mode == "json" and judge.tool_fallbacks == 1 and judge.describe()["tool_fallbacks"] == 1
    finally:
        server.shutdown()


def test_protocol_defaults():
    stb, paper = JudgeConfig(), JudgeConfig(protocol="codetool")
    assert (stb.rounds, stb.temperature, paper.rounds, paper.temperature) == (3, 0.2, 1, 0.0)
    assert JudgeConfig(protocol="codetool", rounds=3).rounds == 3
    with pytest.raises(ConfigError, match="protocol"):
        JudgeConfig(protocol="mine")


def test_a_judge_on_a_server_sends_one_request_per_verdict_without_waiting_for_a_batch(tmp_path):
    """Against a server (a ``continuous`` backend) the verdicts are not batched (issue 39): the
    first prompt's request waits until every other prompt has been sent, which a batch of 4 could
    not do (its other requests and the next batch waited for it); each prompt is seeded from its
    own key, and every verdict is cached."""
    import threading

    class Server(FakeBackend):
        continuous = True

        def __init__(self):
            super().__init__(lambda text, i: '{"answer_status": "Solved", "reason": "ok"}')
            self.lock, self.all_sent, self.waited = threading.Lock(), threading.Event(), []

        def generate(self, prompts, **kwargs):
            with self.lock:
                self.prompts += [p[-1]["content"] for p in prompts]
                self.kwargs.append({"seed": kwargs.get("seed"), "prompts": len(prompts)})
                if len(self.prompts) == 8:
                    self.all_sent.set()
            if "question 0" in prompts[0][-1]["content"]:
                self.waited.append(self.all_sent.wait(20.0))  # a safety net, not a duration under test
            return [[FakeCompletion('{"answer_status": "Solved", "reason": "ok"}')] for _ in prompts]

    server = Server()
    judge = LLMJudge(server, batch_size=4, cache_path=str(tmp_path / "cache.jsonl"))
    verdicts = judge.judge_answers([AnswerRequest(f"question {i}", f"answer {i}") for i in range(8)])
    assert [v.label for v in verdicts] == ["Solved"] * 8 and server.waited == [True]
    assert all(k["prompts"] == 1 for k in server.kwargs) and len({k["seed"] for k in server.kwargs}) == 8
    assert len(judge.cache.records) == 8 and judge.calls == 8
