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
4. **budget** (:func:`budget_shares`): the run's total, ``search.budget x queries`` less what the
   difficulty estimate spent, shared in proportion to the weights, all shares fixed before any
   search starts (so a run does not depend on the order in which queries finish, and a harder
   query never gets less than an easier one);
5. **size** (:func:`codetool.search.compute_optimal.sized`): the largest N, B or K whose cost
   estimate fits the share: the candidates it samples if every path runs ``max_steps`` (beam
   search and DVTS expand only their roots on the first step) x tokens per candidate (the
   difficulty probe's mean; ``max_new_tokens`` when nothing was sampled).

Guarantees: a query of a higher level never gets a smaller share than one of a lower level, and
the shares sum to the total; the one exception is a query whose strategy cannot use its share (a
beam search cannot keep more than ``k^s`` beams after ``s`` steps): it keeps what it can use and
the rest goes to the other queries by weight (:func:`codetool.search.compute_optimal.plan`). Limits: the budget is planned, not enforced inside a search: a query
spends what its strategy spends (sizes are rounded down, and episodes that end before
``max_steps`` spend less than planned; tokens a query leaves unused while it runs are not handed
to others), and
a query whose share is below its strategy's smallest size runs at that size (the run's total can
then exceed the budget). The trajectories record every token either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from codetool.config import ConfigError, option
from codetool.config_groups import Group

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


def budget_shares(levels: Sequence[int], weights: Sequence[float], total: float) -> list[float]:
    """Each query's share of ``total`` tokens: ``total x weights[level] / sum of the queries' weights``.

    Args:
        levels (`Sequence[int]`): (queries,) each query's difficulty level.
        weights (`Sequence[float]`): (levels,) non-decreasing weight per level.
        total (`float`): tokens to share (at least 0 is shared).
    Returns:
        (queries,) shares in tokens; they sum to ``max(total, 0)``, and a query of a higher level
        never gets less than one of a lower level.

    Example: ``budget_shares([0, 2, 4], [1, 1.5, 2, 2.5, 3], 600) == [100.0, 200.0, 300.0]``.
    """
    mass = sum(weights[lv] for lv in levels)
    return [max(total, 0.0) * weights[lv] / mass for lv in levels]
