"""Judge-free metrics of a run, computed on every trajectory file.

- **SCEP** (successful code execution percentage, CodeTool paper): among all executed candidate
  steps (every candidate with a code block, chosen or not), the share whose code ran without an
  error (``result["ok"]``). ``scep_chosen`` is the same over chosen steps only. Candidates without
  code (no code block, or runs imported from StableToolBench) are not executed steps; SCEP is
  ``None`` when there are none.
- Mean steps per query; tokens in / out per query (``prompt_tokens`` / ``completion_tokens``, all
  generations of the episode); seconds per query (``wall_time_s``) and per phase
  (``phase_seconds``, where present); mean tool cost per query (``tool_cost``, LIT); counts of how
  episodes ended (finish / give_up / max_steps / error).
- The rewards of chosen vs rejected candidates (for plots): the selection score of every
  candidate of a step that had more than one.

Nothing here calls a model; the numbers are exact for the records given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from codetool.search.records import FINISH_TYPES, Trajectory


@dataclass
class RunMetrics:
    """Judge-free metrics over ``n`` trajectories (means are per query).

    Args:
        n (`int`): trajectories.
        scep (`float` or `None`): share in [0, 1] of executed candidates whose code ran.
        scep_chosen (`float` or `None`): the same over chosen candidates.
        executed_candidates (`int`): candidates with code (SCEP's denominator).
        mean_steps (`float`): steps per query.
        mean_prompt_tokens, mean_completion_tokens (`float`): tokens in / out per query.
        mean_seconds (`float`): wall seconds per query.
        mean_tool_cost (`float`): LIT tool cost per query.
        finish_types (`dict[str, int]`): episodes by how they ended.
        phase_seconds (`dict[str, float]`): mean seconds per query for each phase recorded.
        mean_tool_calls (`float`): executed tool calls (chosen path) per query.
    """

    n: int
    scep: float | None
    scep_chosen: float | None
    executed_candidates: int
    mean_steps: float
    mean_prompt_tokens: float
    mean_completion_tokens: float
    mean_seconds: float
    mean_tool_cost: float
    finish_types: dict[str, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    mean_tool_calls: float = 0.0


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def run_metrics(trajs: Sequence[Trajectory]) -> RunMetrics:
    """:class:`RunMetrics` of ``trajs`` (zeros for an empty list)."""
    ran = executed = ran_chosen = executed_chosen = 0
    phases: dict[str, list[float]] = {}
    for traj in trajs:
        for step in traj.steps:
            for j, cand in enumerate(step.candidates):
                if cand.code is None:
                    continue
                ok = bool(cand.result.get("ok"))
                executed += 1
                ran += ok
                if j == step.chosen:
                    executed_chosen += 1
                    ran_chosen += ok
        for phase, seconds in (traj.phase_seconds or {}).items():
            phases.setdefault(phase, []).append(float(seconds))
    finish = Counter(t.finish_type for t in trajs)
    return RunMetrics(
        n=len(trajs),
        scep=ran / executed if executed else None,
        scep_chosen=ran_chosen / executed_chosen if executed_chosen else None,
        executed_candidates=executed,
        mean_steps=_mean([len(t.steps) for t in trajs]),
        mean_prompt_tokens=_mean([t.prompt_tokens for t in trajs]),
        mean_completion_tokens=_mean([t.completion_tokens for t in trajs]),
        mean_seconds=_mean([t.wall_time_s for t in trajs]),
        mean_tool_cost=_mean([t.tool_cost for t in trajs]),
        finish_types={k: finish.get(k, 0) for k in FINISH_TYPES},
        phase_seconds={k: _mean(v) for k, v in phases.items()},
        mean_tool_calls=_mean([len(t.executed_calls()) for t in trajs]),
    )


def candidate_rewards(trajs: Sequence[Trajectory], key: str = "score") -> tuple[list[float], list[float]]:
    """``(chosen, rejected)`` values of ``key`` (``score``, ``r_spot`` or ``r_latent``) over every
    step with more than one candidate; ``None`` values (e.g. no latent reward) are skipped."""
    chosen, rejected = [], []
    for traj in trajs:
        for step in traj.steps:
            if len(step.candidates) < 2:
                continue
            for j, cand in enumerate(step.candidates):
                value = getattr(cand, key)
                if value is None:
                    continue
                (chosen if j == step.chosen else rejected).append(float(value))
    return chosen, rejected
