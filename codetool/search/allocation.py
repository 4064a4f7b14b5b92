"""The rule of compute-optimal allocation (``search.strategy: compute_optimal``): difficulty levels,
budget shares and the size of each query's search.

Snell et al. (2024, arXiv 2408.03314, "Scaling LLM test-time compute optimally", §3-5) bin questions
into five levels of *predicted* difficulty (quantiles over the test set of a verifier's scores)
and choose the search per level: best-of-N on easy questions, where beam search over-optimises the
PRM, beam search on medium and hard ones; HF search-and-learn adds DVTS, which beats beam search at
large budgets on easier problems. Giving harder queries a larger share of a fixed total budget
follows Damani et al. (2024, arXiv 2410.04707, input-adaptive allocation), who learn the shares; we
fix them per level. Over code steps, per query:

1. **difficulty** ``d`` in [0, 1]: ``1 - mean value`` of the first step's K candidates (their PRM
   score, else R_spot), or ``1 -`` the decide-first stage's confidence
   (:mod:`codetool.search.compute_optimal` measures it);
2. **level** ``L`` (:func:`difficulty_levels`): the midrank quantile of ``d`` among the run's
   queries, in ``len(level_weights)`` bins (equal difficulties share a level);
3. **strategy** ``level_strategies[L]`` and **weight** ``level_weights[L]`` (non-decreasing);
4. **budget** (:class:`Ledger`): the run's total, ``search.budget x queries`` less what the
   difficulty estimate spent, shared in proportion to the weights; each query's share is computed
   when it starts, from what is left, so tokens that earlier queries did not use go to later ones
   (and an overspend is taken from them);
5. **size** (:func:`sized`): the largest N, B or K whose cost estimate fits the share, the estimate
   being candidates per step x ``max_steps`` x tokens per candidate (the difficulty probe's mean).

Guarantees: with equal spending, a query of a higher level never gets a smaller share than one of
a lower level, and the shares sum to the total. Limits: the budget is planned, not enforced inside
a search: a query spends what its strategy spends, and a query whose share is below its strategy's
smallest size runs at that size (the run's total can then exceed the budget; the trajectories
record every token either way).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from codetool.config import ConfigError, option
from codetool.config_groups import Group

if TYPE_CHECKING:
    from codetool.search.config import SearchConfig

ALLOCATED = ("greedy", "best_of_n", "beam", "dvts", "lookahead")
VOTING = ("best_of_n", "beam", "dvts", "compute_optimal")  # strategies that finish several trajectories
DIFFICULTY = ("auto", "prm", "router")


@dataclass
class BudgetGroup(Group):
    """The settings of ``search.strategy: compute_optimal`` (see the module docstring)."""

    budget: int | None = option(None, "compute_optimal: generated tokens per query on average; the run's total "
                                "(budget x queries) is shared out by estimated difficulty, harder queries getting "
                                "more (Snell et al. 2024; docs/SEARCH.md)")
    difficulty: str = option("auto", "compute_optimal: the difficulty estimate: prm (1 - mean value of the first "
                             "step's k candidates, their PRM score else R_spot; its tokens count against the budget), "
                             "router (1 - the decide-first confidence, with --router) or auto (router where a query "
                             "has it, else prm)", choices=list(DIFFICULTY))
    level_strategies: list[str] = option(default_factory=lambda: ["best_of_n", "best_of_n", "dvts", "beam", "beam"],
                                         help="compute_optimal: the strategy of each difficulty level, easiest first "
                                              "(best_of_n on easy queries, DVTS, then beam search on hard ones)")
    level_weights: list[float] = option(default_factory=lambda: [1.0, 1.5, 2.0, 2.5, 3.0],
                                        help="compute_optimal: budget weight of each difficulty level, easiest "
                                             "first (non-decreasing: a harder query never gets less)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget is not None and self.budget < 1:
            raise ConfigError(f"search.budget must be >= 1 generated token per query (or none), got {self.budget}.")
        if not self.level_strategies or len(self.level_strategies) != len(self.level_weights):
            raise ConfigError(f"search.level_strategies and search.level_weights need one entry per difficulty level "
                              f"each, got {len(self.level_strategies)} and {len(self.level_weights)}.")
        bad = [s for s in self.level_strategies if s not in ALLOCATED]
        if bad:
            raise ConfigError(f"search.level_strategies: {bad[0]!r} is not one of {list(ALLOCATED)}.")
        weights = self.level_weights
        if any(not (w > 0 and math.isfinite(w)) for w in weights) or any(a > b for a, b in zip(weights, weights[1:])):
            raise ConfigError(f"search.level_weights must be positive and non-decreasing (easiest level first), "
                              f"got {weights}.")


def difficulty_levels(difficulties: Sequence[float], levels: int) -> list[int]:
    """The level of each difficulty: ``floor(levels x midrank / n)``, the midrank counting the
    difficulties below plus half of the equal ones (itself included), so equal values share a
    level and the easiest and hardest of a spread set reach the first and last level.

    Example: ``difficulty_levels([0.1, 0.5, 0.9], 5) == [0, 2, 4]``; all equal -> all ``levels // 2``.
    """
    n = len(difficulties)
    out = []
    for d in difficulties:
        below = sum(x < d for x in difficulties)
        equal = sum(x == d for x in difficulties)
        out.append(min(levels - 1, int(levels * (below + equal / 2) / n)))
    return out


@dataclass
class Ledger:
    """Shares of a total token budget, handed out when each query starts (thread-safe).

    A query's share is ``left x weight / pending weight``, where ``left`` is the total less what
    finished queries spent and what running queries hold, and the pending weight sums the weights of
    the queries not started yet (the starting one included). Run one after another (batched rounds),
    every share is re-planned from what was actually spent.

    Args:
        total (`float`): tokens to share.
        weights (`dict[str, float]`): query id -> its weight.
    """

    total: float
    weights: dict[str, float]
    spent: float = 0.0
    held: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, query_id: str) -> float:
        """The share of ``query_id`` (held until :meth:`settle`); at least 0."""
        with self._lock:
            pending = sum(w for q, w in self.weights.items() if q not in self.held)
            left = self.total - self.spent - sum(self.held.values())
            share = max(0.0, left) * self.weights[query_id] / pending
            self.held[query_id] = share
            return share

    def settle(self, query_id: str, spent: float) -> None:
        """Record what ``query_id`` spent; its held share is released."""
        with self._lock:
            self.held[query_id] = 0.0
            self.spent += spent


def candidates_per_step(strategy: str, size: int, cfg: SearchConfig) -> int:
    """Candidates ``strategy`` samples per step at ``size`` (N, B or K), rollout steps included."""
    if strategy == "greedy":
        return size
    if strategy == "lookahead":
        return size * (1 + cfg.lookahead_depth)
    return size * cfg.k  # best_of_n: N episodes, beam: B beams, dvts: N paths; each k candidates


def sized(cfg: SearchConfig, strategy: str, budget: float, tokens_per_candidate: float) -> tuple[SearchConfig, int]:
    """The settings of ``strategy`` for one query with ``budget`` tokens: the largest size whose
    estimate (:func:`candidates_per_step` x ``max_steps`` x ``tokens_per_candidate``) fits, at least
    the smallest (N = 1, B = 1, K = 1; DVTS: one subtree of ``beam_width``).

    Returns:
        The query's :class:`SearchConfig` (``strategy`` and its size set) and the size.
    """
    per_size = candidates_per_step(strategy, 1, cfg) * cfg.max_steps * max(tokens_per_candidate, 1.0)
    size = max(1, int(budget // per_size))
    # One trajectory (greedy, lookahead) has nothing to vote over; the budget belongs to the caller.
    common = {"strategy": strategy, "budget": None, "vote": cfg.vote if strategy in VOTING else "none"}
    if strategy in ("greedy", "lookahead"):
        return replace(cfg, k=size, **common), size
    if strategy == "best_of_n":
        return replace(cfg, n=size, **common), size
    if strategy == "beam":
        return replace(cfg, beam_width=size, **common), size
    width = min(cfg.beam_width, size)  # dvts: whole subtrees of beam_width paths
    size = max(width, size // width * width)
    return replace(cfg, n=size, beam_width=width, **common), size
