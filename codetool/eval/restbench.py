"""RestBench-TMDB path metrics: correct path rate, shares of the gold path, CoAgents' score, Δ length.

Each metric compares the gold API path of a query (``["GET /search/person",
"GET /person/{person_id}/movie_credits"]``, RestGPT ``datasets/tmdb.json``) with the API calls the
run executed, in order (failed calls count):

- **correct path rate** (``correct_path_rate``, RestGPT, Song et al. 2023): the share of queries
  whose gold path appears *in order* within the executed calls (other calls may lie between);
  0/1 per query. RestGPT's paper defines it; its repository has no scorer.
- **pooled share of gold calls** (``path_pooled_rate``): ``sum(LCS(gold, executed)) /
  sum(len(gold))`` over the queries, the longest common subsequence counting the gold calls matched
  in order. This is the form that gives CodeTool's reported 91.15% (206 of RestBench-TMDB's 226 gold
  calls); no mean of per-query fractions over 100 queries can.
- **per-query mean** (``path_fraction_score``): the mean over queries of ``LCS / len(gold)``.
- **CoAgents' correct path** (``path_rate_coagents``, shizhl/CoAgents ``utilize/evaluate.py``,
  ``ours()`` with ``api_eval``, the closest public scorer from CodeTool's authors): each executed
  call loses the TMDB host, every ``GET`` and ``[0]``-``[9]``; each gold call loses ``"GET "``;
  both lists get a ``Finish`` appended and are lower-cased; per query ``LCS / len(gold list)``;
  the mean divides by ``n + 0.0001`` and is rounded to 4 decimals, as it prints. So a query with a
  stray space in its gold never matches that call, a lower-case ``get`` is not removed, and a run
  that calls nothing scores ``1 / (len(gold) + 1)`` (the finish always matches). ``coagents``
  holds its six printed means (success_rate, f1, precision, recall, delta, correct_path).
- **Solution-length delta** (Δ solution length): on successful queries, the mean of
  ``len(executed calls) - len(gold path)``. A query is successful when the judge's majority label
  is Solved; without a judge, when its path is correct (the report says which).
- **Success rate** is the judge's pass rate over RestBench queries (Solved 1 / Unsure 0.5 /
  Unsolved 0, see :mod:`codetool.eval.stabletoolbench`).

The first three need a comparison of calls, which no reference defines; two normalisations
(``normalization``): ``template`` (the default, :func:`normalize_api`): whitespace stripped and
collapsed (the data has ``"GET /search/movie "``), method upper-cased (none: GET), scheme, host
and the ``/3`` API-version prefix dropped, query string and trailing slash dropped, and every path
segment that is ``{...}`` or all digits becomes ``{}``, so ``/person/{movie_id}/movie_credits``
(the one wrong template of the RestGPT data) matches ``/person/{person_id}/movie_credits`` and
``/movie/550/credits`` matches ``/movie/{}/credits``; ``trim`` (:func:`normalize_trim`):
whitespace only.

**Contract with the search** (fields it must fill): the gold path comes from the trajectory's
``extra["gold_path"]`` (list of ``"METHOD /path"``), else from a RestGPT ``tmdb.json`` passed to
:func:`load_gold_paths` and matched by query text. The executed calls are
``Trajectory.executed_calls()``; each call's ``name`` (the Python function the code called) is
mapped to ``"METHOD /path"`` through the trajectory's ``available_tools`` entry of that name,
which must carry ``"method"`` and ``"path"`` (an OpenAPI path template) or ``"url"``. A call
whose name is itself ``"METHOD /path"`` needs no entry. Calls that cannot be mapped are counted
(``unmapped_calls``) and never match.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from codetool import CodetoolError
from codetool.eval import stabletoolbench
from codetool.eval.stabletoolbench import majority_label
from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)

BENCHMARK = "restbench-tmdb"  # the trajectories' ``benchmark``
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


def normalize_trim(text: str) -> str:
    """``text`` with its whitespace collapsed and stripped, nothing else (the ``trim`` normalisation)."""
    return " ".join(str(text).split())


NORMALIZATIONS = {"template": normalize_api, "trim": normalize_trim}


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


def executed_calls_text(traj: Trajectory) -> tuple[list[str], int]:
    """The ``"METHOD /path"`` (or ``"METHOD <url>"``) text of each executed call as its tool entry
    gives it, and how many calls could not be mapped."""
    by_name = {}
    for entry in traj.available_tools:
        if entry.get("path") or entry.get("url"):
            by_name[entry.get("name", "")] = f"{entry.get('method', 'GET')} {entry.get('path') or entry.get('url')}"
    calls, unmapped = [], 0
    for call in traj.executed_calls():
        name = str(call.name)
        if name in by_name:
            calls.append(by_name[name])
        elif name.split(" ", 1)[0].upper() in _METHODS and "/" in name:
            calls.append(name)
        else:
            unmapped += 1
    return calls, unmapped


def executed_path(traj: Trajectory, normalization: str = "template") -> tuple[list[str], int]:
    """The normalised ``"METHOD /path"`` of each executed call, and how many could not be mapped."""
    calls, unmapped = executed_calls_text(traj)
    return [NORMALIZATIONS[normalization](c) for c in calls], unmapped


def coagents_normalize(text: str) -> str:
    """CoAgents' ``normalize`` of an executed call: the TMDB host and every ``GET`` removed, then
    ``[0]`` ... ``[9]``, stripping after each."""
    for part in ("https://api.themoviedb.org/3", "GET"):
        text = text.replace(part, "").strip()
    for i in range(10):
        text = text.replace(f"[{i}]", "").strip()
    return text.strip()


def coagents_lists(gold: Sequence[str], executed: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(pred, answer)`` as CoAgents' ``ours()`` compares them (before ``api_eval`` lower-cases):
    the executed calls normalised, the gold without ``"GET "``, a ``Finish`` appended to both."""
    return [coagents_normalize(c) for c in executed] + ["Finish"], [g.replace("GET ", "") for g in gold] + ["Finish"]


