"""The one loader of query and tool files: what a file is, and the queries or APIs it holds.

Every command that reads queries (``run --queries``, ``build-trees --queries``, ``serve-mock
stabletoolbench --queries``, ``train-policy``'s toolbench sets) or tools (``run --tools``) goes
through :func:`load_queries` / :func:`load_tools`, which look at the file before reading it
(:func:`file_kind`) and accept three layouts:

- **ToolBench / StableToolBench**: a JSON list of queries, each with ``query``, ``query_id`` and
  its ``api_list`` (or a folder of such files). Queries that list API names only are resolved
  against ToolBench's ``toolenv/tools`` folder, passed as ``--tools DIR``.
- **RestGPT** (RestBench's layout, any REST API): a JSON list of ``{"query", "solution"}``
  (``solution``, the gold calls such as ``"GET /search/person"``, is optional) plus an OpenAPI 3
  spec (JSON or YAML) passed as ``--tools spec.json``; every query is offered every operation of
  the spec. Ids come from ``query_id``/``qid``/``id`` when present, else ``q0``, ``q1``, ...
  (RestBench's convention); the benchmark is ``custom``, the group the file's stem.
- **Tools alone** (``--tools`` of ``run --query``): an OpenAPI 3 spec, a list of ToolBench
  ``api_list`` entries, one ToolBench query, or a ToolBench tool file.

Guarantees: a file of the wrong kind is named for what it is, with the flag it belongs to (a
RestGPT query file given as ToolBench queries, a query file given as ``--tools``, a Swagger 2.0
spec, an empty list), never read as something else. Not supported: RestGPT's spec-less
``api_list`` YAML, Postman collections, remote ``$ref``s (see :mod:`codetool.tools.openapi`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.tools.loaders import (
    BenchmarkQuery,
    api_from_toolbench,
    load_toolbench_tool_file,
    toolbench_queries_from,
    warn_missing,
)
from codetool.tools.openapi import openapi_from_document
from codetool.tools.spec import APISpec

# kind -> how an error names it
KINDS = {
    "toolbench-queries": "a ToolBench/StableToolBench query file (queries with their api_list)",
    "restgpt-queries": "a RestGPT-layout query file ({query, solution} entries without API documentation)",
    "open-domain-queries": "a query file without APIs ({query, query_id} entries: ToolBench's open-domain layout)",
    "openapi": "an OpenAPI 3 spec",
    "swagger": "a Swagger 2.0 spec",
    "api-list": "a list of ToolBench api_list entries (API descriptions)",
    "toolbench-tool": "a ToolBench tool file (toolenv/tools/<Category>/<tool>.json)",
    "empty": "an empty list",
    "unknown": "JSON of no layout codetool reads",
}
QUERY_KINDS = ("toolbench-queries", "restgpt-queries", "open-domain-queries")
_ID_FIELDS = ("query_id", "qid", "id")


def read_document(path: Path) -> Any:
    """The JSON (or, for ``.yaml``/``.yml``, YAML) document in ``path``.

    Raises:
        CodetoolError: the file is missing or does not parse.
    """
    path = Path(path)
    if not path.is_file():
        raise CodetoolError(f"{path}: no such file.")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        return json.loads(text)
    except RecursionError:
        raise CodetoolError(f"{path} is nested too deeply to be a spec or a query file.") from None
    except ValueError as e:
        raise CodetoolError(f"{path} does not parse as {'YAML' if path.suffix.lower() in ('.yaml', '.yml') else 'JSON'} "
                            f"({type(e).__name__}: {str(e)[:120]}).") from None
    except Exception as e:  # yaml.YAMLError
        raise CodetoolError(f"{path} does not parse as YAML ({type(e).__name__}).") from None


def file_kind(data: Any) -> str:
    """Which layout a parsed file has: one of :data:`KINDS`' keys."""
    if isinstance(data, dict):
        if "swagger" in data:
            return "swagger"
        if "openapi" in data or "paths" in data or "endpoints" in data:
            return "openapi"
        if "api_list" in data and "query" in data:
            return "toolbench-queries"
        if "api_list" in data:
            return "toolbench-tool" if ("tool_name" in data or "title" in data) else "api-list"
        return "unknown"
    if not isinstance(data, list):
        return "unknown"
    if not data:
        return "empty"
    entries = [e for e in data if isinstance(e, dict)]
    if not entries:
        return "unknown"
    if any("query" in e and "api_list" in e for e in entries):
        return "toolbench-queries"
    if any("query" in e for e in entries):  # no API documentation: RestGPT's layout, or ToolBench's open domain
        with_ids = all("query_id" in e for e in entries) and not any("solution" in e for e in entries)
        return "open-domain-queries" if with_ids else "restgpt-queries"
    if all("api_name" in e or "tool_name" in e for e in entries):
        return "api-list"
    return "unknown"


