"""Loaders: benchmark query files and API descriptions -> :class:`BenchmarkQuery` and :class:`APISpec`.

Supported inputs:

- StableToolBench / ToolBench query files (a JSON list of queries, each with ``query``,
  ``query_id``, ``api_list`` and usually ``relevant APIs``); :func:`load_stabletoolbench` for the six
  test groups (full set or CodeTool's filtered subset), :func:`load_toolbench_queries` for any file.
- ToolBench tool files ``toolenv/tools/<Category>/<tool>.json`` (:func:`load_toolbench_tool_file`),
  used when a query lists only names (ToolBench's inference demo format).
- OpenAPI 3 specs (:func:`load_openapi`): one API per operation, path/query/header parameters
  typed, ``$ref`` resolved, the example response kept; also CodeTool's flattened TMDB spec
  (``endpoints`` list).
- RestBench-TMDB (:func:`load_restbench`) from RestGPT or from CodeTool's 20-candidate file.
- The synthetic world (``benchmark: world``, group ``train`` or ``heldout``): generated, no file
  (:func:`codetool.world.load_queries`).

Guarantees: nothing is dropped silently. A query whose tool documentation is missing is kept with
the APIs that were found, and the missing ``(tool, api)`` pairs are listed in
``query.extra["missing_apis"]`` (see :func:`missing_report`). RestBench gold paths are kept exactly
as in the files (some have stray spaces; evaluation normalises them).

:class:`QueriesGroup` is the setting of which benchmark queries a job runs (``run``, the pipeline's
evaluation sets), declared here once beside the loaders that read it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.config_groups import Group
from codetool.tools.data import data_root, fetch_hint
from codetool.tools.names import api_key_name, standardize
from codetool.tools.simulator import parse_template
from codetool.tools.spec import APISpec, Parameter

logger = logging.getLogger(__name__)


BENCHMARKS = ("stabletoolbench", "restbench-tmdb", "toolbench", "world")
WORLD_SPLITS = ("train", "heldout")  # the groups of the synthetic world (codetool.world), by template
# The subsets of each benchmark that reads its own files.
SUBSETS = {"stabletoolbench": ("codetool", "full"), "restbench-tmdb": ("restgpt", "codetool")}


@dataclass
class QueriesGroup(Group):
    """Which queries of a benchmark a job runs: the benchmark, its group and subset, then ``offset``
    and ``limit`` over the loaded list.

    Raises:
        ConfigError: a negative ``offset``, a ``limit`` below 1, or a subset the benchmark lacks.
    """

    benchmark: str | None = option(None, "benchmark to run", choices=list(BENCHMARKS))
    group: str = option("G1_instruction", "StableToolBench group; world: train or heldout (its template split)")
    subset: str = option("codetool", "stabletoolbench: codetool (CodeTool's filtered queries) or full; "
                         "restbench-tmdb: restgpt (all 54 APIs) or codetool (20 candidates)")
    offset: int = option(0, "skip this many queries of the benchmark")
    limit: int | None = option(None, "run at most this many queries")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.offset < 0 or (self.limit is not None and self.limit < 1):
            raise ConfigError(f"--offset must be >= 0 and --limit >= 1, got offset {self.offset}, limit {self.limit}.")
        if self.benchmark in SUBSETS and self.subset not in SUBSETS[self.benchmark]:
            raise ConfigError(f"--subset {self.subset!r} is not one of {SUBSETS[self.benchmark]} for {self.benchmark}.")
        if self.benchmark == "world" and self.group not in WORLD_SPLITS:
            raise ConfigError(f"--benchmark world needs --group train or heldout (its template split), got "
                              f"{self.group!r}.")

STABLETOOLBENCH_GROUPS = ("G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category",
                          "G3_instruction")
RESTBENCH_SHUFFLE_SEED = 0
_TYPES = {"string": "string", "str": "string", "number": "number", "float": "number", "integer": "integer",
          "int": "integer", "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
          "object": "object", "dict": "object"}


@dataclass
class BenchmarkQuery:
    """One benchmark query with the APIs the policy may call.

    Args:
        query_id (`str`): the benchmark's id, as text.
        query (`str`): the user request.
        apis (`list[APISpec]`): the APIs offered to the policy (RestBench "codetool": shuffled).
        benchmark (`str`): ``stabletoolbench``, ``toolbench`` or ``restbench``.
        group (`str` or `None`): e.g. ``G1_instruction``; ``tmdb`` for RestBench.
        relevant_apis (`list[tuple[str, str]]`): gold ``(tool, api)`` pairs (StableToolBench's
            ``relevant APIs``; RestBench: ``("tmdb", gold path entry)`` raw, like ``gold_path``).
        gold_path (`list[str]` or `None`): RestBench's gold API sequence, e.g.
            ``["GET /search/person", "GET /person/{person_id}/movie_credits"]``, exactly as in the file.
        extra (`dict`): anything else; ``missing_apis`` lists ``(tool, api)`` pairs without documentation.
    """

    query_id: str
    query: str
    apis: list[APISpec]
    benchmark: str
    group: str | None = None
    relevant_apis: list[tuple[str, str]] = field(default_factory=list)
    gold_path: list[str] | None = None
    extra: dict = field(default_factory=dict)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CodetoolError(f"benchmark file not found: {path}. Run '{fetch_hint(path)}' (see "
                            f"'codetool data --help') or set CODETOOL_DATA to the folder that holds it.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CodetoolError(f"{path} is JSON nested too deeply to be a benchmark file.") from None
    except ValueError as e:
        raise CodetoolError(f"{path} is not valid JSON ({e}); fetch it again with '{fetch_hint(path)}'.") from None


def _param_type(raw: Any) -> str:
    text = str(raw or "string").strip().lower()
    return _TYPES.get(text, "string")  # ENUM, DATE (YYYY-MM-DD), TIME, BINARY: text on the wire


def _toolbench_parameter(raw: dict, required: bool) -> Parameter:
    return Parameter(name=str(raw.get("name", "")), type=_param_type(raw.get("type")),
                     description=str(raw.get("description") or ""), default=raw.get("default"),
                     required=required)


def api_from_toolbench(entry: dict, *, tool_description: str = "") -> APISpec:
    """One ``api_list`` entry of a StableToolBench/ToolBench query (or of a tool file) as an APISpec."""
    params = [_toolbench_parameter(p, True) for p in entry.get("required_parameters") or []]
    params += [_toolbench_parameter(p, False) for p in entry.get("optional_parameters") or []]
    template = entry.get("template_response", entry.get("schema"))
    return APISpec(category=str(entry.get("category_name", "")), tool=str(entry.get("tool_name", "")),
                   api=str(entry.get("api_name", entry.get("name", ""))),
                   description=str(entry.get("api_description", entry.get("description")) or "").strip(),
                   parameters=params, method=str(entry.get("method") or "GET").upper(),
                   url=str(entry.get("url") or ""), template_response=parse_template(template),
                   tool_description=tool_description)


def load_toolbench_tool_file(path: Path, category: str | None = None) -> list[APISpec]:
    """The APIs of one ToolBench tool file (``toolenv/tools/<Category>/<tool>.json``).

    Args:
        category (`str`, *optional*): defaults to the name of the file's folder.
    """
    data = _read_json(Path(path))
    category = category or Path(path).parent.name
    tool = str(data.get("tool_name") or data.get("title") or Path(path).stem)
    apis = []
    for entry in data.get("api_list") or []:
        api = api_from_toolbench(dict(entry, category_name=category, tool_name=tool),
                                 tool_description=str(data.get("tool_description") or ""))
        apis.append(api)
    return apis


def _resolve_from_tools(entry: dict, tools_dir: Path | None, cache: dict) -> APISpec | None:
    """Find a name-only ``api_list`` entry in ToolBench's ``toolenv/tools`` folder."""
    if tools_dir is None:
        return None
    path = tools_dir / str(entry.get("category_name", "")) / f"{standardize(str(entry.get('tool_name', '')))}.json"
    if path not in cache:
        cache[path] = load_toolbench_tool_file(path) if path.is_file() else []
    wanted = api_key_name(APISpec(category="", tool="", api=str(entry.get("api_name", ""))))
    for api in cache[path]:
        if api_key_name(api) == wanted:
            return dataclasses.replace(api, tool=str(entry.get("tool_name", api.tool)))
    return None


