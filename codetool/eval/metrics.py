"""Judge-free metrics of a run, computed on every trajectory file.

- **SCEP** (successful code execution percentage, CodeTool paper §4), as the public code counts
  it (``eval/eval_SCEP.py`` over the search's ``exec_res``): every *chosen* step counts, and it
  succeeded when its reference status is 0 (``traj.extra["reference_steps"]``, written after the
  search by :mod:`codetool.search.reference`: the step re-run after the earlier steps' first code
  blocks with their prints stripped; a reply without a ```` ```python ```` block, a bare fence
  included, is a failed step; a printed ``Function executing from`` is a failure). Pooled over
  the trajectories that have reference statuses; ``None`` when none has (runs imported from
  StableToolBench, or ``search.reference_steps: false``).
- ``scep_code_steps`` (ours): among the chosen steps that carried code (our parser, bare fences
  included), the share whose own run in the search succeeded (``result.ok``); code-less steps
  are left out. ``scep_chosen`` is its older name. ``scep_all_candidates`` is the same share over
  every sampled candidate with code, chosen or not (it mostly measures the policy's sampling).
  Each is ``None`` when there are no such steps.
- Mean steps per query; tokens in / out per query (``prompt_tokens`` / ``completion_tokens``, all
  generations of the episode); seconds per query (``wall_time_s``) and per phase
  (``phase_seconds``, where present); mean tool cost per query (``tool_cost``, LIT); counts of how
  episodes ended (finish / give_up / max_steps / error).
- The rewards of chosen vs rejected candidates (for plots): the selection score of every
  candidate of a step that had more than one.
- :func:`bootstrap_mean`: a per-query metric's mean with a percentile bootstrap interval over the
  queries (the comparison of search strategies, ``benchmarks/compare_strategies.py``).
- Not executed (issue 37): a candidate the executor could not run (``codetool.rewards.not_executed``,
  a failure of the machine after its retries) is left out of every SCEP's numerator and
  denominator and of the candidate rewards, and counted (``not_executed_candidates``); so is a
  reference re-run that could not run (status ``None``); an episode that ended because no candidate
  of a step ran (:func:`not_executed_trajectory`) is counted (``not_executed_trajectories``), and
  the pass rates of ``codetool.eval.stabletoolbench`` leave it out.

Nothing here calls a model; the numbers are exact for the records given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from codetool.rewards import not_executed
from codetool.search.records import FINISH_TYPES, Trajectory


@dataclass
class RunMetrics:
    """Judge-free metrics over ``n`` trajectories (means are per query).

    Args:
        n (`int`): trajectories.
        scep (`float` or `None`): the public code's SCEP in [0, 1]: chosen steps with reference
            status 0 over all chosen steps with a reference status (``reference_steps``).
        scep_chosen (`float` or `None`): the same number as ``scep_code_steps`` (older name).
        scep_code_steps (`float` or `None`): ours: chosen steps with code whose own run succeeded.
        reference_steps (`int`), reference_successful (`int`): SCEP's denominator and numerator.
        not_executed_candidates (`int`): candidates the executor could not run (left out above).
        not_executed_trajectories (`int`): episodes ended because no candidate of a step ran.
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
    scep_code_steps: float | None = None
    reference_steps: int = 0
    reference_successful: int = 0
    not_executed_candidates: int = 0
    not_executed_trajectories: int = 0


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def run_metrics(trajs: Sequence[Trajectory]) -> RunMetrics:
    """:class:`RunMetrics` of ``trajs`` (zeros for an empty list)."""
    ran = executed = ran_chosen = executed_chosen = lost = 0
    recorded, successful = reference_counts(trajs)
    phases: dict[str, list[float]] = {}
    for traj in trajs:
        for step in traj.steps:
            for j, cand in enumerate(step.candidates):
                if cand.code is None:
                    continue
                if not_executed(cand.result):  # the machine's failure: no information on the code
                    lost += 1
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
    ours = ran_chosen / executed_chosen if executed_chosen else None
    return RunMetrics(
        n=len(trajs),
        scep=successful / recorded if recorded else None,
        scep_chosen=ours,
        scep_code_steps=ours,
        reference_steps=recorded,
        reference_successful=successful,
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
        not_executed_candidates=lost,
        not_executed_trajectories=sum(not_executed_trajectory(t) for t in trajs),
    )


def not_executed_trajectory(traj: Trajectory) -> bool:
    """Whether ``traj`` ended because the executor could run none of a step's candidates (the search
    records ``extra["not_executed"]``, ``codetool.search.episode``): it says nothing about the policy."""
    return traj.finish_type == "error" and bool((traj.extra or {}).get("not_executed"))


def reference_counts(trajs: Sequence[Trajectory]) -> tuple[int, int]:
    """``(recorded, successful)``: the chosen steps with a reference status and those with status 0
    (``eval_SCEP.py``'s two sums), over the trajectories that have ``extra["reference_steps"]``."""
    recorded = successful = 0
    for traj in trajs:
        steps = (traj.extra or {}).get("reference_steps")
        if not steps:
            continue
        ran = [s for s in steps if s.get("status", 1) is not None]  # None: the re-run was not executed
        recorded += len(ran)
        successful += sum(1 for s in ran if int(s.get("status", 1)) == 0)
    return recorded, successful


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
    step with more than one candidate; ``None`` values (e.g. no latent reward) and candidates that
    were not executed are skipped."""
    chosen: list[float] = []
    rejected: list[float] = []
    for traj in trajs:
        for step in traj.steps:
            if len(step.candidates) < 2:
                continue
            for j, cand in enumerate(step.candidates):
                value = getattr(cand, key)
                if value is None or not_executed(cand.result):
                    continue
                (chosen if j == step.chosen else rejected).append(float(value))
    return chosen, rejected


def bootstrap_mean(values: Sequence[float], *, samples: int = 1000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float] | None:
    """The mean of a per-query metric and its percentile bootstrap interval, resampling the queries
    with replacement (numpy ``default_rng(seed)``), as ``codetool.prm.evaluate.bootstrap_pairwise``
    resamples sibling groups.

    Args:
        values (`Sequence[float]`): (queries,) one value per query (e.g. 0/1 solved, a path fraction).
        samples (`int`, *optional*, defaults to 1000): resamples.
        level (`float`, *optional*, defaults to 0.95): the interval's coverage.
    Returns:
        ``(mean, low, high)``, or ``None`` without values; one value gives a zero-width interval.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    pick = np.random.default_rng(seed).integers(0, data.size, size=(samples, data.size))
    low, high = np.quantile(data[pick].mean(axis=1), [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(data.mean()), float(low), float(high)
