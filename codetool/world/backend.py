"""The world behind the normal tool seam: its tools as :class:`APISpec`, its queries as
:class:`BenchmarkQuery`, and :class:`WorldBackend`, ``call(api, arguments) -> ToolResponse``.

The executor's proxies reach the world exactly as they reach a benchmark's tools: the sandboxed
code calls ``find_city(name="Velmora")``, the proxy sends the call to the host, the host's
:class:`~codetool.tools.environment.ToolEnvironment` binds the arguments and asks this backend.
``tools_backend: world`` selects it (``codetool.assemble.tool_backend``: the world stands on
``codetool.tools``, so the tools' own table cannot name it); ``benchmark: world`` selects it by default.

Guarantees: :meth:`WorldBackend.call` never raises; a tool's refusal comes back with its status
(``invalid_arguments``, ``not_found``) or as an error payload (``api_error`` with
``{"error": ...}`` as content), which the policy's code sees as a ``ToolError``; an API that is
not one of the world's is ``not_found``. Responses are deterministic (no clock, no network);
``latency_s`` is the time the Python function took.
"""

from __future__ import annotations

import json
import time

from codetool.tools.loaders import BenchmarkQuery
from codetool.tools.spec import APISpec, ToolResponse
from codetool.world.queries import WorldQuery, generate
from codetool.world.tools import BY_NAME, TOOLS, WorldError, WorldTool

CATEGORY = "world"
_LISTS = {"orders", "hotels", "cities", "flights", "items"}
_INTS = {"population", "elevation_m", "timezone_offset_h", "page", "total_pages", "total", "stars", "nights", "days",
         "employees", "founded", "aqi", "wind_kmh", "duration_min"}
_FLOATS = {"temp_c", "distance_km", "close_usd", "rate", "total_usd", "total_eur", "price_per_night_eur", "price_usd",
           "value", "amount", "weight_kg"}


def api_spec(tool: WorldTool) -> APISpec:
    """The API the policy sees for ``tool`` (its function name is the tool's own name)."""
    sketch = {k: "list" if k in _LISTS else "int" if k in _INTS else "float" if k in _FLOATS else "str"
              for k in tool.returns}
    return APISpec(category=CATEGORY, tool=tool.service, api=tool.name, description=tool.description,
                   parameters=[p for p in tool.parameters], template_response=sketch, name=tool.name,
                   tool_description=f"the synthetic world's {tool.service} service")


def world_apis(names: list[str] | None = None) -> list[APISpec]:
    """Fresh :class:`APISpec` objects of the named tools (all 25 when ``names`` is ``None``), in order."""
    return [api_spec(BY_NAME[n]) for n in names] if names is not None else [api_spec(t) for t in TOOLS]


def to_benchmark_query(q: WorldQuery) -> BenchmarkQuery:
    """A :class:`BenchmarkQuery` (``benchmark="world"``, ``group`` = the split) whose ``extra``
    holds the answer key (``answer``; never shown to the policy) and the template's name."""
    relevant = list(dict.fromkeys((BY_NAME[name].service, name) for name, _ in q.calls))
    return BenchmarkQuery(query_id=q.query_id, query=q.query, apis=world_apis(q.tools), benchmark="world",
                          group=q.split, relevant_apis=relevant,
                          extra={"answer": dict(q.key), "template": q.template})


def load_queries(split: str, limit: int | None = None, *, offset: int = 0, seed: int = 0) -> list[BenchmarkQuery]:
    """Queries ``offset`` to ``offset + limit`` of ``split`` (``train`` or ``heldout``) under ``seed``
    (:func:`codetool.world.queries.generate`), as :class:`BenchmarkQuery` (default ``limit``: 40).

    Raises:
        ValueError: an unknown split, a negative offset or a limit below 1.
    """
    limit = 40 if limit is None else limit
    if offset < 0 or limit < 1:
        raise ValueError(f"world queries: offset must be >= 0 and limit >= 1, got {offset} and {limit}.")
    return [to_benchmark_query(q) for q in generate(split, offset + limit, seed)[offset:]]


class WorldBackend:
    """Answers the world's APIs by calling its Python tools (see the module docstring)."""

    name = "world"

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        start = time.perf_counter()
        tool = BY_NAME.get(api.api) if api.category == CATEGORY else None
        if tool is None:
            return ToolResponse("not_found", error=f"{api.tool}/{api.api} is not a tool of the world",
                                source=self.name)
        known = {p.name for p in tool.parameters}
        unknown = sorted(set(arguments) - known)
        missing = [p.name for p in tool.parameters if p.required and p.name not in arguments]
        if unknown or missing:
            reason = f"unknown argument {unknown[0]!r}" if unknown else f"missing required argument {missing[0]!r}"
            return ToolResponse("invalid_arguments", error=f"{tool.name}(): {reason}", source=self.name,
                                latency_s=time.perf_counter() - start)
        try:
            content = tool.function(**arguments)
        except WorldError as e:
            body = json.dumps({"error": e.message}) if e.status == "api_error" else ""
            return ToolResponse(e.status, content=body, error=e.message, source=self.name,
                                latency_s=time.perf_counter() - start)
        return ToolResponse("ok", content=json.dumps(content), source=self.name, latency_s=time.perf_counter() - start)