def coagents_api_eval(pred: Sequence[str], answer: Sequence[str]) -> dict[str, float]:
    """CoAgents' ``api_eval`` on one query (lists from :func:`coagents_lists`): success_rate (every
    gold entry somewhere in the calls), f1, precision, recall (0.001 added to each denominator,
    0.0001 to f1's), delta (extra calls on a success) and correct_path (``LCS / len(answer)``)."""
    pred, answer = [e.lower() for e in pred], [e.lower() for e in answer]
    overlap = len([e for e in answer if e in pred])
    precision, recall = overlap / (len(pred) + 0.001), overlap / (len(answer) + 0.001)
    success = overlap == len(answer) * (pred[-1].lower() == "finish")
    return {"success_rate": float(success), "f1": 2 * precision * recall / (precision + recall + 0.0001),
            "precision": precision, "recall": recall, "delta": float(max(len(pred) - len(answer), 0) * success),
            "correct_path": matched_in_order(pred, answer) / len(answer)}


def coagents_mean(values: Sequence[float]) -> float:
    """CoAgents' ``mean``: the sum over ``n + 0.0001``, rounded to 4 decimals."""
    return round(sum(values) / (len(values) + 0.0001), 4)


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


def raw_gold_path(traj: Trajectory, fallback: dict[str, list[str]] | None = None) -> list[str] | None:
    """The gold path of ``traj`` as the data writes it: ``extra["gold_path"]`` first, else
    ``fallback`` by query text."""
    gold = traj.extra.get("gold_path")
    if gold is None and fallback:
        gold = fallback.get(" ".join(traj.query.split()))
    return [str(g) for g in gold] if gold else None


