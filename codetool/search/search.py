"""The query a search solves and CodeTool's selection rule (Lu et al., ACL 2025, §3).

Per step, the policy samples K candidate snippets; each runs in a ``fork()`` of the episode's
executor, gets the on-the-spot reward, a latent reward (PRM, rollouts, or none) and a LIT tool
cost; :func:`select` keeps the candidate with the best ``w_spot*R_spot + w_latent*R_latent -
w_cost*cost``. Fair selection: the cost term never overturns an on-the-spot difference; with
``w_cost > 0`` equally good candidates go to the cheapest (LIT's cheapest correct plan); remaining
ties go to a seeded random pick (the reference ablation), so a run is deterministic given the
samples and the seed.

The episode mechanics are in :mod:`codetool.search.episode`, the strategies in
``codetool.search.greedy``, ``best_of_n``, ``beam``, ``lookahead``, ``dvts`` and
``compute_optimal`` (the caller's table is ``codetool.assemble.STRATEGIES``), the settings in
:mod:`codetool.search.config`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from codetool.rewards import not_executed
from codetool.search.records import Candidate

if TYPE_CHECKING:
    from codetool.search.config import SearchConfig


@dataclass
class SearchTask:
    """One query to solve.

    Args:
        query_id (`str`), query (`str`): the benchmark query.
        env (`codetool.tools.ToolEnvironment`): its APIs and tool backend.
        benchmark (`str`), group (`str` or `None`): where it comes from.
        extra (`dict`): copied into the trajectory (e.g. RestBench ``gold_path``).
        history (`list[dict]`): steps already taken (``{"code", "observation"}``) when an episode
            continues from a given state (rollouts, a router's fallback); empty for a new query.
        prefill (`str`): text that opens the first step's reply (the model continues it; the
            candidate's text includes it): the decide-first router's Probe&Prefill steering.
    """

    query_id: str
    query: str
    env: Any
    benchmark: str = "custom"
    group: str | None = None
    extra: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    prefill: str = ""


def select(candidates: list[Candidate], cfg: SearchConfig, *, tie_key: str = "") -> int:
    """Score every candidate and return the index of the one to keep.

    Sets ``score`` on each candidate: ``w_spot*r_spot + w_latent*r_latent - w_cost*cost`` (a
    missing latent reward counts as 0, or as the mean of its siblings' when some have one: a
    candidate whose rollouts were all not executed). A candidate that was not executed (the
    machine failed to run it, ``codetool.rewards.not_executed``) is neither chosen nor counted
    against: it is left out of the pick while any candidate ran (the caller ends the episode when
    none did, ``codetool.search.episode``). The pick, in order:

    1. with ``w_cost > 0``, only candidates whose R_spot is at least that of the best candidate
       *without* the cost term stay in: a cheaper candidate can never win by failing on the spot
       (LIT taxes each API call, yet picks the cheapest among the plans that work);
    2. the highest ``score`` (equal up to 1e-9, so 0.9 and 0.8999999999999999 tie);
    3. with ``w_cost > 0``, the lowest cost among equally scored candidates; with ``w_cost == 0``
       cost plays no part (a tool-free ``finish`` does not beat an equally good tool call);
    4. a candidate whose state survived its step over one whose state was lost (its code killed
       its worker: the next step would start from nothing);
    5. ``tie_break='random'``: a pick seeded by ``cfg.seed`` and ``tie_key`` (e.g. query id and
       step), like the reference ablation's random choice among equal candidates; ``first``: the
       earlier sample. ``reference`` skips the rounding of 2: the public code's main method keeps
       candidate 1 unless candidate 2's score is strictly greater (``>=`` on the raw sums), so
       the earliest of the exactly best wins (4 does not apply).

    Args:
        candidates (`list[Candidate]`): the step's executed candidates (``index`` = sample order).
        cfg (`SearchConfig`): weights, ``tie_break`` and ``seed``.
        tie_key (`str`, *optional*): what makes this step's random pick differ from other steps'.
    Returns:
        The ``index`` of the chosen candidate.
    """
    known = [c.r_latent for c in candidates if c.r_latent is not None]
    missing = sum(known) / len(known) if known else 0.0

    def latent(c: Candidate) -> float:
        return missing if c.r_latent is None else c.r_latent

    for c in candidates:
        c.score = cfg.w_spot * c.r_spot + cfg.w_latent * latent(c) - cfg.w_cost * c.cost
    pool = [c for c in candidates if not not_executed(c.result)] or list(candidates)
    if cfg.w_cost > 0:
        quality = {c.index: cfg.w_spot * c.r_spot + cfg.w_latent * latent(c) for c in pool}
        top = max(quality.values())
        floor = max(c.r_spot for c in pool if quality[c.index] >= top - 1e-9)
        pool = [c for c in pool if c.r_spot >= floor]
    if cfg.tie_break == "reference":
        top = max(c.score for c in pool)
        return min(c.index for c in pool if c.score == top)
    best = max(round(c.score, 9) for c in pool)
    pool = [c for c in pool if round(c.score, 9) == best]
    if cfg.w_cost > 0:
        cheapest = min(round(c.cost, 9) for c in pool)
        pool = [c for c in pool if round(c.cost, 9) == cheapest]
    pool = [c for c in pool if not getattr(c.result, "state_lost", False)] or pool  # the next step needs its state
    pool.sort(key=lambda c: c.index)
    if len(pool) == 1 or cfg.tie_break == "first":
        return pool[0].index
    if cfg.seed is None:
        return random.choice(pool).index
    digest = hashlib.sha256(f"{cfg.seed}|{tie_key}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16)).choice(pool).index

