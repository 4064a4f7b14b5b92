"""No test query in any training data (issue 38): the one filter of ``build-trees``, ``train-prm``
and ``train-policy``.

:class:`HeldOut` holds the queries kept out of training, by id and by normalised text (lower case,
runs of non-alphanumerics as one space): a query copied into another file under another id is still
caught by its text, and a query whose wording changed slightly is still caught by its id. Ids are
compared within a family that shares an id space: ToolBench's ``G1_query.json`` ids are the ids of
StableToolBench's ``G1_instruction``, ``G1_category`` and ``G1_tool`` test sets (``G2``, ``G3``
alike: ToolBench's maintainers point to ``data/test_query_ids`` for the test ids inside those
files), and RestBench-TMDB's ``q0``-``q99`` whatever file they come from.

Named sets (:func:`load_held_out`), read from the benchmark data (``codetool data fetch``):

- ``stabletoolbench``: every StableToolBench solvable test query, the 765 of the six groups, ids
  from ``solvable_queries/test_query_ids`` and texts from ``test_instruction`` (CodeTool's filtered
  580 are among them); ``stabletoolbench:<group>`` one group;
- ``restbench-tmdb``: the 100 RestBench-TMDB queries (an evaluation benchmark only);
  ``restbench-tmdb:<first>-<last>`` a range of them (``restbench-tmdb:0-49``).

A named set whose files are missing from the benchmark data raises: the guarantee cannot be given
without them. Where there is no benchmark data at all (a fresh clone training on its own API's
queries, which cannot have come from our benchmark loaders), the sets cannot be read: the filter
then keeps everything, says so in a warning, and :attr:`HeldOut.unchecked` names the sets, which the
caller writes into its summary beside the count it dropped (a summary never claims a check that did
not run).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from codetool import CodetoolError

logger = logging.getLogger(__name__)

STB_GROUPS = ("G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category", "G3_instruction")
NAMED = ("stabletoolbench", "restbench-tmdb")


def normalised(text: str) -> str:
    """A query's text for matching: lower case, runs of non-alphanumerics as one space."""
    return re.sub(r"[^a-z0-9]+", " ", str(text).lower()).strip()


def id_family(benchmark: str, group: str | None) -> str | None:
    """The id space of a query: ``toolbench:G1`` (ToolBench's ``G1_query`` file and StableToolBench's
    G1 test groups), ``restbench`` (RestBench-TMDB), or ``None`` (its text alone identifies it)."""
    if benchmark in ("restbench", "restbench-tmdb"):
        return "restbench"
    match = re.match(r"(G[123])(_|$)", str(group or ""))
    return f"toolbench:{match.group(1)}" if match else None


def raw_id(query_id: str) -> str:
    """A query id without the file prefix build-trees adds (``G1_query/588`` -> ``588``)."""
    return str(query_id).rsplit("/", 1)[-1]


