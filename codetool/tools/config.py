"""The tool settings that ``run``, ``build-trees`` and the pipeline's evaluation sets compose,
declared once: how the tools are shown to the policy (:class:`ToolDocGroup`, read by
:mod:`codetool.tools.render`), which backend answers the calls (:class:`ToolBackendGroup`, the
kinds of :data:`codetool.tools.backends.BACKENDS`, opened by ``codetool.assemble.tool_backend``),
and the benchmark data and response cut of a run (:class:`ToolsGroup`). Plain settings: nothing
here opens a backend, so a config can compose them without importing one.
"""

from __future__ import annotations

from dataclasses import dataclass

from codetool.config import option
from codetool.config_groups import Group


@dataclass
class ToolDocGroup(Group):
    """How the tools are documented in the policy's prompt (``codetool.tools.render``)."""

    tool_doc: str = option("full", "tool docs in the prompt: full docstrings, compact one-liners, or brief (names and "
                           "one short line: small models on CPU)", choices=["full", "compact", "brief"])


@dataclass
class ToolBackendGroup(ToolDocGroup):
    """Which backend answers the tool calls (``codetool.tools.backends.BACKENDS``)."""

    tools_backend: str = option("auto", "who answers the tool calls: auto (the simulator; our TMDB mock for RestBench; "
                                "the synthetic world for benchmark world), simulator (offline answers from the spec's "
                                "examples), stabletoolbench (cache, then server, then simulator), cache, server, http "
                                "(your real API: the spec's server or --tool_server_url, bearer token from "
                                "$CODETOOL_TOOL_TOKEN), tmdb, mock-tmdb, world (the testbed's tools, codetool.world)")
    tool_server_url: str | None = option(None, "StableToolBench server URL (tools_backend server/stabletoolbench), or "
                                         "the base URL of your API (tools_backend http)")
    tool_cache_dir: str | None = option(None, "StableToolBench response cache folder (tools_backend cache/stabletoolbench)")


@dataclass
class ToolsGroup(ToolBackendGroup):
    """:class:`ToolBackendGroup` with the benchmark's data folder (benchmark files, the TMDB mock's
    spec) and the cut of one tool response (``codetool.tools.environment``)."""

    max_response_chars: int = option(20000, "characters of one tool response handed to the code")
    data_dir: str | None = option(None, "benchmark data folder (default: see `codetool data`)")
