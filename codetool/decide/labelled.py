"""The labelled set of the decide-first benchmark (``codetool eval-decision``, ``codetool train-probe``).

Tool-needing queries come from the StableToolBench test groups (the gold functions are the
query's ``relevant APIs``), optionally RestBench-TMDB (``n_restbench``; gold: the first API of the
gold path) and ToolBench's example queries (``n_toolbench``); tool-free queries from
``codetool/resources/tool_free_queries.jsonl``
(general knowledge, arithmetic, unit conversion, writing, definitions, reasoning, code, language,
advice, maths). A tool-free query is offered the tool list of one of the sampled tool-needing
queries, so both kinds see the same tool lists. Queries whose gold APIs are not among their
offered APIs are skipped and counted, never dropped silently.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.config_groups import Group
from codetool.jsonl import read_text

logger = logging.getLogger(__name__)


@dataclass
class DecisionItem:
    """One labelled query.

    Args:
        item_id (`str`): ``stb-<group>-<query_id>`` or the tool-free id.
        query (`str`): the request.
        needs_tool (`bool`): whether answering needs a tool.
        gold (`list[str]`): function names that are a right first call (empty when tool-free).
        apis (`list[APISpec]`): the APIs offered, with function names assigned.
        group (`str`): the StableToolBench group, or ``tool_free``.
        category (`str`): the tool-free category, or the group.
        answer (`str` or `None`): the reference answer of a tool-free query, when there is one.
        tools_from (`str` or `None`): the StableToolBench query whose tools a tool-free query is offered.
        benchmark (`str`): ``stabletoolbench``, ``restbench-tmdb``, ``toolbench``, ``tool_free`` or ``when2tool``.
    """

    item_id: str
    query: str
    needs_tool: bool
    gold: list[str]
    apis: list
    group: str
    category: str
    answer: str | None = None
    tools_from: str | None = None
    benchmark: str = "stabletoolbench"


def load_tool_free(path: str | Path | None = None) -> list[dict]:
    """The tool-free queries (``id``, ``query``, ``category``, optional ``answer``), packaged by default.

    Raises:
        CodetoolError: a missing file or a row without ``id``/``query``/``category``.
    """
    if path:
        if not Path(path).exists():
            raise CodetoolError(f"free_queries: {path} not found; leave it empty to use the packaged set.")
        text = read_text(path, "JSON lines of tool-free queries (id, query, category)")
    else:
        text = resources.files("codetool").joinpath("resources/tool_free_queries.jsonl").read_text(encoding="utf-8")
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CodetoolError(f"{path or 'tool_free_queries.jsonl'} line {i}: not valid JSON ({e}).") from None
        except RecursionError:
            raise CodetoolError(f"{path or 'tool_free_queries.jsonl'} line {i}: JSON nested too deeply; each line is "
                                "one query object (id, query, category).") from None
        if not isinstance(row, dict) or not all(row.get(k) for k in ("id", "query", "category")):
            raise CodetoolError(f"{path or 'tool_free_queries.jsonl'} line {i}: needs id, query and category, "
                                f"got {row!r:.120}.")
        rows.append(row)
    if not rows:
        raise CodetoolError(f"free_queries: {path} holds no query; give JSON lines of tool-free queries (id, query, "
                            "category), or leave it empty to use the packaged set.")
    return rows


def _usable(pool, skipped: Counter) -> list:
    from codetool.tools import assign_function_names

    usable = []
    for q in pool:
        if not q.apis:
            skipped["no_apis"] += 1
            continue
        if not all(a.name for a in q.apis) or len({a.name for a in q.apis}) != len(q.apis):
            assign_function_names(q.apis)
        usable.append(q)
    return usable


def _draw(usable, n: int, prefix: str, benchmark: str, skipped: Counter, *, first_gold: bool = False
          ) -> list[DecisionItem]:
    """The first ``n`` usable queries whose gold APIs are offered (``first_gold``: only the first
    gold API counts, RestBench's first call of its gold path)."""
    items: list[DecisionItem] = []
    for q in usable:
        if len(items) >= n:
            break
        by_key = {a.key: a.name for a in q.apis}
        relevant = q.relevant_apis[:1] if first_gold else q.relevant_apis
        gold = sorted({by_key[tuple(p)] for p in relevant if tuple(p) in by_key})
        if not gold:
            skipped["gold_not_offered"] += 1
            continue
        group = q.group or benchmark
        items.append(DecisionItem(f"{prefix}-{group}-{q.query_id}", q.query, True, gold, q.apis, group, group,
                                  benchmark=benchmark))
    return items


@dataclass
class DrawGroup(Group):
    """The query draw of the decide-first commands (``train-probe``, ``eval-decision``): which
    benchmark and tool-free queries :func:`build_items` draws, and its seed. ``train-probe``
    composes it with other defaults (:func:`codetool.config_groups.with_defaults`)."""

    data: str = option("", "benchmark data folder (default: ./data, $CODETOOL_DATA or ../shared/data)")
    groups: list[str] = option(default_factory=lambda: ["G1_instruction"], help="StableToolBench groups to draw from")
    n_tool: int = option(20, "StableToolBench queries (they need a tool)")
    n_restbench: int = option(0, "RestBench-TMDB queries (CodeTool's 20 candidate APIs each)")
    n_toolbench: int = option(0, "ToolBench example queries (data_example, 12 in all)")
    n_free: int = option(20, "tool-free queries (packaged set)")
    free_queries: str = option("", "JSONL of tool-free queries (default: the packaged set)")
    seed: int = option(0, "seed of the query draw")

    def __post_init__(self):
        super().__post_init__()
        if min(self.n_tool, self.n_restbench, self.n_toolbench, self.n_free) < 0:
            raise ConfigError(f"n_tool, n_restbench, n_toolbench and n_free must be >= 0, got {self.n_tool}, "
                              f"{self.n_restbench}, {self.n_toolbench} and {self.n_free}.")


def build_items(groups: list[str], n_tool: int, n_free: int, *, seed: int = 0, data: str = "", free_queries: str = "",
                n_restbench: int = 0, n_toolbench: int = 0) -> tuple[list[DecisionItem], dict[str, int]]:
    """Draw the labelled set: ``n_tool`` StableToolBench queries of ``groups``, ``n_restbench``
    RestBench-TMDB and ``n_toolbench`` ToolBench example queries, ``n_free`` tool-free ones.

    Args:
        seed (`int`, *optional*, defaults to 0): seed of the draw (one stream for every part).
        data (`str`, *optional*): the benchmark data folder (default: :func:`codetool.tools.data_root`).
        free_queries (`str`, *optional*): JSONL of tool-free queries (default: the packaged set).

    Returns:
        The items (tool-needing first: StableToolBench, RestBench, ToolBench; then tool-free; each
        part in draw order) and the counts of skipped queries by reason (``no_apis``,
        ``gold_not_offered``). Ids: ``stb-<group>-<id>``, ``restbench-tmdb-<id>``,
        ``toolbench-<file>-<id>``, the tool-free id.
    """
    from codetool.tools import (
        data_root,
        load_restbench,
        load_stabletoolbench,
        load_toolbench_queries,
    )

    root = Path(data) if data else None
    pool = [q for group in groups for q in load_stabletoolbench(group, root)]
    rng = random.Random(seed)
    rng.shuffle(pool)
    skipped: Counter = Counter()
    usable = _usable(pool, skipped)
    items = _draw(usable, n_tool, "stb", "stabletoolbench", skipped)
    if len(items) < n_tool:
        logger.warning("only %d usable tool-needing queries in %s (asked for %d)", len(items), groups, n_tool)
    stb_items = list(items)
    if n_restbench:
        rest = load_restbench(root, source="codetool")  # its 20 candidate APIs per query (54 make 6k-token prompts)
        rng.shuffle(rest)
        items += _draw(_usable(rest, skipped), n_restbench, "restbench", "restbench-tmdb", skipped, first_gold=True)
    if n_toolbench:
        folder = (root if root is not None else data_root()) / "ToolBench" / "data_example" / "instruction"
        examples = load_toolbench_queries(folder)
        rng.shuffle(examples)
        items += _draw(_usable(examples, skipped), n_toolbench, "toolbench", "toolbench", skipped)
    free = load_tool_free(free_queries or None)
    rng.shuffle(free)
    if len(free) < n_free:
        logger.warning("only %d tool-free queries available (asked for %d)", len(free), n_free)
    if free[:n_free] and not usable:
        raise CodetoolError(f"no StableToolBench query with APIs in {groups}: tool-free queries need a tool list.")
    # each tool-free query is offered the tool list of a sampled tool-needing query (a matched pair
    # that shares the content-free calibration pass), or of any usable query when none is sampled
    donors = [q for q in usable if f"stb-{q.group}-{q.query_id}" in {i.item_id for i in stb_items}] or usable
    for k, row in enumerate(free[:n_free]):
        donor = donors[k % len(donors)]
        items.append(DecisionItem(str(row["id"]), row["query"], False, [], donor.apis, "tool_free", row["category"],
                                  answer=row.get("answer"), tools_from=f"{donor.group}-{donor.query_id}",
                                  benchmark="tool_free"))
    return items, dict(skipped)