@dataclass(frozen=True)
class HeldOut:
    """Queries that no training data may hold.

    Args:
        ids (`frozenset[tuple[str, str]]`): ``(id family, query id)`` pairs (:func:`id_family`).
        texts (`frozenset[str]`): normalised query texts (:func:`normalised`).
        names (`tuple[str, ...]`): what the sets are, for summaries.
        unchecked (`tuple[str, ...]`): sets that could not be read (no benchmark data at all): nothing
            of them is held out, and summaries say so.
    """

    ids: frozenset = frozenset()
    texts: frozenset = frozenset()
    names: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()

    def __or__(self, other: HeldOut) -> HeldOut:
        return HeldOut(self.ids | other.ids, self.texts | other.texts, self.names + other.names,
                       self.unchecked + other.unchecked)

    def __len__(self) -> int:
        return len(self.texts | {f"\x00{f}/{q}" for f, q in self.ids})

    def reason(self, query_id, text: str, family: str | None) -> str | None:
        """``"id"`` or ``"text"`` when the query is held out (its id first), else ``None``."""
        if family is not None and (family, raw_id(query_id)) in self.ids:
            return "id"
        return "text" if normalised(text) in self.texts else None

    def split(self, queries: Iterable) -> tuple[list, list]:
        """``(kept, dropped)`` of ``BenchmarkQuery``-like queries (``query_id``, ``query``,
        ``benchmark``, ``group``)."""
        kept: list = []
        dropped: list = []
        for q in queries:
            held = self.reason(q.query_id, q.query, id_family(q.benchmark, q.group))
            (dropped if held else kept).append(q)
        return kept, dropped

    def split_rows(self, rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
        """``(kept, dropped)`` of PRM rows (``query_id`` as build-trees writes it: ``G1_query/588``;
        ``query``): by text, and by id in the ToolBench family of the id's file prefix."""
        kept: list[dict] = []
        dropped: list[dict] = []
        for row in rows:
            qid = str(row.get("query_id", ""))
            group = qid.rsplit("/", 1)[0] if "/" in qid else None
            held = self.reason(qid, row.get("query", ""), id_family("toolbench", group))
            (dropped if held else kept).append(row)
        return kept, dropped


def held_out_of(queries: Iterable, name: str = "given") -> HeldOut:
    """The :class:`HeldOut` of loaded queries (e.g. a run's evaluation sets)."""
    queries = list(queries)
    ids = {(f, raw_id(q.query_id)) for q in queries if (f := id_family(q.benchmark, q.group)) is not None}
    return HeldOut(frozenset(ids), frozenset(normalised(q.query) for q in queries), (name,))


def _read(path: Path):
    if not path.is_file():
        raise CodetoolError(f"{path} is missing: it lists test queries that training data must not hold. Fetch the "
                            "data with `codetool data fetch`, or leave that set out of never_train_on.")
    return json.loads(path.read_text(encoding="utf-8"))


def _stabletoolbench(root: Path, group: str) -> HeldOut:
    base = root / "StableToolBench" / "solvable_queries"
    family = id_family("stabletoolbench", group)
    ids = {(family, str(k)) for k in _read(base / "test_query_ids" / f"{group}.json")}
    queries = _read(base / "test_instruction" / f"{group}.json")
    ids |= {(family, str(q["query_id"])) for q in queries if "query_id" in q}
    return HeldOut(frozenset(ids), frozenset(normalised(q.get("query", "")) for q in queries),
                   (f"stabletoolbench:{group}",))


def _restbench(root: Path, first: int, last: int | None) -> HeldOut:
    rows = _read(root / "RestGPT" / "datasets" / "tmdb.json")
    last = len(rows) - 1 if last is None else last
    picked = [(i, r) for i, r in enumerate(rows) if first <= i <= last]
    name = "restbench-tmdb" if (first, last) == (0, len(rows) - 1) else f"restbench-tmdb:{first}-{last}"
    return HeldOut(frozenset(("restbench", f"q{i}") for i, _ in picked),
                   frozenset(normalised(r["query"]) for _, r in picked), (name,))


def load_held_out(names: Iterable[str], data_dir: str | Path | None = None) -> HeldOut:
    """The union of the named sets (see the module docstring). With no ``data_dir`` and no
    benchmark data found at all, nothing is held out and :attr:`HeldOut.unchecked` names the sets
    (a warning says how to check them).

    Raises:
        CodetoolError: an unknown name, or a set whose data files are missing from the data folder.
    """
    from codetool.tools.data import data_root

    out = HeldOut()
    names = list(names)
    if not names:
        return out
    unknown = [n for n in names if str(n).partition(":")[0] not in NAMED]
    if unknown:
        raise CodetoolError(f"unknown held-out set {unknown[0]!r}; choose stabletoolbench[:<group>] or "
                            "restbench-tmdb[:<first>-<last>].")
    if data_dir:
        root = Path(data_dir)
    else:
        try:
            root = data_root()
        except CodetoolError:
            logger.warning("no benchmark data found, so the training queries were not checked against the test "
                           "sets %s; run `codetool data fetch` to check them, or set never_train_on to [] to say "
                           "that your queries cannot hold them", ", ".join(map(str, names)))
            return HeldOut(unchecked=tuple(map(str, names)))
    for name in names:
        base, _, part = str(name).partition(":")
        if base == "stabletoolbench":
            groups = [part] if part else list(STB_GROUPS)
            if any(g not in STB_GROUPS for g in groups):
                raise CodetoolError(f"held-out set {name!r}: unknown group; choose one of {list(STB_GROUPS)}.")
            for group in groups:
                out = out | _stabletoolbench(root, group)
        elif base == "restbench-tmdb":
            match = re.fullmatch(r"(\d+)-(\d+)", part) if part else None
            if part and not match:
                raise CodetoolError(f"held-out set {name!r}: give a range of query numbers, e.g. restbench-tmdb:0-49.")
            out = out | _restbench(root, int(match.group(1)) if match else 0, int(match.group(2)) if match else None)
        else:
            raise CodetoolError(f"unknown held-out set {name!r}; choose stabletoolbench[:<group>] or "
                                "restbench-tmdb[:<first>-<last>].")
    return out
