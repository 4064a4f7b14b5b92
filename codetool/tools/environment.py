"""``ToolEnvironment``: one query's APIs as host-side Python callables, with bookkeeping.

The executor turns each callable of :meth:`ToolEnvironment.functions` into a proxy inside the
sandbox: the model's code calls ``search_for_tool(q="x")``, the proxy forwards the arguments here,
and the :class:`ToolResponse` goes back (parsed JSON for the code when ``content`` is JSON, a
``ToolError`` when the status is not ``ok``).

Each callable
- accepts the arguments as the model wrote them: keywords by their Python names (or the API's raw
  names), positionals in signature order; an unknown name, a missing required argument or too many
  positionals gives ``status="invalid_arguments"`` with a one-line message naming the parameter;
  ``None`` for an optional parameter means "not sent";
- calls the backend and never raises: a backend bug becomes ``status="error"``;
- caps ``content`` at ``max_response_chars`` with a visible marker (``truncated=True``);
- redacts secrets from content and errors, and logs one record per call (no content in logs).

``finish`` and ``give_up`` are rendered (see :func:`codetool.tools.render.render_tools`) but are not
among the callables: they end the episode, which is the executor's and the search's business.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from codetool.secrets import redact, redact_obj
from codetool.tools.backends import safe_call
from codetool.tools.names import assign_function_names, python_parameters
from codetool.tools.render import render_tools
from codetool.tools.spec import APISpec, Parameter, ToolResponse

logger = logging.getLogger(__name__)

DEFAULT_MAX_RESPONSE_CHARS = 100_000  # the largest TMDB example is 82 KB; the executor caps what is printed


@dataclass
class CallRecord:
    """One call through the environment (arguments by the API's raw names, redacted)."""

    function: str
    tool: str
    api: str
    arguments: dict
    status: str
    error: str | None
    latency_s: float
    source: str
    simulated: bool
    fallbacks: list[str]
    truncated: bool
    content_chars: int
    full_content: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return asdict(self)


def truncation_marker(shown: int, total: int) -> str:
    return f"\n...[truncated: showing {shown} of {total} characters]"


class ToolEnvironment:
    """The tools of one query, callable from the host.

    Args:
        apis (`list[APISpec]`): the APIs; function names are assigned when missing or not unique.
        backend (`ToolBackend`): what answers the calls (see ``make_tool_backend``).
        max_response_chars (`int`, *optional*, defaults to `100000`): cap on ``content`` handed to the code
            (in characters; what the model reads is what the code prints, capped by the executor).
        missing_apis (`list[tuple[str, str]]`, *optional*): ``(tool, api)`` pairs the query needs but
            that have no documentation (``query.extra["missing_apis"]``); reported by :meth:`summary`.
        keep_full_responses (`bool`, *optional*, defaults to `False`): keep the uncut content of
            truncated responses in :attr:`calls` (for trajectory records; can be large).
        render_style (`str`, *optional*, defaults to ``"full"``): ``full`` or ``compact`` function
            docs in :meth:`render` (see :mod:`codetool.tools.render`).
    """

    def __init__(self, apis: list[APISpec], backend, *, max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS,
                 missing_apis: list | tuple = (), keep_full_responses: bool = False, render_style: str = "full"):
        self.apis = list(apis)
        names = [api.name for api in self.apis]
        if not all(names) or len(set(names)) != len(names):
            assign_function_names(self.apis)
        self.backend = backend
        self.max_response_chars = max_response_chars
        self.missing_apis = [tuple(pair) for pair in missing_apis]
        self.keep_full_responses = keep_full_responses
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()
        self._params = {api.name: python_parameters(api) for api in self.apis}
        self._by_name = {api.name: api for api in self.apis}
        self.render_style = render_style
        self._rendered: str | None = None

    @classmethod
    def from_query(cls, query, backend, **kwargs) -> ToolEnvironment:
        """The environment of a :class:`~codetool.tools.loaders.BenchmarkQuery` (its missing APIs included)."""
        return cls(query.apis, backend, missing_apis=query.extra.get("missing_apis", []), **kwargs)

    def api_for(self, name: str) -> APISpec | None:
        """The API behind function ``name`` (``None`` for an unknown name, ``finish`` or ``give_up``)."""
        return self._by_name.get(name)

    def describe(self) -> list[dict]:
        """The functions as ToolBench-style function schemas plus where they come from, one dict per
        API: ``name``, ``description``, ``parameters`` (``{"type": "object", "properties",
        "required", "optional"}``, Python argument names), and ``tool``, ``api``, ``category``,
        ``method``, ``path``, ``url`` (for trajectories and StableToolBench's answer format)."""
        out = []
        for api in self.apis:
            params = self._params[api.name]
            properties = {name: {"type": p.type, "description": p.description,
                                 **({"example_value": p.default} if p.default not in (None, "") else {}),
                                 **({"enum": list(p.enum)} if p.enum else {})} for name, p in params.items()}
            text = " ".join(api.description.split())[:256]
            description = f'This is the subfunction for tool "{api.tool}", you can use this tool.' + (
                f' The description of this function is: "{text}"' if text else "")
            out.append({"name": api.name, "description": description,
                        "parameters": {"type": "object", "properties": properties,
                                       "required": [n for n, p in params.items() if p.required],
                                       "optional": [n for n, p in params.items() if not p.required]},
                        "tool": api.tool, "api": api.api, "category": api.category, "method": api.method,
                        "path": api.path, "url": api.url})
        return out

    def render(self) -> str:
        """The Python stubs of all functions plus ``finish``/``give_up``, for the prompt."""
        if self._rendered is None:  # the search asks once per step; the APIs never change
            self._rendered = render_tools(self.apis, self.render_style)
        return self._rendered

    def functions(self) -> dict[str, Callable[..., ToolResponse]]:
        """Function name -> host callable returning a :class:`ToolResponse` (never raising)."""
        return {api.name: self._function(api) for api in self.apis}

    def _function(self, api: APISpec) -> Callable[..., ToolResponse]:
        def function(*args, **kwargs) -> ToolResponse:
            return self.call(api.name, args, kwargs)

        function.__name__ = function.__qualname__ = api.name
        function.__doc__ = f"{api.tool}: {api.api}"
        return function

    def _bind(self, api: APISpec, args: tuple, kwargs: dict) -> dict | str:
        """Arguments by the API's raw names, or a one-line reason why they do not fit."""
        params: dict[str, Parameter] = self._params[api.name]
        names = list(params)
        if len(args) > len(names):
            return f"{api.name}() takes {len(names)} argument(s) but {len(args)} positional were given"
        bound = dict(zip(names, args))
        raw_names = {p.name: n for n, p in params.items()}
        for key, value in kwargs.items():
            name = key if key in params else raw_names.get(key)
            if name is None:
                expected = ", ".join(names) if names else "no arguments"
                return f"unknown argument '{key}' for {api.name}(); expected: {expected}"
            if name in bound:
                return f"{api.name}() got two values for argument '{name}'"
            bound[name] = value
        for name, param in params.items():
            if param.required and bound.get(name) is None:
                return f"missing required argument '{name}' for {api.name}()"
        return {params[n].name: v for n, v in bound.items() if v is not None}

    def call(self, name: str, args: tuple = (), kwargs: dict | None = None) -> ToolResponse:
        """Call function ``name`` with the model's positional and keyword arguments."""
        api = self._by_name.get(name)
        if api is None:
            return ToolResponse("not_found", error=f"no function named '{name}'", source="environment")
        bound = self._bind(api, tuple(args), dict(kwargs or {}))
        if isinstance(bound, str):
            response = ToolResponse("invalid_arguments", error=bound, source="environment")
            bound = {}
        else:
            response = safe_call(self.backend, api, bound)
        full = redact(response.content or "")
        response.error = redact(response.error) if response.error else response.error
        response.content = full
        if len(full) > self.max_response_chars:
            response.content = full[: self.max_response_chars] + truncation_marker(self.max_response_chars, len(full))
            response.truncated = True
        record = CallRecord(function=api.name, tool=api.tool, api=api.api, arguments=redact_obj(dict(bound)),
                            status=response.status, error=response.error, latency_s=response.latency_s,
                            source=response.source, simulated=response.simulated, fallbacks=list(response.fallbacks),
                            truncated=response.truncated, content_chars=len(full),
                            full_content=full if self.keep_full_responses and response.truncated else None)
        with self._lock:
            self.calls.append(record)
        logger.debug("tool %s -> %s in %.3f s (%s%s)", api.name, response.status, response.latency_s,
                     response.source, ", fallbacks: " + "; ".join(response.fallbacks) if response.fallbacks else "")
        return response

    def summary(self) -> dict:
        """Counts for the run summary: calls, ok, errors by status, fallbacks, simulated, truncated,
        sources, total latency, and the missing APIs (never silently dropped)."""
        with self._lock:
            calls = list(self.calls)
        failed_backends = Counter(f.split(":", 1)[0] for c in calls for f in c.fallbacks)
        return {
            "functions": len(self.apis),
            "calls": len(calls),
            "ok": sum(c.status == "ok" for c in calls),
            "errors": dict(Counter(c.status for c in calls if c.status != "ok")),
            "fallbacks_used": sum(bool(c.fallbacks) for c in calls),
            "fallbacks_by_backend": dict(failed_backends),
            "simulated": sum(c.simulated for c in calls),
            "truncated": sum(c.truncated for c in calls),
            "sources": dict(Counter(c.source for c in calls)),
            "latency_s": round(sum(c.latency_s for c in calls), 6),
            "missing_apis": [list(pair) for pair in self.missing_apis],
            "missing_api_count": len(self.missing_apis),
        }
