"""RestBench-TMDB path metrics: correct path rate and solution-length delta (RestGPT, Song et al. 2023).

- **Correct path rate**: the share of queries whose gold API path (a list such as
  ``["GET /search/person", "GET /person/{person_id}/movie_credits"]``), normalised, appears *in
  order* (as a subsequence, other calls may come between) within the API calls the run executed.
- **Fractional path score** (``path_fraction_score``): per query, the share of the gold path
  matched in order, i.e. the longest common subsequence of the gold path and the executed calls
  divided by the gold path's length, averaged over queries. A query with the whole gold path in
  order scores 1 (as in the binary rate), one that made the first of two gold calls scores 0.5.
  CodeTool's reported 91.15% cannot be a 0/1 share of RestBench-TMDB's 100 queries, so the paper
  reported a fractional measure of this kind; RestGPT's is the binary ``correct_path_rate``. Both
  are in every report, under these names.
- **Solution-length delta** (Δ solution length): on successful queries, the mean of
  ``len(executed calls) - len(gold path)``. A query is successful when the judge's majority label
  is Solved; without a judge, when its path is correct (the report says which).
- **Success rate** is the judge's pass rate over RestBench queries (Solved 1 / Unsure 0.5 /
  Unsolved 0, see :mod:`codetool.eval.stabletoolbench`).

Normalisation (:func:`normalize_api`): method upper-cased; whitespace stripped and collapsed (the
data has ``"GET /search/movie "`` and ``" GET /movie/popular"``); scheme, host and the ``/3``
API-version prefix dropped; query string and trailing slash dropped; every path parameter
becomes ``{}``, so ``/person/{movie_id}/movie_credits`` (the one wrong template of the RestGPT
data) matches ``/person/{person_id}/movie_credits``, and a concrete call ``/movie/550/credits``
matches ``/movie/{}/credits`` (a numeric segment counts as a parameter).

**Contract with the search** (fields it must fill): the gold path comes from the trajectory's
``extra["gold_path"]`` (list of ``"METHOD /path"``), else from a RestGPT ``tmdb.json`` passed to
:func:`load_gold_paths` and matched by query text. The executed calls are
``Trajectory.executed_calls()``; each call's ``name`` (the Python function the code called) is
mapped to ``"METHOD /path"`` through the trajectory's ``available_tools`` entry of that name,
which must carry ``"method"`` and ``"path"`` (an OpenAPI path template) or ``"url"``. A call
whose name is itself ``"METHOD /path"`` needs no entry. Calls that cannot be mapped are counted
(``unmapped_calls``) and never match. Every attempted call counts, including ones that failed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from codetool import CodetoolError
from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_API_VERSION = re.compile(r"^/\d+(?=/)")  # TMDB's "/3" prefix of full URLs


def normalize_api(text: str) -> str:
    """``"METHOD /path"`` in canonical form (see the module docstring); ``""`` for empty input.

    Examples: ``" get  /movie/{movie_id}/credits/ "`` -> ``"GET /movie/{}/credits"``;
    ``"GET https://api.themoviedb.org/3/search/movie?query=x"`` -> ``"GET /search/movie"``.
    """
    parts = " ".join(str(text).split()).split(" ", 1)
    if not parts[0]:
        return ""
    method, path = (parts[0].upper(), parts[1] if len(parts) > 1 else "") if parts[0].upper() in _METHODS \
        else ("GET", " ".join(parts))
    path = path.replace(" ", "")
    if "://" in path:
        path = urlsplit(path).path
        path = _API_VERSION.sub("", path)
    path = path.split("?", 1)[0].rstrip("/")
    segments = ["{}" if re.fullmatch(r"\{[^}]*\}|\d+", s) else s for s in path.split("/")]
    path = "/".join(segments)
    return f"{method} {path if path.startswith('/') else '/' + path}"


def is_subsequence(gold: Sequence[str], executed: Sequence[str]) -> bool:
    """Whether ``gold`` appears in order within ``executed`` (other items may lie between)."""
    remaining = iter(executed)
    return all(any(g == e for e in remaining) for g in gold)


def matched_in_order(gold: Sequence[str], executed: Sequence[str]) -> int:
    """How many gold calls ``executed`` matches in order: the length of their longest common
    subsequence (0 for an empty side)."""
    prev = [0] * (len(executed) + 1)
    for g in gold:
        row = [0]
        for j, e in enumerate(executed):
            row.append(prev[j] + 1 if g == e else max(prev[j + 1], row[j]))
        prev = row
    return prev[-1]


def executed_path(traj: Trajectory) -> tuple[list[str], int]:
    """The normalised ``"METHOD /path"`` of each executed call, and how many could not be mapped."""
    by_name = {}
    for entry in traj.available_tools:
        if entry.get("path") or entry.get("url"):
            by_name[entry.get("name", "")] = f"{entry.get('method', 'GET')} {entry.get('path') or entry.get('url')}"
    path, unmapped = [], 0
    for call in traj.executed_calls():
        name = str(call.name)
        if name in by_name:
            path.append(normalize_api(by_name[name]))
        elif name.split(" ", 1)[0].upper() in _METHODS and "/" in name:
            path.append(normalize_api(name))
        else:
            unmapped += 1
    return path, unmapped


def load_gold_paths(path: str | Path) -> dict[str, list[str]]:
    """Gold paths by query text from RestGPT's ``datasets/tmdb.json`` (``[{query, solution}]``) or
    CodeTool's ``tmdb.data.candidate=20.v2.json`` (``url`` lists full URLs).

    Raises:
        CodetoolError: the file is missing or not a list of queries with solutions.
    """
    path = Path(path)
    if not path.is_file():
        raise CodetoolError(f"RestBench gold file not found: {path}. Pass RestGPT's datasets/tmdb.json.")
    data = json.loads(path.read_text())
    if not isinstance(data, list) or not all(isinstance(x, dict) and "query" in x for x in data):
        raise CodetoolError(f"{path}: expected a list of {{query, solution}} objects.")
    return {" ".join(x["query"].split()): list(x.get("url") or x.get("solution") or []) for x in data}


def gold_path(traj: Trajectory, fallback: dict[str, list[str]] | None = None) -> list[str] | None:
    """The normalised gold path of ``traj``: ``extra["gold_path"]`` first, else ``fallback`` by query."""
    gold = traj.extra.get("gold_path")
    if gold is None and fallback:
        gold = fallback.get(" ".join(traj.query.split()))
    return [normalize_api(g) for g in gold] if gold else None


@dataclass
class PathMetrics:
    """RestBench path metrics of one set of trajectories.

    Args:
        n (`int`): queries with a gold path.
        correct_path_rate (`float`): share of those whose gold path lies in order in the calls
            (binary per query; RestGPT's "correct path rate").
        path_fraction_score (`float`): mean over those of the share of the gold path matched in
            order (fractional per query; the kind of number CodeTool reported).
        delta_solution_len (`float` or `None`): mean extra calls on successful queries.
        successful (`int`): queries the delta is computed on.
        success_basis (`str`): ``judge`` or ``correct_path``.
        unmapped_calls (`int`): executed calls with no ``"METHOD /path"``.
        missing_gold (`int`): trajectories without a gold path (left out).
        gold_first (`int`): trajectories whose candidate APIs start with the gold path in order
            (2+ APIs): the candidates were probably not shuffled (the data lists gold APIs first).
        per_query (`dict`): query id -> ``{"correct": bool, "calls": int, "gold": int}``.
    """

    n: int
    correct_path_rate: float
    delta_solution_len: float | None
    successful: int
    success_basis: str
    unmapped_calls: int = 0
    missing_gold: int = 0
    gold_first: int = 0
    per_query: dict[str, dict] = field(default_factory=dict)
    path_fraction_score: float = 0.0


def _gold_first(traj: Trajectory, gold: list[str]) -> bool:
    if len(gold) < 2:
        return False
    listed = [normalize_api(f"{e.get('method', 'GET')} {e.get('path') or e.get('url')}")
              for e in traj.available_tools[:len(gold)] if e.get("path") or e.get("url")]
    return listed == gold


def path_metrics(trajs: Sequence[Trajectory], solved: Sequence[bool] | None = None, *,
                 fallback: dict[str, list[str]] | None = None) -> PathMetrics:
    """Correct path rate and solution-length delta over ``trajs``.

    Args:
        solved (`Sequence[bool]`, *optional*): per trajectory, whether the judge's majority label is
            Solved; without it, success means a correct path.
        fallback (`dict`, *optional*): gold paths by query text (see :func:`load_gold_paths`).
    """
    per_query, deltas = {}, []
    unmapped = missing = first = 0
    for i, traj in enumerate(trajs):
        gold = gold_path(traj, fallback)
        if not gold:
            missing += 1
            continue
        executed, lost = executed_path(traj)
        unmapped += lost
        first += _gold_first(traj, gold)
        correct = is_subsequence(gold, executed)
        per_query[traj.query_id] = {"correct": correct, "calls": len(executed) + lost, "gold": len(gold),
                                    "fraction": matched_in_order(gold, executed) / len(gold)}
        if (solved[i] if solved is not None else correct):
            deltas.append(len(executed) + lost - len(gold))
    if missing:
        logger.warning("%d RestBench trajectories have no gold path (extra['gold_path']); left out", missing)
    n = len(per_query)
    return PathMetrics(n, sum(q["correct"] for q in per_query.values()) / n if n else 0.0,
                       sum(deltas) / len(deltas) if deltas else None, len(deltas),
                       "judge" if solved is not None else "correct_path", unmapped, missing, first, per_query,
                       sum(q["fraction"] for q in per_query.values()) / n if n else 0.0)
