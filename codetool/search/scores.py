"""A trajectory's score from its chosen steps, as best-of-N and beam search rank them.

A step's value is its PRM score (``r_latent``) when one was computed, else its selection score;
``search.aggregate`` folds a trajectory's step values into one score: the last step's, their
product or their minimum (HF search-and-learn's aggregation of PRM step scores, after Snell et al.
2024).
"""

from __future__ import annotations

import math

from codetool.search.records import Candidate, Trajectory


def step_value(c: Candidate) -> float:
    """A chosen step's value: its PRM score when one was computed, else its selection score."""
    return float(c.r_latent) if c.r_latent is not None else float(c.score)


def aggregate(values: list[float], how: str) -> float:
    """A trajectory's score from its steps' values: ``last``, ``prod`` or ``min`` (-inf if empty).

    Example: ``aggregate([0.5, 0.8], "prod") == 0.4``.
    """
    if not values:
        return -math.inf
    if how == "last":
        return values[-1]
    if how == "min":
        return min(values)
    return math.prod(values)


def trajectory_score(traj: Trajectory, how: str) -> float:
    """:func:`aggregate` over the chosen steps of ``traj`` (-inf for an episode that failed)."""
    if traj.finish_type == "error":
        return -math.inf
    return aggregate([step_value(s.chosen_candidate) for s in traj.steps], how)