def gold_path(traj: Trajectory, fallback: dict[str, list[str]] | None = None,
              normalization: str = "template") -> list[str] | None:
    """The normalised gold path of ``traj`` (see :func:`raw_gold_path`)."""
    gold = raw_gold_path(traj, fallback)
    return [NORMALIZATIONS[normalization](g) for g in gold] if gold else None


@dataclass
class PathMetrics:
    """RestBench path metrics of one set of trajectories (see the module docstring).

    Args:
        n (`int`): queries with a gold path.
        correct_path_rate (`float`): share of those whose gold path lies in order in the calls
            (0/1 per query; RestGPT's "correct path rate").
        delta_solution_len (`float` or `None`): mean extra calls on successful queries.
        successful (`int`): queries the delta is computed on.
        success_basis (`str`): ``judge`` or ``correct_path``.
        unmapped_calls (`int`): executed calls with no ``"METHOD /path"``.
        missing_gold (`int`): trajectories without a gold path (left out).
        gold_first (`int`): trajectories whose candidate APIs start with the gold path in order
            (2+ APIs): the candidates were probably not shuffled (the data lists gold APIs first).
        per_query (`dict`): query id -> ``{"correct", "calls", "gold", "lcs", "fraction", "coagents"}``.
        path_fraction_score (`float`): mean over queries of ``LCS / len(gold)``.
        path_pooled_rate (`float`): ``sum(LCS) / sum(len(gold))`` (the form of CodeTool's 91.15%).
        matched_gold_calls, gold_calls (`int`): that ratio's numerator and denominator.
        path_rate_coagents (`float`): CoAgents' printed ``correct_path`` (finish appended, its mean).
        coagents (`dict`): CoAgents' six printed means.
        normalization (`str`): ``template`` or ``trim`` (CoAgents' numbers use its own).
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
    path_pooled_rate: float = 0.0
    matched_gold_calls: int = 0
    gold_calls: int = 0
    path_rate_coagents: float = 0.0
    coagents: dict[str, float] = field(default_factory=dict)
    normalization: str = "template"


def _gold_first(traj: Trajectory, gold: list[str]) -> bool:
    if len(gold) < 2:
        return False
    listed = [normalize_api(f"{e.get('method', 'GET')} {e.get('path') or e.get('url')}")
              for e in traj.available_tools[:len(gold)] if e.get("path") or e.get("url")]
    return listed == [normalize_api(g) for g in gold]


def path_metrics(trajs: Sequence[Trajectory], solved: Sequence[bool] | None = None, *,
                 fallback: dict[str, list[str]] | None = None, normalization: str = "template") -> PathMetrics:
    """The path metrics of ``trajs`` (see the module docstring).

    Args:
        solved (`Sequence[bool]`, *optional*): per trajectory, whether the judge's majority label is
            Solved; without it, success means a correct path.
        fallback (`dict`, *optional*): gold paths by query text (see :func:`load_gold_paths`).
        normalization (`str`, *optional*, defaults to `"template"`): ``template`` or ``trim``.

    Raises:
        CodetoolError: an unknown ``normalization``.
    """
    if normalization not in NORMALIZATIONS:
        raise CodetoolError(f"RestBench path normalization must be one of {', '.join(NORMALIZATIONS)}, "
                            f"got {normalization!r}.")
    norm = NORMALIZATIONS[normalization]
    per_query: dict[str, dict[str, Any]] = {}
    deltas: list[int] = []
    unmapped = missing = first = 0
    for i, traj in enumerate(trajs):
        raw_gold = raw_gold_path(traj, fallback)
        if not raw_gold:
            missing += 1
            continue
        calls, lost = executed_calls_text(traj)
        gold, executed = [norm(g) for g in raw_gold], [norm(c) for c in calls]
        unmapped += lost
        first += _gold_first(traj, raw_gold)
        correct = is_subsequence(gold, executed)
        lcs = matched_in_order(gold, executed)
        per_query[traj.query_id] = {"correct": correct, "calls": len(executed) + lost, "gold": len(gold), "lcs": lcs,
                                    "fraction": lcs / len(gold),
                                    "coagents": coagents_api_eval(*coagents_lists(raw_gold, calls))}
        if (solved[i] if solved is not None else correct):
            deltas.append(len(executed) + lost - len(gold))
    if missing:
        logger.warning("%d RestBench trajectories have no gold path (extra['gold_path']); left out", missing)
    n = len(per_query)
    rows = list(per_query.values())
    coagents = {k: coagents_mean([q["coagents"][k] for q in rows]) for k in
                ("success_rate", "f1", "precision", "recall", "delta", "correct_path")} if rows else {}
    matched, total = sum(q["lcs"] for q in rows), sum(q["gold"] for q in rows)
    return PathMetrics(n, sum(q["correct"] for q in rows) / n if n else 0.0,
                       sum(deltas) / len(deltas) if deltas else None, len(deltas),
                       "judge" if solved is not None else "correct_path", unmapped, missing, first, per_query,
                       sum(q["fraction"] for q in rows) / n if n else 0.0, matched / total if total else 0.0,
                       matched, total, coagents.get("correct_path", 0.0), coagents, normalization)


def evaluate(runs: Sequence, labels: Mapping[str, Sequence[Sequence[str]] | None], rounds: int, *,
             gold: dict[str, list[str]] | None = None,
             filters: Callable[[str], list[str] | None] | None = None) -> dict[str, Any]:
    """The report's RestBench-TMDB section: StableToolBench's numbers
    (:func:`codetool.eval.stabletoolbench.evaluate`; the pass rate is RestBench's success rate)
    plus, per group and overall, ``path`` (:func:`path_metrics`, a query succeeds when its majority
    label is Solved, or without labels when its path is correct) and ``path_trim`` (the same under
    whitespace-only normalisation, without ``per_query``).

    Args:
        runs (`Sequence[Run]`): the runs shown; labels (`Mapping`): the labels by method.
        gold (`dict`, *optional*): gold paths by query text (:func:`load_gold_paths`).
        filters (`Callable`, *optional*): see :func:`codetool.eval.stabletoolbench.evaluate`.

    Returns:
        ``{"restbench-tmdb": section}``, or ``{}`` when no run has a RestBench trajectory.
    """
    def paths(trajs: list[Trajectory], lab: list | None) -> dict[str, Any]:
        solved = [majority_label(x) == "Solved" for x in lab] if lab is not None else None
        path = asdict(path_metrics(trajs, solved, fallback=gold))
        trim = asdict(path_metrics(trajs, solved, fallback=gold, normalization="trim"))
        return {"path": path, "path_trim": {k: v for k, v in trim.items() if k != "per_query"}}

    return stabletoolbench.evaluate(runs, labels, rounds, [BENCHMARK], filters=filters, extra=paths)


def path_warnings(method: str, path: Mapping[str, Any] | None) -> list[str]:
    """What a method's overall ``path`` numbers warn about: trajectories without a gold path, calls
    that map to no ``METHOD /path``, candidate lists that start with the gold APIs (not shuffled)."""
    if not path:
        return []
    warnings = []
    if path["missing_gold"]:
        warnings.append(f"{method}: {path['missing_gold']} RestBench trajectories have no gold path and are "
                        f"left out of the path rate (fill extra.gold_path or pass --restbench_gold).")
    if path["unmapped_calls"]:
        warnings.append(f"{method}: {path['unmapped_calls']} tool calls could not be mapped to 'METHOD /path' "
                        f"(available_tools entries need method and path).")
    if path["gold_first"]:
        warnings.append(f"{method}: {path['gold_first']} RestBench queries list the gold APIs first among the "
                        f"candidates: shuffle candidate APIs with a fixed seed before prompting.")
    return warnings