def _query_from_toolbench(raw: dict, *, benchmark: str, group: str | None, tools_dir: Path | None,
                          tool_cache: dict) -> BenchmarkQuery:
    text = raw.get("query")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"its 'query' is {text!r}, not a question to answer (a non-empty string)")
    apis, missing = [], []
    entries = raw.get("api_list") or []
    for entry in entries if isinstance(entries, list) else [entries]:
        if "required_parameters" in entry or "api_description" in entry:
            apis.append(api_from_toolbench(entry))
            continue
        api = _resolve_from_tools(entry, tools_dir, tool_cache)
        if api is None:
            missing.append((str(entry.get("tool_name", "")), str(entry.get("api_name", ""))))
        else:
            apis.append(api)
    relevant = [tuple(pair) for pair in raw.get("relevant APIs") or [] if len(pair) == 2]
    extra = {"missing_apis": missing} if missing else {}
    return BenchmarkQuery(query_id=str(raw.get("query_id", "")), query=str(raw.get("query", "")), apis=apis,
                          benchmark=benchmark, group=group, relevant_apis=relevant, extra=extra)


def load_toolbench_queries(path: Path, tools_dir: Path | None = None, *, benchmark: str = "toolbench",
                           group: str | None = None) -> list[BenchmarkQuery]:
    """Load a ToolBench/StableToolBench query file, or every ``*.json`` file of a folder (sorted).

    Args:
        path (`Path`): a JSON file holding a list of queries, or a folder of such files.
        tools_dir (`Path`, *optional*): ToolBench's ``toolenv/tools`` folder, needed only for queries
            whose ``api_list`` has names but no parameters.
        group (`str`, *optional*): defaults to the file name without ``.json``.

    Returns:
        The queries in file order; APIs without documentation are listed in ``extra["missing_apis"]``.
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    queries: list[BenchmarkQuery] = []
    tool_cache: dict = {}
    for file in files:
        data = _read_json(file)
        if not isinstance(data, list):
            raise CodetoolError(f"{file}: expected a JSON list of queries, got {type(data).__name__}.")
        queries += toolbench_queries_from(data, file, tools_dir=tools_dir, benchmark=benchmark, group=group,
                                          tool_cache=tool_cache)
    warn_missing(queries, path)
    return queries


def toolbench_queries_from(data: list, file: Path, *, tools_dir: Path | None = None, benchmark: str = "toolbench",
                           group: str | None = None, tool_cache: dict | None = None) -> list[BenchmarkQuery]:
    """The queries of one ToolBench query file already read (``data``, a list); a malformed entry
    becomes a query with ``extra["load_error"]`` (recorded as an error later), not a failed load."""
    queries: list[BenchmarkQuery] = []
    tool_cache = {} if tool_cache is None else tool_cache
    for raw in data:
        try:
            queries.append(_query_from_toolbench(raw, benchmark=benchmark, group=group or file.stem,
                                                 tools_dir=tools_dir, tool_cache=tool_cache))
        except Exception as e:  # one malformed entry fails its own query, not the load (issue 19)
            qid = raw.get("query_id", len(queries)) if isinstance(raw, dict) else len(queries)
            text = raw.get("query", "") if isinstance(raw, dict) else ""
            logger.warning("%s: query %s is malformed (%s: %s); it will be recorded as an error",
                           file, qid, type(e).__name__, e)
            queries.append(BenchmarkQuery(query_id=str(qid), query=str(text), apis=[], benchmark=benchmark,
                                          group=group or file.stem,
                                          extra={"load_error": f"malformed query entry: {type(e).__name__}: {e}"}))
    return queries


def warn_missing(queries: list[BenchmarkQuery], path: Path) -> None:
    """Log how many of ``queries`` (read from ``path``) reference APIs without documentation."""
    report = missing_report(queries)
    if report["queries_with_missing_apis"]:
        logger.warning("%s: %d of %d queries reference %d APIs without documentation (kept; see "
                       "extra['missing_apis'])", path, report["queries_with_missing_apis"], len(queries),
                       report["missing_apis"])


def missing_report(queries: list[BenchmarkQuery]) -> dict:
    """Counts of queries whose tool documentation is missing (StableToolBench skips them silently)."""
    pairs = [tuple(p) for q in queries for p in q.extra.get("missing_apis", [])]
    return {"queries": len(queries),
            "queries_with_missing_apis": sum(1 for q in queries if q.extra.get("missing_apis")),
            "queries_without_any_api": sum(1 for q in queries if not q.apis),
            "missing_apis": len(pairs), "missing_tools": sorted({tool for tool, _ in pairs})}


def load_stabletoolbench(group: str, root: Path | None = None, subset: str = "full") -> list[BenchmarkQuery]:
    """Load one StableToolBench test group.

    Args:
        group (`str`): one of ``STABLETOOLBENCH_GROUPS``.
        root (`Path`, *optional*): the data folder; defaults to :func:`data_root`.
        subset (`str`, *optional*, defaults to `"full"`): ``full`` (StableToolBench's
            ``solvable_queries/test_instruction``, 765 queries in all) or ``codetool`` (the CodeTool
            paper's ``filter_test_instruction`` subset, 580 queries).
    """
    if group not in STABLETOOLBENCH_GROUPS:
        raise CodetoolError(f"unknown StableToolBench group {group!r}; choose one of {list(STABLETOOLBENCH_GROUPS)}.")
    root = Path(root) if root is not None else data_root()
    if subset == "full":
        path = root / "StableToolBench" / "solvable_queries" / "test_instruction" / f"{group}.json"
    elif subset == "codetool":
        path = root / "CodeTool" / "StableToolBench" / "solvable_queries" / "filter_test_instruction" / f"{group}.json"
    else:
        raise CodetoolError(f"unknown subset {subset!r}; choose 'full' or 'codetool'.")
    return load_toolbench_queries(path, benchmark="stabletoolbench", group=group)


def load_restbench(root: Path | None = None, source: str = "restgpt") -> list[BenchmarkQuery]:
    """Load the 100 RestBench-TMDB queries with their APIs.

    Args:
        root (`Path`, *optional*): the data folder; defaults to :func:`data_root`.
        source (`str`, *optional*, defaults to `"restgpt"`):
            - ``restgpt``: ``RestGPT/datasets/tmdb.json``; every query gets all 54 operations of
              ``RestGPT/specs/tmdb_oas.json``; ``gold_path`` is the file's ``solution`` verbatim.
            - ``codetool``: ``CodeTool/infer/tmdb/tmdb.data.candidate=20.v2.json`` with its spec; each
              query gets its 20 candidate APIs, which the file lists gold-first, so they are shuffled
              with a fixed seed per query (``RESTBENCH_SHUFFLE_SEED``); ``gold_path`` is the solution
              as ``"GET /path"`` entries (the raw names are in ``extra["solution"]``).

    Returns:
        Queries with ``benchmark="restbench"``, ``group="tmdb"``, ids ``q0`` ... ``q99``.
    """
    from codetool.tools.openapi import load_openapi, operation_key

    root = Path(root) if root is not None else data_root()
    if source == "restgpt":
        apis = load_openapi(root / "RestGPT" / "specs" / "tmdb_oas.json", tool="tmdb")
        rows = _read_json(root / "RestGPT" / "datasets" / "tmdb.json")
        return [BenchmarkQuery(query_id=f"q{i}", query=row["query"], apis=[dataclasses.replace(a) for a in apis],
                               benchmark="restbench", group="tmdb", gold_path=list(row["solution"]),
                               relevant_apis=[("tmdb", step) for step in row["solution"]])
                for i, row in enumerate(rows)]
    if source != "codetool":
        raise CodetoolError(f"unknown RestBench source {source!r}; choose 'restgpt' or 'codetool'.")
    folder = root / "CodeTool" / "infer" / "tmdb"
    by_key = {operation_key(a.method, a.path): a for a in load_openapi(folder / "tmdb.spec.raw.v2.json", tool="tmdb")}
    queries = []
    for i, row in enumerate(_read_json(folder / "tmdb.data.candidate=20.v2.json")):
        qid = str(row.get("qid", f"q{i}"))
        candidates = [by_key.get(re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")) for name in row["api_list"]]
        missing = [("tmdb", name) for name, api in zip(row["api_list"], candidates) if api is None]
        apis = [dataclasses.replace(a) for a in candidates if a is not None]
        random.Random(f"{RESTBENCH_SHUFFLE_SEED}:{qid}").shuffle(apis)
        gold = [by_key[k].api if k in by_key else name for name in row["solution"]
                for k in [re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")]]
        extra = {"solution": list(row["solution"])} | ({"missing_apis": missing} if missing else {})
        queries.append(BenchmarkQuery(query_id=qid, query=row["query"], apis=apis, benchmark="restbench",
                                      group="tmdb", gold_path=gold, relevant_apis=[("tmdb", g) for g in gold],
                                      extra=extra))
    return queries
