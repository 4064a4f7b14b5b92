"""The two records every tool backend and the executor share, :class:`APISpec` and
:class:`ToolResponse`, and the seam between them, :class:`ToolBackend`.

An :class:`APISpec` describes one API (one endpoint of a tool, in ToolBench's words) whether it
came from a StableToolBench/ToolBench query's ``api_list``, a ToolBench tool file, or an OpenAPI
operation. A backend's ``call(api, arguments) -> ToolResponse`` never raises for a failed call: a
hang, an HTTP error, an HTML page or a 10 MB body all come back as a structured response.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# ToolResponse.status values. Everything but "ok" is a tool failure (distinct from a code failure).
TOOL_STATUSES = ("ok", "http_error", "timeout", "invalid_arguments", "not_found", "api_error", "error")


@dataclass
class Parameter:
    """One API parameter.

    Args:
        name (`str`): the parameter name as the API expects it.
        type (`str`): JSON-schema-like type: ``string``, ``integer``, ``number``, ``boolean``,
            ``array`` or ``object`` (benchmark spellings such as ``STRING`` are normalised).
        description (`str`): free text from the benchmark.
        default (`Any`): the documented default or example value, if any.
        required (`bool`): whether the API needs it.
        location (`str`): ``query``, ``path``, ``header`` or ``body`` (OpenAPI); ``query`` otherwise.
        enum (`list` or `None`): the allowed values, when the spec lists them (OpenAPI ``enum``).
    """

    name: str
    type: str = "string"
    description: str = ""
    default: Any = None
    required: bool = False
    location: str = "query"
    enum: list[Any] | None = None


@dataclass
class APISpec:
    """One API of one tool.

    Args:
        category (`str`): RapidAPI category (ToolBench) or ``openapi``.
        tool (`str`): tool name (a RapidAPI service, or the OpenAPI title).
        api (`str`): API name (or OpenAPI ``operationId`` / ``METHOD path``).
        description (`str`): what the API does.
        parameters (`list[Parameter]`): required ones first, then optional ones.
        method (`str`): HTTP method.
        url (`str`): the endpoint URL when known (ToolBench tool files, OpenAPI servers).
        path (`str`): the OpenAPI path template, e.g. ``/movie/{movie_id}/credits``.
        template_response (`Any`): ToolBench's type sketch of the response, if any.
        example_response (`Any`): an example response body (OpenAPI), if any.
        tool_description (`str`): description of the whole tool.
        name (`str`): the Python function name the policy calls (set by the renderer).
    """

    category: str
    tool: str
    api: str
    description: str = ""
    parameters: list[Parameter] = field(default_factory=list)
    method: str = "GET"
    url: str = ""
    path: str = ""
    template_response: Any = None
    example_response: Any = None
    tool_description: str = ""
    name: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(tool, api)``: how benchmarks name an API (e.g. StableToolBench ``relevant APIs``)."""
        return (self.tool, self.api)

    @property
    def required(self) -> list[Parameter]:
        return [p for p in self.parameters if p.required]

    @property
    def optional(self) -> list[Parameter]:
        return [p for p in self.parameters if not p.required]


CALL_DEADLINE: ContextVar[float | None] = ContextVar("codetool_tool_call_deadline", default=None)
"""``time.monotonic()`` by which the caller of a tool needs its answer, or ``None``. The executor's
tool proxy sets it in the thread that performs a call (a share of ``tool_timeout_s``), so that a
backend chain gives up on a slow service in time for its fallback to answer (a chain that was still
waiting when the proxy's limit passed left the step an outage) and an abandoned call ends soon
after. :func:`codetool.tools.clients.http_call` and the clients' retries read it."""


def remaining_s(limit_s: float) -> float:
    """``limit_s``, or less when :data:`CALL_DEADLINE` is nearer (seconds; 0 when it has passed)."""
    deadline = CALL_DEADLINE.get()
    return limit_s if deadline is None else max(0.0, min(limit_s, deadline - time.monotonic()))


@dataclass
class ToolResponse:
    """The outcome of one API call.

    Args:
        status (`str`): ``ok`` or a failure kind from ``TOOL_STATUSES``.
        content (`str`): the response body as text (JSON text when the API returned JSON),
            possibly truncated (see ``truncated``).
        error (`str` or `None`): a short, model-readable reason when ``status != "ok"``.
        latency_s (`float`): seconds the call took, fallbacks included.
        source (`str`): which backend answered: ``server``, ``cache``, ``simulator``, ``http``.
        simulated (`bool`): whether the content was made up by the simulator.
        fallbacks (`list[str]`): earlier backends that failed, each ``"name: reason"``.
        truncated (`bool`): whether ``content`` was cut to the configured cap.
        http_status (`int` or `None`): the HTTP status code, when there was one.
        outage (`bool`): the failure is the tool service's, not an answer to these arguments: no
            answer in time, a connection that failed or broke, or HTTP 502/503/504, after the
            client's retries (:func:`codetool.tools.clients.http_call`). The executor counts a step
            that met one as ``not_executed`` (docs/EXECUTOR.md); a refusal of the arguments, an HTTP
            500 or a backend that raised is no outage (the model sees it and may work around it).
    """

    status: str
    content: str = ""
    error: str | None = None
    latency_s: float = 0.0
    source: str = ""
    simulated: bool = False
    fallbacks: list[str] = field(default_factory=list)
    truncated: bool = False
    http_status: int | None = None
    outage: bool = False

    def __post_init__(self):
        if self.status not in TOOL_STATUSES:
            raise ValueError(f"ToolResponse.status must be one of {TOOL_STATUSES}, got {self.status!r}.")

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class ToolBackend(Protocol):
    """The seam between tool functions and whatever answers them (``codetool.tools.backends``
    builds one by kind from its ``BACKENDS`` table). ``call`` never raises for a failed call.

    Attributes:
        name (`str`): the backend's kind as records show it (``ToolResponse.source``).
    """

    name: str

    def call(self, api: APISpec, arguments: dict) -> ToolResponse: ...