def _kind_error(path: Path, kind: str, data: Any, wanted: str, fix: str) -> CodetoolError:
    size = f" with {len(data)} entries" if isinstance(data, list) and data else ""
    return CodetoolError(f"{path} is {KINDS[kind]}{size}, not {wanted}; {fix}")


def load_tools(path: str | Path, *, flag: str = "--tools") -> list[APISpec]:
    """The APIs of a tool file: an OpenAPI 3 spec (JSON or YAML), a list of ToolBench ``api_list``
    entries, one ToolBench query (its ``api_list``) or a ToolBench tool file.

    Args:
        path (`str` or `Path`): the file.
        flag (`str`, *optional*, defaults to `"--tools"`): how errors name the setting.

    Raises:
        CodetoolError: the file is missing, does not parse, or is a query file (named as such:
            a RestGPT or ToolBench query file belongs to ``--queries``), or an entry is malformed.
    """
    path = Path(path)
    if path.is_dir():
        raise CodetoolError(f"{flag} {path} is a folder; pass a file (an OpenAPI spec or an api_list), or a "
                            "ToolBench toolenv/tools folder only beside ToolBench --queries.")
    data = read_document(path)
    kind = file_kind(data)
    if kind in ("openapi", "swagger"):
        return openapi_from_document(data, path)
    if kind == "toolbench-tool":
        return load_toolbench_tool_file(path)
    if kind == "toolbench-queries" and (isinstance(data, dict) or len(data) == 1):
        data = data if isinstance(data, dict) else data[0]
        kind, data = "api-list", data.get("api_list") or []
    elif isinstance(data, dict) and kind == "api-list":
        data = data.get("api_list") or []
    if kind in ("restgpt-queries", "open-domain-queries"):
        raise _kind_error(path, kind, data, "a tool description", f"pass it as --queries {path} and its OpenAPI "
                          f"spec as {flag} spec.json.")
    if kind == "toolbench-queries":
        raise _kind_error(path, kind, data, "a tool description", f"pass it as --queries {path} (each query "
                          f"brings its own APIs), or give {flag} one query's api_list or an OpenAPI spec.")
    if kind != "api-list" or not isinstance(data, list) or not data:
        raise _kind_error(path, kind if kind != "api-list" else "empty", data, "a tool description",
                          f"{flag} takes an OpenAPI 3 spec (JSON or YAML), a list of api_list entries "
                          "(category_name, tool_name, api_name, ...) or one ToolBench query.")
    apis = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise CodetoolError(f"{flag} {path}: api_list entry {i} is a {type(entry).__name__}, not an object.")
        try:
            apis.append(api_from_toolbench(entry))
        except Exception as e:
            raise CodetoolError(f"{flag} {path}: api_list entry {i} is malformed ({type(e).__name__}: {e}).") from None
    return apis


def _restgpt_queries(data: list, file: Path, apis: list[APISpec], spec: Path) -> list[BenchmarkQuery]:
    queries = []
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not isinstance(row.get("query"), str) or not row["query"].strip():
            queries.append(BenchmarkQuery(query_id=f"q{i}", query=str(row.get("query", "")) if isinstance(row, dict)
                                          else "", apis=[], benchmark="custom", group=file.stem,
                                          extra={"load_error": f"entry {i} has no 'query' text"}))
            continue
        qid = next((str(row[f]) for f in _ID_FIELDS if row.get(f) not in (None, "")), f"q{i}")
        solution = row.get("solution")
        gold = [str(s) for s in solution] if isinstance(solution, list) else None
        queries.append(BenchmarkQuery(query_id=qid, query=row["query"], apis=[_copy(a) for a in apis],
                                      benchmark="custom", group=file.stem, gold_path=gold,
                                      relevant_apis=[(apis[0].tool if apis else "", s) for s in gold or []],
                                      extra={"tools": str(spec)}))
    return queries


