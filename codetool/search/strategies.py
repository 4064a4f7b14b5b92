"""Search strategies beyond CodeTool's greedy step choice: best-of-N, beam search and lookahead.

CodeTool (Lu et al., ACL 2025, §3) keeps the best of K candidates per step and never looks back
(``search.strategy: greedy``, the default, run by :class:`~codetool.search.search.StepwiseSearch`
itself). For math reasoning, PRM-guided search has been compared at equal compute (Snell et al.
2024, "Scaling LLM test-time compute optimally"; HF search-and-learn: best-of-N weighted by PRM
scores, beam search over steps, lookahead). Here the same strategies run over *code* steps:

- ``best_of_n``: N independent greedy episodes per query; the answer is the episode whose chosen
  steps score best (``search.aggregate``: the last step, the product or the minimum).
- ``beam``: keep the B best partial trajectories (``search.beam_width``); expand each with K
  candidates per step; the B best of all the children stay (a child that ended leaves the beam as
  a finished trajectory and takes one of the B places); stop when no beam is left open. Every
  child runs in its own executor fork, so a kept beam never re-runs a tool call, and the forks of
  dropped children and of expanded parents are closed as soon as the step's pick is made.
- ``lookahead``: greedy, with each candidate scored by a short rollout of depth d
  (``search.lookahead_depth``) through the existing rollout machinery (``latent: rollout``, one
  rollout per candidate, ``search.rollout_temperature`` for its sampling).

Every strategy reuses :func:`~codetool.search.search.expand_each` (sampling + forks), the
on-the-spot reward, the PRM scoring of ``StepwiseSearch`` and :func:`select`'s score. A step's value
is its PRM score (``r_latent``) when one was computed, else its selection score. Each returned
trajectory carries the compute of *all* its episodes/beams (``generated_tokens``,
``prm_scored_tokens``, ``tool_calls``, ``executor_forks``, ``wall_time_s``) and a ``strategy`` dict.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from codetool.resume import unit_seed
from codetool.search.expand import Expanded, Node, expand_each
from codetool.search.prompt import history_entry
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.schedule import stream
from codetool.search.search import (
    SearchTask,
    StepwiseSearch,
    _Episode,
    account,
    count_step,
    select,
)

logger = logging.getLogger(__name__)

Hook = Callable[[Trajectory], None] | None


@dataclass(slots=True)
class Beam:
    """A partial trajectory of :func:`beam_search`: its episode (state, trajectory, history) and
    the values of its chosen steps so far (:func:`step_value`, aggregated by :func:`aggregate`)."""

    episode: _Episode
    values: list[float]


@dataclass(frozen=True, slots=True)
class BeamChild:
    """A candidate continuation of a beam, ranked against every other beam's children.

    Args:
        rank (`tuple`): the sort key, highest first: (aggregated value with this step, its
            R_spot, -parent position, -candidate index), so ties keep earlier beams and samples.
        parent (`int`): position of the parent in the step's live beams.
        expanded (`Expanded`): the executed candidate and its fork.
    """

    rank: tuple[float, float, int, int]
    parent: int
    expanded: Expanded


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


def run_strategy(search: StepwiseSearch, tasks: Iterable[SearchTask], on_done: Hook = None,
                 progress: Hook = None) -> list[Trajectory]:
    """Run ``search.cfg.strategy`` (not ``greedy``) on every task; hooks see each final trajectory."""
    cfg = search.cfg
    done: list[Trajectory] = []

    def finished(traj: Trajectory) -> None:
        traj.serving = traj.serving or search.serving()
        done.append(traj)
        for hook in (on_done, progress):
            if hook:
                hook(traj)

    if cfg.strategy == "lookahead":
        sub_cfg = replace(cfg, strategy="greedy", latent="rollout", rollouts=1,
                          rollout_max_steps=cfg.lookahead_depth, w_latent=cfg.w_latent)
        sub = StepwiseSearch(search.policy, sub_cfg, search.make_executor, scorer=search.scorer,
                             config_hash=search.config_hash)

        def stamp(traj: Trajectory) -> None:
            traj.strategy = {"name": "lookahead", "depth": cfg.lookahead_depth}
            finished(traj)

        sub.run(tasks, on_done=stamp)
        return done
    one = {"best_of_n": best_of_n, "beam": beam_search}[cfg.strategy]
    if search.continuous:  # queries side by side, each with its N episodes or B beams in flight
        width = cfg.n if cfg.strategy == "best_of_n" else cfg.beam_width * cfg.k
        stream(lambda task: one(search, task), tasks, max(1, search.episodes // width), finished)
        return done
    for task in tasks:
        finished(one(search, task))
    return done


def best_of_n(search: StepwiseSearch, task: SearchTask) -> Trajectory:
    """N independent greedy episodes of ``task`` (batched together); returns the best-scored one
    (ties: a finished answer first, then the earlier episode) with the compute of all N."""
    cfg, started = search.cfg, time.perf_counter()
    sub = StepwiseSearch(search.policy, replace(cfg, strategy="greedy", concurrency=max(search.episodes, cfg.n)
                                                if not search.continuous else cfg.n),
                         search.make_executor, scorer=search.scorer, config_hash=search.config_hash)
    subtasks = [replace(task, query_id=f"{task.query_id}#n{j}") for j in range(cfg.n)]
    trajs = sorted(sub.run(subtasks), key=lambda t: int(t.query_id.rsplit("#n", 1)[1]))
    scores = [trajectory_score(t, cfg.aggregate) for t in trajs]
    best = max(range(len(trajs)), key=lambda j: (scores[j], trajs[j].finish_type == "finish", -j))
    out = replace(trajs[best], query_id=task.query_id, generated_tokens=0, prm_scored_tokens=0,
                  tool_calls=0, executor_forks=0)
    for t in trajs:
        account(out, t)
    out.wall_time_s = time.perf_counter() - started
    out.strategy = {"name": "best_of_n", "n": cfg.n, "aggregate": cfg.aggregate, "chosen": best,
                    "scores": [None if math.isinf(s) else round(s, 6) for s in scores],
                    "finish_types": [t.finish_type for t in trajs]}
    return out


def beam_search(search: StepwiseSearch, task: SearchTask) -> Trajectory:
    """Beam search over code steps for one task (see the module docstring); returns the best
    finished beam, with the compute of every beam."""
    cfg, started = search.cfg, time.perf_counter()
    acc = Trajectory(query_id=task.query_id, query=task.query)  # compute of every beam
    root = search._start(task)
    if root.traj.finish_type == "error":
        return _close_out(root, acc, started, [], cfg)
    beams: list[Beam] = [Beam(root, [])]
    completed: list[Beam] = []
    kept_log: list[list[list[int]]] = []
    last_error: _Episode | None = None
    while beams:
        step = len(beams[0].episode.traj.steps)
        seed = None if cfg.seed is None else unit_seed(
            cfg.seed, [(task.benchmark, task.group, task.query_id, step, b) for b in range(len(beams))])
        timings: dict[str, float] = {}
        rows = expand_each(search.policy, [Node(b.episode.state, b.episode.history, b.episode.task) for b in beams],
                           cfg.k, cfg, seed=seed, timings=timings)
        live: list[Beam] = []
        live_rows: list[list[Expanded]] = []
        for beam, row in zip(beams, rows):
            if isinstance(row, Exception):
                last_error = search._fail(beam.episode, row)
                beam.episode.state.close()
                continue
            count_step(acc, row)
            live.append(beam)
            live_rows.append(row)
        before = [b.episode.traj.prm_scored_tokens for b in live]
        t0 = time.perf_counter()
        search._guarded_latent([b.episode for b in live], live_rows)
        timings["scoring"] = time.perf_counter() - t0
        acc.prm_scored_tokens += sum(b.episode.traj.prm_scored_tokens - n for b, n in zip(live, before))
        pool: list[BeamChild] = []
        for phase, seconds in timings.items():
            acc.phase_seconds[phase] = acc.phase_seconds.get(phase, 0.0) + seconds
        for p, (beam, row) in enumerate(zip(live, live_rows)):
            if beam.episode.traj.finish_type == "error":
                last_error = beam.episode
                continue
            select([e.candidate for e in row], cfg, tie_key=f"{task.query_id}|{step}|{p}")  # sets scores
            for e in row:
                if e.candidate.result.host_error:
                    continue
                value = aggregate(beam.values + [step_value(e.candidate)], cfg.aggregate)
                pool.append(BeamChild((value, e.candidate.r_spot, -p, -e.candidate.index), p, e))
        pool.sort(key=lambda c: c.rank, reverse=True)
        room = cfg.beam_width - len(completed)
        kept, dropped = pool[:room], pool[room:]
        for c in dropped:  # dropped children: their sandboxes go at once
            if c.expanded.state is not None:
                c.expanded.state.close()
        kept_log.append([[c.parent, c.expanded.candidate.index] for c in kept])
        beams = []
        for c in kept:
            parent = live[c.parent]
            child, is_open = _child(parent.episode, live_rows[c.parent], c.expanded, cfg.max_steps, acc)
            values = parent.values + [step_value(c.expanded.candidate)]
            if is_open:
                beams.append(Beam(child, values))
            else:
                child.state.close()
                child.state = None
                completed.append(Beam(child, values))
        for beam in live:  # parents: every kept child holds its own fork
            if beam.episode.state is not None:
                beam.episode.state.close()
                beam.episode.state = None
    if not completed:
        return _close_out(last_error or root, acc, started, kept_log, cfg)
    scores = [aggregate(b.values, cfg.aggregate) for b in completed]
    best = max(range(len(completed)),
               key=lambda j: (scores[j], completed[j].episode.traj.finish_type == "finish", -j))
    out = _close_out(completed[best].episode, acc, started, kept_log, cfg)
    out.strategy["scores"] = [round(s, 6) for s in scores]
    out.strategy["chosen"] = best
    return out


def _child(parent: _Episode, row: list[Expanded], pick: Expanded, max_steps: int,
           acc: Trajectory) -> tuple[_Episode, bool]:
    """The beam that continues ``parent`` with ``pick``: a copy of its trajectory plus the step,
    and the pick's executor fork; the flag is True while the beam is still open."""
    cands = [replace(e.candidate, chosen=e is pick) for e in row]
    traj = replace(parent.traj, steps=list(parent.traj.steps), extra=dict(parent.traj.extra))
    traj.steps.append(Step(index=len(traj.steps), candidates=cands, chosen=pick.candidate.index,
                           observation=pick.observation))
    traj.tool_cost += pick.candidate.cost
    traj.prompt_tokens += sum(c.prompt_tokens for c in cands)
    traj.completion_tokens += sum(c.completion_tokens for c in cands)
    traj.isolation = pick.candidate.result.isolation or traj.isolation
    state = pick.state
    if state is None:  # no code ran: the beam continues from the parent's state
        state = parent.state.fork()
        acc.executor_forks += 1
    child = _Episode(parent.task, state, traj, history=parent.history + [
        history_entry(pick.candidate, pick.observation)])
    ended = pick.ended
    if ended == "finish":
        traj.finish_type, traj.final_answer = "finish", str(pick.candidate.result.final_answer)
    elif ended == "give_up":
        traj.finish_type = "give_up"
        traj.extra["give_up_reason"] = pick.candidate.result.give_up_reason
    else:
        traj.finish_type = "max_steps"
        return child, len(traj.steps) < max_steps
    return child, False


def _close_out(ep: _Episode, acc: Trajectory, started: float, kept_log: list, cfg: Any) -> Trajectory:
    """The returned beam trajectory, with the compute of all beams and the strategy record."""
    if ep.state is not None:
        ep.state.close()
        ep.state = None
    traj = ep.traj
    account(traj := replace(traj, generated_tokens=0, prm_scored_tokens=0, tool_calls=0, executor_forks=0), acc)
    traj.phase_seconds = {k: acc.phase_seconds.get(k, 0.0) for k in ("generation", "execution", "scoring")}
    traj.wall_time_s = time.perf_counter() - started
    traj.strategy = {"name": "beam", "beam_width": cfg.beam_width, "k": cfg.k, "aggregate": cfg.aggregate,
                     "kept": kept_log}
    return traj
