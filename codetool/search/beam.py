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
and a ``strategy`` dict. The answer is the best-scored finished beam, or the vote of all finished
beams (``search.vote``, :mod:`codetool.search.vote`).

:func:`grow` runs several independent beam searches of one query side by side: one is beam search,
several are DVTS (:mod:`codetool.search.dvts`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

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
from codetool.search.vote import finished_record, vote


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
    return grow(search, task, subtrees=1)


@dataclass(slots=True)
class Subtree:
    """One independent beam search of :func:`grow`: its open beams, its finished ones and which
    children it kept at each step (``[parent position, candidate index]``)."""

    beams: list[Beam]
    completed: list[Beam] = field(default_factory=list)
    kept: list[list[list[int]]] = field(default_factory=list)


def grow(search: Episodes, task: SearchTask, subtrees: int, name: str = "beam") -> Trajectory:
    """``subtrees`` independent beam searches of ``task``, each keeping ``search.cfg.beam_width``
    beams, stepped together (one ``generate`` and one PRM call per step for all of them); the
    answer is the best-scored (or voted, ``search.vote``) of every subtree's finished beams, with
    the compute of all. One subtree is beam search; several are DVTS (:mod:`codetool.search.dvts`),
    whose first step samples ``subtrees x k`` candidates of the root in one request and deals them
    out, k to each subtree (one request, so a backend that seeds per request still draws distinct
    samples for identical prompts)."""
    cfg, started = search.cfg, time.perf_counter()
    acc = Trajectory(query_id=task.query_id, query=task.query)  # compute of every beam
    root = search.start(task)
    if root.traj.finish_type == "error":
        return _close_out(root, acc, started, [], cfg, name)
    trees = [Subtree([Beam(root, [])]) for _ in range(subtrees)]
    last_error: Episode | None = None
    while any(t.beams for t in trees):
        beams = [(t, b) for t in trees for b in t.beams]
        step = len(beams[0][1].episode.traj.steps)
        seed = None if cfg.seed is None else unit_seed(
            cfg.seed, [(task.benchmark, task.group, task.query_id, step, b) for b in range(len(beams))])
        timings: dict[str, float] = {}
        rows: list[list[Expanded] | Exception]
        if subtrees > 1 and step == 0:  # every subtree starts at the root: one request, dealt out
            [at_root] = expand_each(search.policy, [Node(root.live_state, root.history, root.task)],
                                    cfg.k * subtrees, cfg, seed=seed, timings=timings)
            if isinstance(at_root, Exception):
                rows = [at_root] * subtrees
            else:
                rows = [_deal(at_root, i, cfg.k) for i in range(subtrees)]
        else:
            rows = expand_each(search.policy,
                               [Node(b.episode.live_state, b.episode.history, b.episode.task) for _, b in beams],
                               cfg.k, cfg, seed=seed, timings=timings)
        live: list[tuple[Subtree, Beam]] = []
        live_rows: list[list[Expanded]] = []
        for (tree, beam), row in zip(beams, rows):
            if isinstance(row, Exception):
                last_error = _standing(last_error, fail(beam.episode, row))
                _close(beam.episode)
                continue
            count_step(acc, row)
            live.append((tree, beam))
            live_rows.append(row)
        parents = list({id(b.episode): b.episode for _, b in live}.values())  # the root is shared at first
        before = [ep.traj.prm_scored_tokens for ep in parents]
        t0 = time.perf_counter()
        search.score_latent([b.episode for _, b in live], live_rows)
        timings["scoring"] = time.perf_counter() - t0
        acc.prm_scored_tokens += sum(ep.traj.prm_scored_tokens - n for ep, n in zip(parents, before))
        for phase, seconds in timings.items():
            acc.phase_seconds[phase] = acc.phase_seconds.get(phase, 0.0) + seconds
        for tree in trees:
            if tree.beams:
                mine = [(beam, row) for (t, beam), row in zip(live, live_rows) if t is tree]
                last_error = _standing(last_error, _step(tree, mine, task, step, cfg, acc))
        for ep in parents:  # every kept child holds its own fork
            _close(ep)
    completed = [b for t in trees for b in t.completed]
    kept = [t.kept for t in trees]
    if not completed:
        return _close_out(last_error or root, acc, started, kept, cfg, name)
    trajs = [b.episode.traj for b in completed]
    scores = [aggregate(b.values, cfg.aggregate) for b in completed]
    ballot = vote(trajs, scores, cfg.vote)
    out = _close_out(completed[ballot.chosen].episode, acc, started, kept, cfg, name)
    out.strategy["scores"] = [round(s, 6) for s in scores]
    out.strategy["chosen"] = ballot.chosen
    out.strategy["finished"] = [finished_record(t, sc) for t, sc in zip(trajs, scores)]
    if name == "dvts":
        out.strategy["subtree_of"] = [i for i, t in enumerate(trees) for _ in t.completed]
    out.strategy.update(ballot.record(cfg.vote))
    return out


def _deal(row: list[Expanded], i: int, k: int) -> list[Expanded]:
    """Subtree ``i``'s share of the root's candidates: ``row[i*k:(i+1)*k]``, numbered from 0."""
    mine = row[i * k:(i + 1) * k]
    for j, e in enumerate(mine):
        e.candidate.index = j
    return mine


def _step(tree: Subtree, mine: list[tuple[Beam, list[Expanded]]], task: SearchTask, step: int, cfg: SearchConfig,
          acc: Trajectory) -> Episode | None:
    """Keep the best children of ``tree``'s beams (``mine``: each live beam and its expanded row),
    close the others' sandboxes and the parents'; returns the last episode that failed, if any."""
    last_error = None
    pool: list[BeamChild] = []
    for p, (beam, row) in enumerate(mine):
        if beam.episode.traj.finish_type == "error":
            last_error = _standing(last_error, beam.episode)
            continue
        select([e.candidate for e in row], cfg, tie_key=f"{task.query_id}|{step}|{p}")  # sets scores
        for e in row:
            if e.result.host_error or not_executed(e.result):
                continue  # a fault of the host, or a run the machine could not make: no child
            value = aggregate(beam.values + [step_value(e.candidate)], cfg.aggregate)
            pool.append(BeamChild((value, e.candidate.r_spot, -p, -e.candidate.index), p, e))
    pool.sort(key=lambda c: c.rank, reverse=True)
    room = cfg.beam_width - len(tree.completed)
    kept, dropped = pool[:room], pool[room:]
    for c in dropped:  # dropped children: their sandboxes go at once
        if c.expanded.state is not None:
            c.expanded.state.close()
    tree.kept.append([[c.parent, c.expanded.candidate.index] for c in kept])
    tree.beams = []
    for c in kept:
        parent, row = mine[c.parent]
        child, is_open = _child(parent.episode, row, c.expanded, cfg.max_steps, acc)
        values = parent.values + [step_value(c.expanded.candidate)]
        if is_open:
            tree.beams.append(Beam(child, values))
        else:
            _close(child)
            tree.completed.append(Beam(child, values))
    return last_error


def _standing(kept: Episode | None, new: Episode | None) -> Episode | None:
    """Which of two failed episodes stands for a query none of whose beams completed: the later one,
    except that a failure the policy is answerable for is never replaced by one of the machine
    (``extra["not_executed"]``, which no rate counts): which beam failed last must not decide
    whether the query counts."""
    if new is None or kept is None:
        return new or kept
    machine = bool(new.traj.extra.get("not_executed")) and not kept.traj.extra.get("not_executed")
    return kept if machine else new


def _close(ep: Episode) -> None:
    if ep.state is not None:
        ep.state.close()
        ep.state = None


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


def _close_out(ep: Episode, acc: Trajectory, started: float, kept_log: list, cfg: SearchConfig,
               name: str) -> Trajectory:
    """The returned beam trajectory, with the compute of all beams and the strategy record
    (``kept``: one subtree's log for beam search, every subtree's for DVTS)."""
    _close(ep)
    traj = ep.traj
    account(traj := replace(traj, generated_tokens=0, prm_scored_tokens=0, tool_calls=0, executor_forks=0), acc)
    traj.phase_seconds = {k: acc.phase_seconds.get(k, 0.0) for k in ("generation", "execution", "scoring")}
    traj.wall_time_s = time.perf_counter() - started
    traj.strategy = {"name": name, "beam_width": cfg.beam_width, "k": cfg.k, "aggregate": cfg.aggregate,
                     "kept": kept_log[0] if name == "beam" and kept_log else kept_log}
    if name == "dvts":
        traj.strategy.update(n=cfg.n, subtrees=cfg.n // cfg.beam_width)
    return traj