def _copy(api: APISpec) -> APISpec:
    import dataclasses

    return dataclasses.replace(api)


def load_queries(path: str | Path, tools: str | Path | None = None, *, benchmark: str = "toolbench",
                 flag: str = "--queries", tools_flag: str = "--tools") -> list[BenchmarkQuery]:
    """The queries of a file or folder in any layout codetool reads (see the module docstring).

    Args:
        path (`str` or `Path`): a query file, or a folder of ``*.json`` query files (sorted).
        tools (`str` or `Path`, *optional*): RestGPT layout: the OpenAPI spec (or api_list) every
            query is offered; ToolBench layout: the ``toolenv/tools`` folder for name-only queries.
        benchmark (`str`, *optional*, defaults to `"toolbench"`): the benchmark ToolBench-layout
            queries are recorded under (RestGPT-layout ones are ``custom``).
        flag, tools_flag (`str`, *optional*): how errors name the two settings.

    Returns:
        The queries in file order; ToolBench APIs without documentation are listed in
        ``extra["missing_apis"]``; a malformed entry has ``extra["load_error"]``.

    Raises:
        CodetoolError: no such file; a file of another kind (named, with the flag it belongs to);
            RestGPT queries without ``tools``; ToolBench queries with a ``tools`` file.
    """
    path = Path(path)
    if not path.exists():
        raise CodetoolError(f"{flag} {path}: no such file or folder.")
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise CodetoolError(f"{flag} {path}: the folder holds no *.json query file.")
    tools = Path(tools) if tools else None
    queries: list[BenchmarkQuery] = []
    tool_cache: dict = {}
    apis: list[APISpec] | None = None
    for file in files:
        data = read_document(file)
        kind = file_kind(data)
        if kind == "toolbench-queries":
            if tools is not None and not tools.is_dir():
                raise CodetoolError(f"{file} is {KINDS[kind]}: each query brings its own APIs, so {tools_flag} "
                                    f"{tools} is not used; drop it (or pass ToolBench's toolenv/tools folder for "
                                    "queries that list API names only).")
            rows = data if isinstance(data, list) else [data]
            queries += toolbench_queries_from(rows, file, tools_dir=tools, benchmark=benchmark,
                                              tool_cache=tool_cache)
        elif kind == "open-domain-queries" and (tools is None or tools.is_dir()):
            # ToolBench's retrieval demo: the queries keep no API (a job skips them, saying so)
            queries += toolbench_queries_from(data, file, benchmark=benchmark, tool_cache=tool_cache)
        elif kind in ("restgpt-queries", "open-domain-queries"):
            if tools is None:
                raise CodetoolError(f"{file}: this is a RestGPT queries file ({len(data)} {{query, solution}} "
                                    f"entries, no API documentation); pass the OpenAPI spec of its API too: "
                                    f"{flag} {path} {tools_flag} spec.json.")
            apis = load_tools(tools, flag=tools_flag) if apis is None else apis
            queries += _restgpt_queries(data, file, apis, tools)
        elif kind in ("openapi", "swagger", "api-list", "toolbench-tool"):
            raise _kind_error(file, kind, data, "a query file", f"pass it as {tools_flag} {file} and the queries "
                              f"as {flag} (a ToolBench query file, or a RestGPT-layout list of {{query, solution}}).")
        else:
            raise _kind_error(file, kind, data, "a query file", f"{flag} takes a ToolBench/StableToolBench query "
                              "file (a list of {query, query_id, api_list}) or a RestGPT-layout list of "
                              f"{{query, solution}} with {tools_flag} spec.json.")
    warn_missing(queries, path)
    return queries

