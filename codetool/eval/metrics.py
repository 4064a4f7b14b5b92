"""Judge-free metrics of a run, computed on every trajectory file.

- **SCEP** (successful code execution percentage, CodeTool paper §4): among the *chosen*
  (recorded) steps that carried code, the share whose code ran without an error
  (``result["ok"]``). This is the paper's measure: it sees what the selection rule did (the
  paper's ablation without the on-the-spot reward loses 17.4 points of it).
  ``scep_all_candidates`` is the same share over every sampled candidate with code, chosen or not
  (it mostly measures the policy's sampling, not the selection); ``scep_chosen`` is kept as an
  alias of ``scep`` for older readers. Candidates without code (no code block, or runs imported
  from StableToolBench) are not executed steps; each share is ``None`` when there are none.
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
        scep (`float` or `None`): share in [0, 1] of chosen steps with code whose code ran (the paper's).
        scep_chosen (`float` or `None`): the same number as ``scep`` (older name).
        executed_candidates (`int`): every candidate with code (``scep_all_candidates``' denominator).
        scep_all_candidates (`float` or `None`): share of every candidate with code that ran.
        executed_chosen (`int`): chosen steps with code (SCEP's denominator).
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
    scep_all_candidates: float | None = None
    executed_chosen: int = 0
    answer_sources: dict[str, int] = field(default_factory=dict)


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
                ok = bool(cand.result is not None and cand.result.ok)
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
        scep=ran_chosen / executed_chosen if executed_chosen else None,
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
        scep_all_candidates=ran / executed if executed else None,
        executed_chosen=executed_chosen,
        answer_sources=dict(Counter(answer_source(t) for t in trajs)),
    )


def answer_source(traj: Trajectory) -> str:
    """Where ``traj``'s final answer came from: ``finish`` (the policy's ``finish()`` call),
    ``generated`` (written after the search from the execution log, see
    :mod:`codetool.search.answer`) or ``none`` (no answer)."""
    source = (traj.extra or {}).get("answer_source")
    if source:
        return str(source)
    return "finish" if traj.finish_type == "finish" and (traj.final_answer or "").strip() else "none"


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
