"""Beam search over code steps (``search.strategy: beam``).

For math reasoning, PRM-guided search has been compared at equal compute (Snell et al. 2024,
"Scaling LLM test-time compute optimally"; HF search-and-learn's beam search over steps). Here it
runs over *code* steps: keep the B best partial trajectories (``search.beam_width``); expand each
with K candidates per step; the B best of all the children stay (a child that ended leaves the
beam as a finished trajectory and takes one of the B places); stop when no beam is left open.
Every child runs in its own executor fork, so a kept beam never re-runs a tool call, and the forks
of dropped children and of expanded parents are closed as soon as the step's pick is made.

A step's value is its PRM score (``r_latent``) when one was computed, else its selection score
(:func:`~codetool.search.scores.step_value`); a beam's score aggregates them
(``search.aggregate``). The returned trajectory carries the compute of *every* beam
(``generated_tokens``, ``prm_scored_tokens``, ``tool_calls``, ``executor_forks``, ``wall_time_s``)
and a ``strategy`` dict.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from codetool.resume import unit_seed
from codetool.rewards import not_executed
from codetool.search.config import SearchConfig
from codetool.search.episode import (
    Episode,
    Episodes,
    Hook,
    SearchParts,
    account,
    count_step,
    each_query,
    fail,
)
from codetool.search.expand import Expanded, Node, expand_each
from codetool.search.prompt import history_entry
from codetool.search.records import Step, Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.scores import aggregate, step_value
from codetool.search.search import SearchTask, select


@dataclass(slots=True)
class Beam:
    """A partial trajectory of :func:`beam_search`: its episode (state, trajectory, history) and
    the values of its chosen steps so far (:func:`~codetool.search.scores.step_value`, aggregated by
    :func:`~codetool.search.scores.aggregate`)."""

    episode: Episode
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


def beam_search(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
                on_done: Hook | None = None) -> list[Trajectory]:
    """Beam search for every task (see the module docstring): the best finished beam of each,
    with the compute of every beam. Under continuous scheduling queries run side by side, each with
    its B x K children in flight; ``on_done`` sees each final trajectory.

    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    return each_query(episodes, lambda task: _beam(episodes, task), tasks, cfg.beam_width * cfg.k, on_done)


def _beam(search: Episodes, task: SearchTask) -> Trajectory:
    """The best finished beam of one task, with the compute of every beam."""
    cfg, started = search.cfg, time.perf_counter()
    acc = Trajectory(query_id=task.query_id, query=task.query)  # compute of every beam
    root = search.start(task)
    if root.traj.finish_type == "error":
        return _close_out(root, acc, started, [], cfg)
    beams: list[Beam] = [Beam(root, [])]
    completed: list[Beam] = []
    kept_log: list[list[list[int]]] = []
    last_error: Episode | None = None
    while beams:
        step = len(beams[0].episode.traj.steps)
        seed = None if cfg.seed is None else unit_seed(
            cfg.seed, [(task.benchmark, task.group, task.query_id, step, b) for b in range(len(beams))])
        timings: dict[str, float] = {}
        rows = expand_each(search.policy, [Node(b.episode.live_state, b.episode.history, b.episode.task) for b in beams],
                           cfg.k, cfg, seed=seed, timings=timings)
        live: list[Beam] = []
        live_rows: list[list[Expanded]] = []
        for beam, row in zip(beams, rows):
            if isinstance(row, Exception):
                last_error = fail(beam.episode, row)
                beam.episode.live_state.close()
                continue
            count_step(acc, row)
            live.append(beam)
            live_rows.append(row)
        before = [b.episode.traj.prm_scored_tokens for b in live]
        t0 = time.perf_counter()
        search.score_latent([b.episode for b in live], live_rows)
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
                if e.result.host_error or not_executed(e.result):
                    continue  # a fault of the host, or a run the machine could not make: no child
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
                child.live_state.close()
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


def _child(parent: Episode, row: list[Expanded], pick: Expanded, max_steps: int,
           acc: Trajectory) -> tuple[Episode, bool]:
    """The beam that continues ``parent`` with ``pick``: a copy of its trajectory plus the step,
    and the pick's executor fork; the flag is True while the beam is still open."""
    cands = [replace(e.candidate, chosen=e is pick) for e in row]
    traj = replace(parent.traj, steps=list(parent.traj.steps), extra=dict(parent.traj.extra))
    traj.steps.append(Step(index=len(traj.steps), candidates=cands, chosen=pick.candidate.index,
                           observation=pick.observation))
    traj.tool_cost += pick.candidate.cost
    traj.prompt_tokens += sum(c.prompt_tokens for c in cands)
    traj.completion_tokens += sum(c.completion_tokens for c in cands)
    traj.isolation = pick.result.isolation or traj.isolation
    state = pick.state
    if state is None:  # no code ran: the beam continues from the parent's state
        state = parent.live_state.fork()
        acc.executor_forks += 1
    child = Episode(parent.task, state, traj, history=parent.history + [
        history_entry(pick.candidate, pick.observation)])
    ended = pick.ended
    if ended == "finish":
        traj.finish_type, traj.final_answer = "finish", str(pick.result.final_answer)
    elif ended == "give_up":
        traj.finish_type = "give_up"
        traj.extra["give_up_reason"] = pick.result.give_up_reason
    else:
        traj.finish_type = "max_steps"
        return child, len(traj.steps) < max_steps
    return child, False


def _close_out(ep: Episode, acc: Trajectory, started: float, kept_log: list, cfg: SearchConfig) -> Trajectory:
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
