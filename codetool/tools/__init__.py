"""Tool environments: benchmark APIs as Python functions, with real and offline backends.

Load APIs (:mod:`~codetool.tools.loaders`, :mod:`~codetool.tools.openapi`), render them for the
prompt (:mod:`~codetool.tools.render`), answer calls through a backend
(:mod:`~codetool.tools.backends`, :mod:`~codetool.tools.clients`, :mod:`~codetool.tools.cache`,
:mod:`~codetool.tools.simulator`) and wrap one query's tools
as host callables (:mod:`~codetool.tools.environment`). Local mock servers live in
:mod:`~codetool.tools.mock_servers`; ``codetool data fetch`` in :mod:`~codetool.tools.data`.
"""

from codetool.tools.backends import BACKENDS, FallbackBackend, make_tool_backend
from codetool.tools.cache import CacheBackend
from codetool.tools.clients import HTTPBackend, StableToolBenchClient
from codetool.tools.data import data_root
from codetool.tools.environment import CallRecord, ToolEnvironment
from codetool.tools.loaders import (
    STABLETOOLBENCH_GROUPS,
    BenchmarkQuery,
    load_restbench,
    load_stabletoolbench,
    load_toolbench_queries,
    load_toolbench_tool_file,
    missing_report,
)
from codetool.tools.names import assign_function_names, canonical_arguments
from codetool.tools.openapi import load_openapi
from codetool.tools.render import render_tools
from codetool.tools.simulator import SimulatorBackend
from codetool.tools.spec import TOOL_STATUSES, APISpec, Parameter, ToolBackend, ToolResponse

__all__ = [
    "APISpec", "BACKENDS", "BenchmarkQuery", "CacheBackend", "CallRecord", "FallbackBackend", "HTTPBackend",
    "Parameter", "STABLETOOLBENCH_GROUPS", "SimulatorBackend", "StableToolBenchClient", "TOOL_STATUSES",
    "ToolBackend", "ToolEnvironment", "ToolResponse", "assign_function_names", "canonical_arguments",
    "data_root", "load_openapi", "load_restbench", "load_stabletoolbench", "load_toolbench_queries",
    "load_toolbench_tool_file", "make_tool_backend", "missing_report", "render_tools",
]
