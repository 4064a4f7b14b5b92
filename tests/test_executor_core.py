"""The executor's interface: state, fork, tool proxy, finish/give_up, errors for the model, records.

Every test runs in both isolation modes (bubblewrap skipped with the reason where it cannot run).
"""

from __future__ import annotations

import json
import operator
import threading
import time

import pytest

from codetool.config import ConfigError
from codetool.executor import (
    ExecutionResult,
    Executor,
    ExecutorConfig,
    ExecutorError,
    ToolCall,
)
from codetool.executor.result import NOT_EXECUTED
from codetool.rewards import on_the_spot
from codetool.tools.spec import ToolResponse, remaining_s

CONFIG = dict(timeout_s=2.0, grace_s=0.5, memory_mb=512, tool_timeout_s=1.0)


class Counter:
    """A host tool that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, city: str, unit: str = "C"):
        self.calls += 1
        return {"city": city, "unit": unit, "temp": 21, "call": self.calls}


def slow(seconds: float = 5.0):
    time.sleep(seconds)
    return "late"


def raw(**kwargs):
    return kwargs["value"]


TOOLS = {
    "html_error": lambda: ToolResponse("http_error", content="<html><body>500</body></html>", error="HTTP 500",
                                       http_status=500),
    "gateway": lambda: ToolResponse("http_error", error="HTTP 503", http_status=503, outage=True),
    "deadline": lambda: remaining_s(100.0),
    "html_ok": lambda: ToolResponse("ok", content="<html><body>hello</body></html>"),
    "not_json": lambda: "OK but not json <br>",
    "json_text": lambda: ToolResponse("ok", content='{"a": [1, 2]}'),
    "huge": lambda: ToolResponse("ok", content=json.dumps({"blob": "x" * 10_000_000})),
    "explode": lambda: 1 / 0,
    "unjsonable": lambda: {1, 2},
    "slow": slow,
    "raw": raw,
    "varargs": lambda *args, **kwargs: {"args": list(args), "kwargs": kwargs},
    "nosig": operator.itemgetter(0),  # inspect.signature cannot read it
}



@pytest.fixture(scope="module")
def counter():
    return Counter()


@pytest.fixture(scope="module")
def root(mode, counter):
    ex = Executor(ExecutorConfig(isolation=mode, **CONFIG), tools={**TOOLS, "weather": counter})
    yield ex
    ex.close()


@pytest.fixture
def ex(root):
    child = root.fork()
    yield child
    child.close()


# ---------------------------------------------------------------------------- state and fork
def test_state_persists_and_result_fields(ex, mode):
    assert ex.run("import math\nx = 41\ndef inc(v):\n    return v + 1").ok
    r = ex.run("print(inc(x), math.floor(2.5))")
    assert r.ok and r.stdout == "42 2\n" and r.outcome == "ok" and not r.timed_out
    assert r.error_type is None and r.error_message is None and not r.state_lost
    assert r.isolation.startswith(mode) and "rlimits(" in r.isolation
    data = r.to_dict()
    assert json.loads(json.dumps(data))["timed_out"] is False
    assert ExecutionResult.from_dict(data) == r


def test_fork_is_independent_and_repeats_nothing(ex, counter):
    before = counter.calls
    assert ex.run("w = weather('Paris'); x = 1").ok
    children = [ex.fork() for _ in range(3)]
    try:
        for i, child in enumerate(children):
            r = child.run(f"x += {i + 1}; print(x, w['city'])")
            assert r.stdout == f"{i + 2} Paris\n" and r.tool_calls == []
        assert ex.run("print(x)").stdout == "1\n"
        grandchild = children[0].fork()
        assert grandchild.run("print(x)").stdout == "2\n"
        grandchild.close()
    finally:
        for child in children:
            child.close()
    assert counter.calls == before + 1  # the tool ran once, before the forks


def test_closing_the_parent_keeps_children(root):
    parent = root.fork()
    parent.run("y = 'kept'")
    child = parent.fork()
    parent.close()
    assert child.run("print(y)").stdout == "kept\n"
    child.close()
    with pytest.raises(ExecutorError, match="closed"):
        child.run("pass")
    child.close()  # idempotent


def test_fork_tree_depth_5_branching_2(root):
    nodes = [root.fork()]
    nodes[0].run("path = ''")
    for _ in range(5):
        nxt = []
        for node in nodes:
            for branch in "ab":
                child = node.fork()
                assert child.run(f"path += '{branch}'").ok
                nxt.append(child)
            node.close()
        nodes = nxt
    outputs = sorted(node.run("print(path)").stdout.strip() for node in nodes)
    assert len(outputs) == 32 and len(set(outputs)) == 32 and all(len(p) == 5 for p in outputs)
    for node in nodes:
        node.close()


def test_siblings_run_concurrently_from_threads(root):
    """Three siblings run from three threads at once: each step calls a host tool that returns only
    when all three have called it (a wait the step's clock does not count). Run one after another,
    the first would wait alone until the barrier's safety limit broke it (never a measured bound:
    before, the test asserted a wall time, which a busy machine exceeds)."""
    barrier = threading.Barrier(3, timeout=240)

    def meet():
        barrier.wait()
        return "met"

    ex = Executor(ExecutorConfig(isolation=root._sandbox.mode, **dict(CONFIG, tool_timeout_s=300)), tools={"meet": meet})
    siblings = [ex.fork() for _ in range(3)]
    results = [None] * 3

    def go(i):
        results[i] = siblings[i].run("print(meet())")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert all(r.ok and r.stdout == "met\n" for r in results), results
    finally:
        for s in siblings:
            s.close()
        ex.close()


# ------------------------------------------------------------------------------- tool proxy
def test_tool_calls_positional_keyword_and_record(ex, counter):
    r = ex.run("a = weather('Oslo', unit='F')\nb = weather(city='Rome')\nprint(a['unit'], b['city'])")
    assert r.ok and r.stdout == "F Rome\n"
    assert [c.arguments for c in r.tool_calls] == [{"city": "Oslo", "unit": "F"}, {"city": "Rome"}]
    assert all(isinstance(c, ToolCall) and c.status == "ok" and c.latency_s >= 0 for c in r.tool_calls)
    assert on_the_spot(r) == 1.0


def test_tool_calls_from_threads(ex):
    r = ex.run("from concurrent.futures import ThreadPoolExecutor\n"
               "with ThreadPoolExecutor(4) as pool:\n"
               "    out = list(pool.map(lambda c: weather(c)['city'], ['a', 'b', 'c', 'd', 'e', 'f']))\n"
               "print(out)")
    assert r.ok and r.stdout == "['a', 'b', 'c', 'd', 'e', 'f']\n"
    assert sorted(c.arguments["city"] for c in r.tool_calls) == list("abcdef")


def test_tool_argument_errors(ex):
    r = ex.run("weather('a', 'b', 'c')")
    assert r.error_type == "ToolError" and "invalid_arguments" in r.error_message
    assert r.tool_calls[0].status == "invalid_arguments"
    for name in ("raw", "nosig"):
        r = ex.run(f"{name}(1)")
        assert r.error_type == "ToolError" and "keyword arguments only" in r.error_message
    r = ex.run("weather(city={1, 2})")
    assert r.error_type == "TypeError" and "'city' is a set" in r.error_message and r.tool_calls == []
    r = ex.run("print(varargs(1, 2, k='v'))")
    assert r.ok and r.stdout == "{'args': [1, 2], 'kwargs': {'k': 'v'}}\n"


def test_tool_failures_are_tool_errors_not_crashes(ex):
    r = ex.run("html_error()")
    assert not r.ok and r.error_type == "ToolError" and "HTTP 500" in r.error_message
    assert r.tool_calls[0].status == "http_error" and on_the_spot(r) == 0.0
    r = ex.run("try:\n    html_error()\nexcept ToolError as e:\n    print(e.status)")
    assert r.ok and r.stdout == "http_error\n"
    assert on_the_spot(r) == 0.0 and on_the_spot(r, tool_error_is_failure=False) == 1.0
    r = ex.run("explode()")
    assert r.error_type == "ToolError" and "ZeroDivisionError" in r.error_message
    r = ex.run("unjsonable()")
    assert r.error_type == "ToolError" and "not JSON" in r.error_message


def test_tool_content_kinds(ex):
    r = ex.run("print(repr(html_ok()), repr(not_json()), json_text())")
    assert r.ok and r.stdout == "'<html><body>hello</body></html>' 'OK but not json <br>' {'a': [1, 2]}\n"
    r = ex.run("h = huge()\nprint(len(h['blob']))")
    assert r.ok and r.stdout == "10000000\n"
    assert ex.run("print(len(h['blob']) // 1000)").stdout == "10000\n"


@pytest.mark.parametrize("code", ["try:\n    {call}\nexcept ToolError as e:\n    print(e.status)", "{call}",
                                  "print({call})"])
@pytest.mark.parametrize("call", ["slow()", "gateway()"])
def test_a_tool_outage_is_the_machines_failure_whatever_the_code_did(root, code, call):
    """A tool that gives no answer within ``tool_timeout_s`` (its thread abandoned), or answers a
    ``ToolResponse`` marked ``outage`` (HTTP 503 after the client's retries), failed on the machine's
    side: the step is ``not_executed`` (``ToolOutage``), caught or not, and its state is gone. Before,
    a caught one was ``ok`` with a failed tool call (on-the-spot reward 0) and an uncaught one the
    code's ``runtime_error``."""
    child = root.fork()
    try:
        r = child.run(code.format(call=call))
        assert r.outcome == NOT_EXECUTED and r.error_type == "ToolOutage" and r.state_lost
        assert "failed on the machine's side" in r.error_message and call[:-2] in r.error_message
        assert r.tool_calls[0].status == ("timeout" if call == "slow()" else "http_error")
    finally:
        child.close()


def test_a_tool_runs_with_a_deadline_that_leaves_its_fallbacks_time(ex):
    """The proxy gives the callable ``CALL_DEADLINE`` at 80% of ``tool_timeout_s`` (1 s here), which
    the HTTP clients honour, so a chain's simulator answers before the proxy gives up."""
    r = ex.run("print(deadline())")
    assert r.ok and 0 < float(r.stdout) <= 0.8, r


def test_host_decided_failures_stand_after_an_outage(root):
    """Over the tool-call budget after outages: the code's ``ToolLimit``; an HTTP 500 (no outage)
    stays the code's tool error."""
    child = root.fork()
    try:
        r = child.run("while True:\n    try:\n        gateway()\n    except ToolError:\n        pass")
        assert r.outcome == "resource_limit" and r.error_type == "ToolLimit"
    finally:
        child.close()


# A thread of the step burns CPU while the main one waits in tool calls, until 3 CPU-s are used:
# spinning itself, or in short-lived children it forks and reaps.
CPU_BURNERS = {
    "spinning_thread": "def burn():\n    while time.process_time() < 3:\n        pass\n",
    "reaped_children": ("def used():\n    t = os.times()\n"
                        "    return t.user + t.system + t.children_user + t.children_system\n"
                        "def burn():\n    while used() < 3:\n        pid = os.fork()\n        if pid == 0:\n"
                        "            end = time.process_time() + 0.05\n"
                        "            while time.process_time() < end:\n                pass\n"
                        "            os._exit(0)\n        os.waitpid(pid, 0)\n"),
}


@pytest.mark.parametrize("burner", sorted(CPU_BURNERS))
def test_the_cpu_a_step_uses_while_its_tool_calls_run_is_its_time(root, burner):
    """The CPU is the step's (checked while a call runs and after it; the worker's whole-process CPU
    since the step began, so ended threads and reaped children count), so the step times out: the
    tool time given back never buys CPU. Red team, round 5: with the deadline moved by each call,
    the spinning thread came back ``ok`` after several times its ``timeout_s`` in CPU; counting
    live threads only, so did the reaped children."""
    patient = Executor(ExecutorConfig(isolation=root._sandbox.mode, timeout_s=1.0, tool_timeout_s=30,
                                      max_tool_calls=10_000), tools={"slow": slow})
    try:
        r = patient.run("import os, threading, time\n" + CPU_BURNERS[burner]
                        + "t = threading.Thread(target=burn)\nt.start()\nwhile t.is_alive():\n    slow(0.3)\nprint('done')")
        assert r.outcome == "timeout" and r.error_type == "Timeout", r
    finally:
        patient.close()


def test_a_tool_calls_time_is_not_the_steps(root):
    """A tool that answers within ``tool_timeout_s`` but after the step's own ``timeout_s``: the step
    is ``ok`` (before, the host's wait for the tool counted as the code's time: ``timeout``)."""
    patient = Executor(ExecutorConfig(isolation=root._sandbox.mode, timeout_s=0.5, tool_timeout_s=30),
                       tools={"slow": slow})
    try:
        r = patient.run("print(slow(1.0), slow(0.5))")
        assert r.ok and r.stdout == "late late\n"
        assert patient.run("print('alive')").stdout == "alive\n"
    finally:
        patient.close()


# ------------------------------------------------------------------------- finish and give_up
def test_finish_and_give_up(ex):
    r = ex.run("def answer():\n    finish({'n': 3})\nanswer()\nprint('not reached')")
    assert r.ok and r.final_answer == "{'n': 3}" and r.stdout == ""
    r = ex.run("try:\n    finish('first')\nexcept BaseException:\n    pass\nfinish('second')")
    assert r.final_answer == "first"
    r = ex.run("give_up('no tool fits')")
    assert r.ok and r.give_up_reason == "no tool fits" and r.final_answer is None


# ------------------------------------------------------------------------- errors for the model
def test_error_messages_point_at_the_line(ex):
    r = ex.run("x = 1\ny = undefined_name + x")
    assert r.error_type == "NameError"
    assert r.error_message == "NameError: name 'undefined_name' is not defined\n  at line 2: y = undefined_name + x"
    ex.run("def bad(v):\n    return v / 0")
    r = ex.run("z = 5\nbad(z)")
    assert "ZeroDivisionError" in r.error_message and "earlier step" in r.error_message
    assert "in bad: return v / 0" in r.error_message and "called from line 2: bad(z)" in r.error_message
    r = ex.run("print('x'\nprint(1)")
    assert r.error_type == "SyntaxError" and "at line 1" in r.error_message
    assert ex.run("print('still fine')").ok


# ----------------------------------------------------------------------------- configuration
def test_config_validation_and_tool_names():
    with pytest.raises(ConfigError, match="isolation"):
        ExecutorConfig(isolation="docker")
    with pytest.raises(ConfigError, match="timeout_s"):
        ExecutorConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="memory_mb"):
        ExecutorConfig(memory_mb=16)
    for bad in ("finish", "not an identifier", "class", "__import__", "print"):
        with pytest.raises(ExecutorError):
            Executor(ExecutorConfig(isolation="fallback"), tools={bad: print})
    with pytest.raises(ExecutorError, match="not a callable"):
        Executor(ExecutorConfig(isolation="fallback"), tools={"x": 3})


def test_bwrap_requested_but_unavailable(monkeypatch):
    import codetool.executor.host.family as family

    monkeypatch.setattr(family, "bwrap_problem", lambda python="auto": "bubblewrap is not installed")
    with pytest.raises(ExecutorError, match="bubblewrap is not installed"):
        Executor(ExecutorConfig(isolation="bwrap"))


def test_run_rejects_non_text(ex):
    with pytest.raises(TypeError):
        ex.run(b"print(1)")


def test_the_root_hides_every_module_the_host_sends():
    """A worker installs ``launch.WORKER_MODULES`` from source (the root passes them on), and its
    keeper removes its own copy of that list from ``sys.modules`` before any model code runs: the
    lists must agree, or a module (``sandbox_io``, say) stays importable by the code."""
    from codetool.executor.host import launch
    from codetool.executor.inside import keeper, root

    assert keeper.WORKER_MODULES == launch.WORKER_MODULES == root.WORKER_MODULES
    assert launch.SANDBOX_MODULES.index("sandbox_io") < launch.SANDBOX_MODULES.index("sandbox_worker")
