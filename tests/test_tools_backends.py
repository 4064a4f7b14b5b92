"""The fallback chain and the table of backend kinds (``codetool.tools.backends``); the chain
against a misbehaving server is in ``test_tools_clients.py``."""

import pytest

from codetool import CodetoolError
from codetool.tools import (
    APISpec,
    CacheBackend,
    FallbackBackend,
    Parameter,
    SimulatorBackend,
    make_tool_backend,
)
from codetool.tools.backends import BACKENDS

API = APISpec("Data", "TheClique", "Songkick concert", parameters=[Parameter("id_conc", required=True)])


def test_simulated_answers_are_not_recorded(tmp_path):
    cache = CacheBackend(tmp_path)
    FallbackBackend([cache, SimulatorBackend()], cache=cache).call(API, {"id_conc": "1"})
    assert not cache.path_for(API).exists()


def test_backend_exceptions_become_error_responses():
    class Broken:
        name = "broken"

        def call(self, api, arguments):
            raise RuntimeError("boom")

    response = FallbackBackend([Broken()]).call(API, {})
    assert response.status == "error" and "RuntimeError" in response.error


def test_make_tool_backend():
    assert isinstance(make_tool_backend("simulator"), SimulatorBackend)
    chain = make_tool_backend("stabletoolbench", url="http://127.0.0.1:9/virtual", cache_dir="/tmp/x")
    assert [b.name for b in chain.backends] == ["cache", "server", "simulator"]
    assert make_tool_backend("mock-tmdb", port=8123).base_url == "http://127.0.0.1:8123"
    assert set(BACKENDS) >= {"simulator", "cache", "server", "http", "stabletoolbench", "tmdb", "mock-tmdb"}
    with pytest.raises(CodetoolError, match="choose one of"):
        make_tool_backend("magic")
    with pytest.raises(CodetoolError, match="simulator"):
        make_tool_backend("simulator", colour="red")
