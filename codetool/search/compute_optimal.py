"""Compute-optimal allocation (``search.strategy: compute_optimal``): per query, a strategy and a
share of the run's token budget chosen by estimated difficulty (Snell et al. 2024, arXiv
2408.03314; the rule is in :mod:`codetool.search.allocation` and docs/SEARCH.md).

1. **Estimate** each query's difficulty cheaply, for all queries first (the levels are quantiles
   over the run): ``search.difficulty: prm`` samples the first step's K candidates of every query
   (batched, ``search.concurrency`` queries per call), runs them in forks, scores them with the PRM
   (with no PRM: their on-the-spot reward) and takes ``1 - mean``; their tokens, PRM tokens, tool
   calls and forks are added to that query's trajectory and taken from the budget. ``router``
   reads ``1 - confidence`` of the decide-first stage (``codetool run --router`` puts it in the
   task's ``extra["decision_confidence"]``) and costs nothing here; ``auto`` uses it where a query
   has it.
2. **Allocate**: level, strategy, weight and share (:func:`~codetool.search.allocation.budget_shares`),
   each share turned into the strategy's size (:func:`sized`); what a strategy cannot use (a beam
   as wide as it can grow in ``max_steps``) goes to the others by weight (:func:`plan`).
3. **Search** each query with its strategy (its own ``search.vote`` applies), one query after
   another under batched rounds, side by side under continuous scheduling.

Each trajectory's ``strategy`` records ``{"name": "compute_optimal", "difficulty",
"difficulty_source", "level", "strategy", "size", "budget", "estimate_tokens", "inner"}``, and its
compute fields include the estimate's. Limits: see :mod:`codetool.search.allocation`; the probe's
first-step candidates are not reused by the search that follows (they are paid for once more).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from codetool.config import ConfigError
from codetool.resume import unit_seed
from codetool.rewards import not_executed
from codetool.search.allocation import VOTING, budget_shares, difficulty_levels
from codetool.search.beam import beam_search
from codetool.search.best_of_n import best_of_n
from codetool.search.config import SearchConfig
from codetool.search.dvts import dvts
from codetool.search.episode import (
    Episodes,
    Hook,
    SearchParts,
    Strategy,
    account,
    count_step,
    each_query,
)
from codetool.search.expand import Node, expand_each
from codetool.search.greedy import greedy
from codetool.search.lookahead import lookahead
from codetool.search.records import Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.search import SearchTask

logger = logging.getLogger(__name__)

# The strategies a level can name (allocation.ALLOCATED): the same functions as
# codetool.assemble.STRATEGIES, which this layer cannot import (tests/test_search_allocation.py checks).
ALLOCATABLE: dict[str, Strategy] = {"greedy": greedy, "best_of_n": best_of_n, "beam": beam_search, "dvts": dvts,
                                    "lookahead": lookahead}


@dataclass
class Estimate:
    """A query's difficulty estimate and what it cost.

    Args:
        difficulty (`float`): in [0, 1], higher is harder.
        source (`str`): ``prm``, ``spot`` (first-step R_spot, no PRM), ``router`` or ``unknown`` (the
            estimate failed, or the executor could run none of the candidates: the median of the others).
        cost (`Trajectory`): its compute (``generated_tokens``, ``prm_scored_tokens``, ``tool_calls``,
            ``executor_forks``, ``phase_seconds``, ``wall_time_s``).
        tokens (`list[int]`): completion tokens of each first-step candidate sampled.
    """

    difficulty: float
    source: str
    cost: Trajectory
    tokens: list[int] = field(default_factory=list)


def compute_optimal(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
                    on_done: Hook | None = None) -> list[Trajectory]:
    """Estimate, allocate and search every task (see the module docstring); ``on_done`` sees each
    final trajectory.

    Raises:
        ConfigError: settings the parts cannot run; ``difficulty: router`` for a query without a
            decision.
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    tasks = list(tasks)
    if not tasks:
        return []
    budget = cfg.budget
    assert budget is not None, "SearchConfig refuses compute_optimal without search.budget"
    estimates = estimate_difficulty(episodes, tasks)
    levels = difficulty_levels([e.difficulty for e in estimates], len(cfg.level_weights))
    sampled = [t for e in estimates for t in e.tokens]
    per_candidate = statistics.mean(sampled) if sampled else float(cfg.max_new_tokens)
    spent = sum(e.cost.generated_tokens for e in estimates)
    total = budget * len(tasks) - spent
    if total <= 0:
        logger.warning("the difficulty estimate spent %d tokens, all of search.budget x queries (%d): every query "
                       "runs its level's smallest search", spent, budget * len(tasks))
    names = [cfg.level_strategies[lv] for lv in levels]
    plans = plan(cfg, names, budget_shares(levels, cfg.level_weights, total), per_candidate)
    planned = {t.query_id: (e, lv, name, *p) for t, e, lv, name, p in zip(tasks, estimates, levels, names, plans)}
    parts = episodes.parts  # the sub-searches share the scorer (and its lock)

    def one(task: SearchTask) -> Trajectory:
        estimate, level, name, sub_cfg, size, share = planned[task.query_id]
        [traj] = ALLOCATABLE[name]([task], parts, sub_cfg, None)
        inner = traj.strategy or {"name": name}
        account(traj, estimate.cost)
        traj.wall_time_s += estimate.cost.wall_time_s
        for phase, seconds in estimate.cost.phase_seconds.items():
            traj.phase_seconds[phase] = traj.phase_seconds.get(phase, 0.0) + seconds
        traj.strategy = {"name": "compute_optimal", "difficulty": round(estimate.difficulty, 6),
                         "difficulty_source": estimate.source, "level": level, "levels": len(cfg.level_weights),
                         "strategy": name, "size": size, "budget": round(share, 1),
                         "tokens_per_candidate": round(per_candidate, 2),
                         "estimate_tokens": estimate.cost.generated_tokens, "inner": inner}
        return traj

    # What a query at the mean budget keeps in flight: its candidates per step.
    mean_width = int(budget // (cfg.max_steps * max(per_candidate, 1.0)))
    return each_query(episodes, one, tasks, max(cfg.k, mean_width), on_done)


def estimate_difficulty(episodes: Episodes, tasks: list[SearchTask]) -> list[Estimate]:
    """Every task's :class:`Estimate`, in task order (see the module docstring, step 1).

    Raises:
        ConfigError: ``difficulty: router`` and a task without ``extra["decision_confidence"]``.
    """
    cfg = episodes.cfg
    out: dict[str, Estimate] = {}
    probe: list[SearchTask] = []
    for task in tasks:
        confidence = task.extra.get("decision_confidence")
        if confidence is not None and cfg.difficulty in ("router", "auto"):
            out[task.query_id] = Estimate(min(1.0, max(0.0, 1.0 - float(confidence))), "router",
                                          Trajectory(task.query_id, task.query))
        elif cfg.difficulty == "router":
            raise ConfigError(f"search.difficulty router reads the decide-first stage's confidence, but query "
                              f"{task.query_id} has none: run with --router, or set search.difficulty prm or auto.")
        else:
            probe.append(task)
    for start in range(0, len(probe), episodes.episodes):
        out.update(_probe(episodes, probe[start:start + episodes.episodes]))
    known = [e.difficulty for e in out.values() if e.source != "unknown"]
    middle = statistics.median(known) if known else 0.5
    for e in out.values():
        if e.source == "unknown":
            e.difficulty = middle
    return [out[t.query_id] for t in tasks]


def _probe(episodes: Episodes, chunk: list[SearchTask]) -> dict[str, Estimate]:
    """First-step estimates of ``chunk`` (one ``generate`` call, one PRM call); forks closed."""
    cfg, started = episodes.cfg, time.perf_counter()
    eps = [episodes.start(t) for t in chunk]
    live = [ep for ep in eps if ep.state is not None]
    timings: dict[str, float] = {}
    seed = None if cfg.seed is None else unit_seed(
        cfg.seed, [(ep.task.benchmark, ep.task.group, ep.task.query_id, "difficulty") for ep in live])
    rows = expand_each(episodes.policy, [Node(ep.live_state, ep.history, ep.task) for ep in live], cfg.k, cfg,
                       seed=seed, timings=timings) if live else []
    scored = [(ep, row) for ep, row in zip(live, rows) if not isinstance(row, Exception)]
    use_prm = cfg.latent == "prm" and cfg.w_latent and episodes.scorer is not None
    t0 = time.perf_counter()
    if use_prm and scored:
        episodes.score_latent([ep for ep, _ in scored], [row for _, row in scored])
    timings["scoring"] = time.perf_counter() - t0
    out: dict[str, Estimate] = {}
    share = (time.perf_counter() - started) / len(chunk)
    rows_of = {id(ep): row for ep, row in scored}
    for ep in eps:
        row = rows_of.get(id(ep))
        cost = ep.traj
        estimate = Estimate(0.5, "unknown", cost)
        if row is not None:
            count_step(cost, row)
            estimate.tokens = [e.candidate.completion_tokens for e in row]
            ran = [e.candidate for e in row if not not_executed(e.result)]  # the machine's failures say nothing
            if cost.finish_type != "error" and ran:
                values = [c.r_latent if use_prm and c.r_latent is not None else c.r_spot for c in ran]
                estimate.difficulty = min(1.0, max(0.0, 1.0 - statistics.mean(values)))
                estimate.source = "prm" if use_prm else "spot"
            for e in row:
                if e.state is not None:
                    e.state.close()
        if ep.state is not None:
            ep.state.close()
            ep.state = None
        cost.wall_time_s = share
        cost.phase_seconds = {phase: seconds / len(chunk) for phase, seconds in timings.items()}
        out[ep.task.query_id] = estimate
    return out


def candidates_per_step(strategy: str, size: int, cfg: SearchConfig) -> int:
    """Candidates ``strategy`` samples per step at ``size`` (N, B or K) once all its paths are open,
    rollout steps included (what a comparison matches across strategies)."""
    if strategy == "greedy":
        return size
    if strategy == "lookahead":
        return size * (1 + cfg.lookahead_depth)
    return size * cfg.k  # best_of_n: N episodes, beam: B beams, dvts: N paths; each k candidates


def planned_candidates(strategy: str, size: int, cfg: SearchConfig) -> int:
    """Candidates ``strategy`` samples for one query at ``size`` if every path runs ``max_steps``:
    :func:`candidates_per_step` per step, except that a beam search (DVTS: each subtree) starts
    from one root and keeps at most ``k`` times the beams it had: ``k`` candidates on the first
    step, then ``k x min(width, k^s)`` (so a beam wider than ``k^(max_steps - 1)`` buys nothing)."""
    if strategy not in ("beam", "dvts"):
        return candidates_per_step(strategy, size, cfg) * cfg.max_steps
    width = size if strategy == "beam" else min(cfg.beam_width, size)
    total, open_beams = 0, 1
    for _ in range(cfg.max_steps):
        total += open_beams * cfg.k
        open_beams = min(width, open_beams * cfg.k)
    return total * (1 if strategy == "beam" else size // width)


def plan(cfg: SearchConfig, strategies: list[str], shares: list[float],
         tokens_per_candidate: float) -> list[tuple[SearchConfig, int, float]]:
    """Each query's settings, size and final share: :func:`sized` for every share; then what a
    query whose strategy cannot grow any more leaves of its share (a beam search as wide as it can
    use) goes to the queries that can, in proportion to their level weights (the share's ratio to
    the others is its weight's), until no query can use more. Decided before any search starts.

    Args:
        strategies (`list[str]`), shares (`list[float]`): (queries,) each query's strategy and
            share in tokens (:func:`codetool.search.allocation.budget_shares`).
    Returns:
        (queries,) ``(settings, size, share)``.
    """
    shares = list(shares)
    weights = list(shares)  # the first shares are in proportion to the level weights
    for _ in range(len(shares) + 1):
        plans = [sized(cfg, name, share, tokens_per_candidate) for name, share in zip(strategies, shares)]
        cost = [planned_candidates(name, size, sub) * tokens_per_candidate
                for name, (sub, size) in zip(strategies, plans)]
        full = [not _grows(name, size, sub) for name, (sub, size) in zip(strategies, plans)]
        spare = sum(share - c for share, c, f in zip(shares, cost, full) if f and share > c)
        room = sum(w for w, f in zip(weights, full) if not f)
        if spare < tokens_per_candidate or not room:
            break
        shares = [min(share, c) if f else share + spare * w / room
                  for share, c, f, w in zip(shares, cost, full, weights)]
    return [(sub, size, share) for (sub, size), share in zip(plans, shares)]


def _grows(strategy: str, size: int, cfg: SearchConfig) -> bool:
    step = cfg.beam_width if strategy == "dvts" and size >= cfg.beam_width else 1
    return planned_candidates(strategy, size + step, cfg) > planned_candidates(strategy, size, cfg)


def sized(cfg: SearchConfig, strategy: str, budget: float, tokens_per_candidate: float) -> tuple[SearchConfig, int]:
    """The settings of ``strategy`` for one query with ``budget`` tokens: the largest size whose
    estimate (:func:`planned_candidates` x ``tokens_per_candidate``) fits, at least the smallest
    (N = 1, B = 1, K = 1; DVTS: one subtree of ``beam_width``). A size that would not add to the
    estimate (beam search of a single step) is not taken.

    Returns:
        The query's :class:`SearchConfig` (``strategy`` and its size set) and the size.
    """
    fits = budget / max(tokens_per_candidate, 1.0)  # candidates the share pays for
    unit = cfg.beam_width if strategy == "dvts" else 1  # dvts grows by whole subtrees of beam_width
    size = unit if planned_candidates(strategy, unit, cfg) <= fits else 1
    if size == unit:
        while (planned_candidates(strategy, size + unit, cfg) <= fits
               and planned_candidates(strategy, size + unit, cfg) > planned_candidates(strategy, size, cfg)):
            size += unit
    # One trajectory (greedy, lookahead) has nothing to vote over; the budget belongs to the caller.
    vote = cfg.vote if strategy in VOTING else "none"
    if strategy in ("greedy", "lookahead"):
        return replace(cfg, strategy=strategy, budget=None, vote=vote, k=size), size
    if strategy == "best_of_n":
        return replace(cfg, strategy=strategy, budget=None, vote=vote, n=size), size
    if strategy == "beam":
        return replace(cfg, strategy=strategy, budget=None, vote=vote, beam_width=size), size
    return replace(cfg, strategy=strategy, budget=None, vote=vote, n=size, beam_width=min(cfg.beam_width, size)), size
