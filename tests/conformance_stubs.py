"""The conformance corpus (``../shared/conformance``, its README) for the tests that check our
reference modes against it: where it lives, its JSONL files, and its stub tool layer as the host
callables of our executor (``stub_tools.py``: an answer with a non-empty ``error`` is an
``api_error``, as codetool's side of the corpus ran them)."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA

CONFORMANCE = SHARED_DATA.parent / "conformance"
STUB_TOOLS = ("get_weather_for_weatherapi", "search_person_for_tmdb", "person_movie_credits_for_tmdb",
              "convert_currency_for_fx", "list_holidays_for_calendar", "geocode_for_geo", "top_headlines_for_news")


def corpus(*parts: str) -> Path:
    """A path of the corpus; skips the test when the corpus is not there (a clone without
    ``../shared``)."""
    path = CONFORMANCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"conformance corpus not found at {path}")
    return path


def jsonl(*parts: str) -> list[dict]:
    return [json.loads(line) for line in corpus(*parts).read_text(encoding="utf-8").splitlines() if line.strip()]


def stub_functions() -> dict:
    """The seven stub tools as host callables returning ``ToolResponse`` (their signatures kept)."""
    from codetool.tools.spec import ToolResponse

    spec = importlib.util.spec_from_file_location("conformance_stub_tools", corpus("stub_tools.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def host(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            value = func(*args, **kwargs)
            if isinstance(value, dict) and value.get("error"):
                return ToolResponse("api_error", content="", error=value["error"])
            return ToolResponse("ok", content=json.dumps(value))
        return call

    return {name: host(getattr(module, name)) for name in STUB_TOOLS}


class StubEnv:
    """A stand-in tool environment: ``functions()`` only (what the executor factory reads)."""

    def functions(self) -> dict:
        return stub_functions()


def stub_runner():
    """A :class:`ReferenceRunner` on the stub tools (fallback sandbox, shared by many programs)."""
    from codetool.executor import Executor, ExecutorConfig
    from codetool.search.reference import ReferenceRunner, ReferenceTools

    executor = Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=ReferenceTools(StubEnv()).functions())
    return ReferenceRunner(executor)


class _LostForks:
    """A clean-state executor whose forks run nothing: each run is ``not_executed`` (the machine
    failed after the executor's retries); the runner's prelude runs on the real root."""

    def __init__(self, inner, lost=False):
        self.inner, self.lost = inner, lost

    def run(self, code, **kw):
        from codetool.executor.result import ExecutionResult

        if self.lost:
            return ExecutionResult(ok=False, outcome="not_executed", error_type="NotExecuted", attempts=3,
                                   error_message="the fork did not start; nothing ran")
        return self.inner.run(code, **kw)

    def fork(self):
        return _LostForks(self.inner.fork(), lost=True)

    def close(self):
        self.inner.close()


def lost_runner():
    """A :class:`ReferenceRunner` on the stub tools whose every program is ``not_executed``."""
    from codetool.executor import Executor, ExecutorConfig
    from codetool.search.reference import ReferenceRunner, ReferenceTools

    executor = Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=ReferenceTools(StubEnv()).functions())
    return ReferenceRunner(_LostForks(executor))
