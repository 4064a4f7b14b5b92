"""The mechanics every search strategy shares: episodes, their rounds, latent scoring and advancing.

An :class:`Episode` is one query in flight: its executor (the chosen path's state), its trajectory
so far and the history the policy sees. :class:`Episodes` binds the parts (policy, PRM scorer,
executors) to one :class:`~codetool.search.config.SearchConfig` and runs CodeTool's step (Lu et al.,
ACL 2025, §3) for many episodes at once: sample K candidates per episode in one ``generate`` call
(:func:`~codetool.search.expand.expand_each`), score their latent reward (PRM or rollouts) in one
``score`` call, keep the best by :func:`~codetool.search.search.select` and close the other forks.

Isolation: a step none of whose candidates the executor could run (``not_executed``, a failure of
the machine) ends its episode as ``error`` with ``extra["not_executed"]``, which no metric or pass
rate counts, and a candidate that was not executed is left out of the pick (:func:`select`, issue
37). An exception inside one episode ends that episode as ``finish_type='error'`` (secrets
redacted), not the run; a failure of a batched call is retried episode by episode. An error that
is the machine's (``codetool.rewards.machine_failure``: a sandbox that could not start, a server
that failed after every retry, a PRM reply that does not fit the items) and an executor that raised
in a step (``host_error``: no step's code can make it raise, docs/EXECUTOR.md) carry
``extra["not_executed"]`` too.

Throughput: with a local policy :meth:`Episodes.run` keeps ``concurrency`` episodes in batched
rounds; with a remote policy each episode advances on its own as its requests return (continuous
scheduling, :mod:`codetool.search.schedule`). A step's seed comes from its query and step number
either way, so a run is deterministic given the seed.

The strategies (``codetool.search.greedy``, ``best_of_n``, ``beam``, ``lookahead``, ``dvts``,
``compute_optimal``) build on this module through its public names only; the caller picks one
from ``codetool.assemble.STRATEGIES`` and binds it in a :class:`Search`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from codetool.config import ConfigError
from codetool.executor import log_safe
from codetool.executor.result import StepExecutor
from codetool.models.completion import LLMBackend
from codetool.resume import unit_seed
from codetool.rewards import PRMItem, PRMScorer, machine_failure, not_executed, score_items
from codetool.search.config import SearchConfig
from codetool.search.expand import Expanded, Node, check_constraints, expand_each
from codetool.search.prompt import history_entry
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.schedule import (
    is_continuous,
    serving_records,
    stream,
    thread_safe,
    units_in_flight,
)
from codetool.search.search import SearchTask, select
from codetool.search.step import prm_item
from codetool.secrets import redact

logger = logging.getLogger(__name__)

Hook = Callable[[Trajectory], None]


@dataclass(frozen=True)
class SearchParts:
    """What every strategy runs with.

    Args:
        policy (`LLMBackend`): the policy (``codetool.models.backends``).
        make_executor (`Callable[[SearchTask], StepExecutor]`): a fresh executor for a task (with the
            task's tool functions).
        scorer (`PRMScorer`, *optional*): the latent reward source when ``latent='prm'``.
        config_hash (`str`, *optional*): stored in every trajectory.
        admit (`Callable[[int], bool]`, *optional*): under continuous scheduling, whether one
            more query may start beside the number in flight (a memory cap,
            :class:`codetool.memory_use.MemoryGate`); ``None``: as many as the schedule keeps.
        on_step (`Callable[[SearchTask, Trajectory], None]`, *optional*): under continuous
            scheduling, called in a greedy episode's thread with its trajectory after each step it
            chose but the last (e.g. to start what the finished trajectory will need:
            :class:`codetool.search.reference_stepwise.StepwiseReferences`); it must return at once.
    """

    policy: LLMBackend
    make_executor: Callable[[SearchTask], StepExecutor]
    scorer: PRMScorer | None = None
    config_hash: str = ""
    admit: Callable[[int], bool] | None = None
    on_step: Callable[[SearchTask, Trajectory], None] | None = None


Strategy = Callable[[Iterable[SearchTask], SearchParts, SearchConfig, "Hook | None"], list[Trajectory]]
"""Every strategy module's one public function: ``(tasks, parts, cfg, on_done) -> trajectories``;
``on_done`` sees each final trajectory as soon as it is finished."""

RolloutValue = Callable[["Episodes", "Episode", Expanded], "float | None"]
"""A candidate's latent reward from rollouts (``codetool.search.rollout.rollout_value``)."""


def check(parts: SearchParts, cfg: SearchConfig) -> None:
    """Refuse settings the parts cannot run.

    Raises:
        ConfigError: ``latent='prm'`` (or ``rollout_value='prm'``) without a PRM scorer; a
            ``constrain`` mode the policy backend cannot enforce.
    """
    if cfg.latent == "prm" and cfg.w_latent and parts.scorer is None and cfg.strategy != "lookahead":
        raise ConfigError("search.latent is 'prm' but no PRM was given: pass --prm PATH|URL, "
                          "or set search.latent to none or rollout.")
    uses_rollouts = cfg.latent == "rollout" or cfg.strategy == "lookahead"
    if uses_rollouts and cfg.rollout_value == "prm" and parts.scorer is None:
        raise ConfigError("search.rollout_value is 'prm' but no PRM was given: pass --prm PATH|URL, or set "
                          "search.rollout_value to success or auto.")
    check_constraints(parts.policy, cfg)


def in_flight(policy, cfg: SearchConfig) -> int:
    """Episodes kept in flight: ``cfg.concurrency``, else 4 under batched rounds and enough to fill
    a remote policy client twice over under continuous scheduling."""
    return units_in_flight(cfg.concurrency, policy, is_continuous(policy, cfg.schedule), local_default=4,
                           per_unit=cfg.k)


@dataclass(frozen=True)
class Search:
    """A search as the caller composed it: the parts, the settings and the strategy that runs them
    (``codetool.assemble.make_search`` picks it from ``STRATEGIES`` by ``cfg.strategy``).

    Raises:
        ConfigError: see :func:`check`.
    """

    parts: SearchParts
    cfg: SearchConfig
    strategy: Strategy

    def __post_init__(self):
        check(self.parts, self.cfg)

    @property
    def policy(self):
        return self.parts.policy

    @property
    def scorer(self) -> PRMScorer | None:
        return self.parts.scorer

    @property
    def make_executor(self) -> Callable[[SearchTask], StepExecutor]:
        return self.parts.make_executor

    @property
    def config_hash(self) -> str:
        return self.parts.config_hash

    @property
    def episodes(self) -> int:
        """Episodes in flight (:func:`in_flight`)."""
        return in_flight(self.parts.policy, self.cfg)

    def with_executors(self, make_executor: Callable[[SearchTask], StepExecutor]) -> Search:
        """The same search, with executors from ``make_executor`` (a router hands over its forks)."""
        return replace(self, parts=replace(self.parts, make_executor=make_executor))

    def run(self, tasks: Iterable[SearchTask], on_done: Hook | None = None) -> list[Trajectory]:
        """Solve every task with the strategy; ``on_done`` sees each finished trajectory (e.g. to
        append it to a JSONL file) as soon as it is finished."""
        return self.strategy(tasks, self.parts, self.cfg, on_done)

    def solve(self, task: SearchTask) -> Trajectory:
        """Solve one task."""
        return self.run([task])[0]


@dataclass
class Episode:
    """One episode in flight: its task, the executor holding its chosen path's state (``None``
    once closed or when starting it failed), the trajectory so far, the history the policy sees
    and when it started (``time.perf_counter``)."""

    task: SearchTask
    state: StepExecutor | None
    traj: Trajectory
    history: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    @property
    def live_state(self) -> StepExecutor:
        """``state`` of an episode in flight, which has one until it is closed."""
        assert self.state is not None, "the episode is closed"
        return self.state


class Episodes:
    """The episode mechanics of one search: the parts bound to one config.

    Args:
        parts (`SearchParts`): policy, scorer, executors and config hash.
        cfg (`SearchConfig`): the settings the episodes run with.
        rollout (`RolloutValue`, *optional*): the latent reward of a candidate when
            ``cfg.latent == 'rollout'`` (``codetool.search.rollout.rollout_value``).
    Raises:
        ConfigError: see :func:`check`; ``latent='rollout'`` without ``rollout``.
    """

    def __init__(self, parts: SearchParts, cfg: SearchConfig, rollout: RolloutValue | None = None):
        check(parts, cfg)
        if cfg.latent == "rollout" and cfg.w_latent and rollout is None:
            raise ConfigError("search.latent is 'rollout' but this strategy was given no rollout value.")
        self.cfg, self.rollout = cfg, rollout
        self.policy, self.make_executor, self.config_hash = parts.policy, parts.make_executor, parts.config_hash
        self.admit, self.on_step = parts.admit, parts.on_step
        self.continuous = is_continuous(parts.policy, cfg.schedule)
        self.scorer = thread_safe(parts.scorer) if self.continuous else parts.scorer
        self.episodes = units_in_flight(cfg.concurrency, parts.policy, self.continuous, local_default=4,
                                        per_unit=cfg.k)

    @property
    def parts(self) -> SearchParts:
        """The parts, with the scorer as these episodes use it (serialized under continuous
        scheduling): what a strategy hands its sub-searches, so they share one lock."""
        return SearchParts(self.policy, self.make_executor, self.scorer, self.config_hash)

    def run(self, tasks: Iterable[SearchTask], land: Hook) -> None:
        """Greedy episodes of every task, ``episodes`` at a time; ``land`` sees each finished one."""
        if self.continuous:
            stream(self.episode, tasks, self.episodes, land, admit=self.admit)
            return
        pending, active = iter(tasks), list[Episode]()
        rounds = 0
        while True:
            while len(active) < self.episodes:
                task = next(pending, None)
                if task is None:
                    break
                active.append(self.start(task))
            if not active:
                return
            done = self.round(active, rounds)
            rounds += 1
            for ep in done:
                active.remove(ep)
                land(self.finish(ep))

    def episode(self, task: SearchTask) -> Trajectory:
        """One whole episode on its own (continuous scheduling): each step is a round of one."""
        ep = self.start(task)
        while not self.round([ep], len(ep.traj.steps), quiet=True):
            if self.on_step is not None and ep.traj.steps:
                self.on_step(task, ep.traj)
        return self.finish(ep)

    def start(self, task: SearchTask) -> Episode:
        """A new episode of ``task`` with a fresh executor (a failure to start one ends it as an error)."""
        traj = Trajectory(query_id=task.query_id, query=task.query, benchmark=task.benchmark,
                          group=task.group, method=self.cfg.method, config_hash=self.config_hash,
                          available_tools=task.env.describe(), extra=dict(task.extra),
                          phase_seconds={"generation": 0.0, "execution": 0.0, "scoring": 0.0})
        ep = Episode(task, None, traj, history=list(task.history))
        try:
            ep.state = self.make_executor(task)
        except Exception as exc:  # noqa: BLE001 - this episode ends as an error, the run goes on
            fail(ep, exc)
        return ep

    def round(self, active: list[Episode], round_index: int, *, quiet: bool = False) -> list[Episode]:
        """One step for every active episode; returns the episodes that ended (an exception
        inside one episode ends it as ``finish_type='error'``; a failure of the batched policy
        call is retried episode by episode, so only the episodes that still fail end so)."""
        failed = [ep for ep in active if ep.traj.finish_type == "error"]
        active = [ep for ep in active if ep not in failed]
        if not active:
            return failed
        timings: dict[str, float] = {}
        # From the units and their steps, not a round counter that restarts with the process (issue 19).
        seed = None if self.cfg.seed is None else unit_seed(
            self.cfg.seed, [(ep.task.benchmark, ep.task.group, ep.task.query_id, len(ep.traj.steps))
                            for ep in active])
        rows = expand_each(self.policy, [Node(ep.live_state, ep.history, ep.task) for ep in active],
                           self.cfg.k, self.cfg, seed=seed, timings=timings)
        failed += [fail(ep, row) for ep, row in zip(active, rows) if isinstance(row, Exception)]
        active, expansions = ([ep for ep, row in zip(active, rows) if not isinstance(row, Exception)],
                              [row for row in rows if not isinstance(row, Exception)])
        if not active:
            return failed
        t0 = time.perf_counter()
        self.score_latent(active, expansions)
        timings["scoring"] = time.perf_counter() - t0
        ended = []
        for ep, row in zip(active, expansions):
            for phase, seconds in timings.items():  # a shared round's time is split evenly
                ep.traj.phase_seconds[phase] += seconds / len(active)
            if self.advance(ep, row):
                ended.append(ep)
        # A user waits on these rounds (all episodes in flight end together): say what each did.
        (logger.debug if quiet else logger.info)("search round %d: %d episodes, %d candidates; generation %.1f s, execution %.1f s, "
                    "scoring %.1f s; %d ended", round_index + 1, len(active), sum(map(len, expansions)),
                    timings.get("generation", 0.0), timings.get("execution", 0.0), timings["scoring"],
                    len(ended) + len(failed))
        return failed + ended

    def score_latent(self, active: list[Episode], expansions: list[list[Expanded]]) -> None:
        """Set every candidate's latent reward (PRM or rollouts) for the round; if that raises (a
        PRM scorer failure), each episode is scored on its own and the ones that still fail are
        marked as errors."""
        try:
            self._latent(active, expansions)
        except Exception:  # noqa: BLE001 - retried per episode below
            for ep, row in zip(active, expansions):
                try:
                    self._latent([ep], [row])
                except Exception as exc:  # noqa: BLE001 - this episode ends as an error
                    fail(ep, exc)

    def _latent(self, active: list[Episode], expansions: list[list[Expanded]]) -> None:
        if self.cfg.latent == "none" or not self.cfg.w_latent:
            return
        if self.cfg.latent == "rollout":
            assert self.rollout is not None, "latent rollout needs the rollout value (assemble passes it)"
            for ep, row in zip(active, expansions):
                for e in row:
                    e.candidate.r_latent = self.rollout(self, ep, e)
            return
        items, slots, owners = [], [], []
        for ep, row in zip(active, expansions):
            for e in row:
                item = self.prm_item(ep.task, ep.history, e.candidate, e.observation)
                if item is None:  # a reply without code: latent reward 0 (docs/FIDELITY.md)
                    e.candidate.r_latent = 0.0
                    continue
                items.append(item)
                slots.append(e.candidate)
                owners.append(ep)
        if items:
            assert self.scorer is not None, "latent prm needs a scorer (refused earlier without one)"
            for cand, value in zip(slots, score_items(self.scorer, items)):  # one per item, else ScorerFault
                cand.r_latent = value
            for owner, item in zip(owners, items):  # compute accounting
                owner.traj.prm_scored_tokens += prm_tokens(self.scorer, [item])

    def prm_item(self, task: SearchTask, history: list[dict], candidate: Candidate,
                 observation: str) -> PRMItem | None:
        """What the PRM sees of ``candidate`` after ``history`` (the chosen steps before it):
        :func:`codetool.search.step.prm_item`, the item the RL reward scores too (``None`` for a
        reply without code)."""
        return prm_item(task, history, candidate, observation, self.cfg)

    def advance(self, ep: Episode, row: list[Expanded]) -> bool:
        """Select, record the step, keep the chosen fork and close the rest; True when the episode
        ended. An episode that failed this round (executor fault, scorer failure), or whose
        advancing raises, has its candidates' forks closed and ends as an error."""
        fault = next((e.result.host_error for e in row if e.result.host_error), None)
        if fault and ep.traj.finish_type != "error":  # the executor raised: the machine's failure
            fail(ep, fault, machine=True)
        if ep.traj.finish_type != "error":
            try:
                return self._advance(ep, row)
            except Exception as exc:  # noqa: BLE001 - this episode ends as an error
                fail(ep, exc)
        for e in row:
            if e.state is not None and e.state is not ep.state:
                e.state.close()
        return True

    def _advance(self, ep: Episode, row: list[Expanded]) -> bool:
        if row and all(not_executed(e.candidate.result) for e in row):
            return self._not_executed(ep, row)
        cands = [e.candidate for e in row]
        chosen = select(cands, self.cfg, tie_key=f"{ep.task.query_id}|{len(ep.traj.steps)}")
        cands[chosen].chosen = True
        pick = row[chosen]
        for e in row:
            if e is not pick and e.state is not None:
                e.state.close()
        if pick.state is not None:
            ep.live_state.close()
            ep.state = pick.state
        step = Step(index=len(ep.traj.steps), candidates=cands, chosen=chosen, observation=pick.observation)
        ep.traj.steps.append(step)
        ep.traj.tool_cost += pick.candidate.cost
        ep.traj.prompt_tokens += sum(c.prompt_tokens for c in cands)
        ep.traj.completion_tokens += sum(c.completion_tokens for c in cands)
        count_step(ep.traj, row)
        ep.traj.isolation = pick.result.isolation or ep.traj.isolation
        ep.history.append(history_entry(pick.candidate, pick.observation))
        ended = pick.ended
        if ended == "finish":
            ep.traj.finish_type, ep.traj.final_answer = "finish", str(pick.result.final_answer)
        elif ended == "give_up":
            ep.traj.finish_type = "give_up"
            ep.traj.extra["give_up_reason"] = pick.result.give_up_reason
        elif len(ep.traj.steps) >= self.cfg.max_steps:
            ep.traj.finish_type = "max_steps"
        else:
            return False
        return True

    def _not_executed(self, ep: Episode, row: list[Expanded]) -> bool:
        """End ``ep`` when the executor could run none of the step's candidates (a failure of the
        machine, after its retries): there is nothing to choose by and nothing to reject, so no
        step is recorded; the trajectory ends as ``error`` with ``extra["not_executed"]`` (step,
        candidates, attempts), which the metrics and pass rates leave out (``codetool.eval.metrics``)."""
        for e in row:
            if e.state is not None:
                e.state.close()
        cands = [e.candidate for e in row]
        ep.traj.prompt_tokens += sum(c.prompt_tokens for c in cands)
        ep.traj.completion_tokens += sum(c.completion_tokens for c in cands)
        count_step(ep.traj, row)
        attempts = sum(int(getattr(c.result, "attempts", 1) or 1) for c in cands)
        ep.traj.extra["not_executed"] = {"step": len(ep.traj.steps), "candidates": len(cands), "attempts": attempts}
        fail(ep, f"not executed: the executor could not run any of the {len(cands)} candidates of step "
                 f"{len(ep.traj.steps) + 1} ({attempts} attempts; a failure of the machine, not of the code)")
        return True

    def finish(self, ep: Episode) -> Trajectory:
        """Close the episode's executor and return its trajectory, timed and with :meth:`serving`."""
        if ep.state is not None:
            ep.state.close()
        ep.traj.wall_time_s = time.perf_counter() - ep.started
        ep.traj.serving = self.serving()
        return ep.traj

    def serving(self) -> dict[str, Any]:
        """How the remote policy and PRM were used (``serving_record`` of each; empty for local
        models), with the schedule: recorded in every trajectory."""
        record = serving_records(policy=self.policy, prm=getattr(self.scorer, "inner", self.scorer))
        if record:
            record["schedule"] = "continuous" if self.continuous else "rounds"
        return record


def fail(ep: Episode, error: Exception | str, *, machine: bool | None = None) -> Episode:
    """End ``ep`` as ``finish_type='error'`` with the error's message (secrets redacted). When the
    error is the machine's (``machine``, by default ``codetool.rewards.machine_failure(error)``) the
    policy had no fair turn: the trajectory also gets ``extra["not_executed"]`` (step, reason), so
    no rate counts it."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    ep.traj.finish_type, ep.traj.error = "error", redact(text)[:2000]
    if machine_failure(error) if machine is None else machine:
        ep.traj.extra["not_executed"] = {"step": len(ep.traj.steps), "reason": ep.traj.error}
    logger.warning("episode %s ended with an error: %s", ep.task.query_id, log_safe(ep.traj.error, 500))
    return ep


def count_step(traj: Trajectory, row: list[Expanded]) -> None:
    """Compute accounting of one expanded step: generated tokens, tool calls, forks."""
    traj.generated_tokens += sum(e.candidate.completion_tokens for e in row)
    traj.tool_calls += sum(len(e.result.tool_calls) for e in row)
    traj.executor_forks += sum(e.state is not None for e in row)


def account(into: Trajectory, other: Trajectory) -> None:
    """Add ``other``'s compute (a rollout, another episode of a strategy) to ``into``."""
    into.generated_tokens += other.generated_tokens
    into.prm_scored_tokens += other.prm_scored_tokens
    into.tool_calls += other.tool_calls
    into.executor_forks += other.executor_forks


def prm_tokens(scorer, items: list[PRMItem]) -> int:
    """Tokens sent to the PRM: ``scorer.count_tokens(items)`` where the scorer has it, else the
    whitespace words of each item's query, tools, history, candidate and its output."""
    counter = getattr(scorer, "count_tokens", None)
    if callable(counter):
        return int(counter(items))
    total = 0
    for it in items:
        history = " ".join(f"{h.get('code', '')} {h.get('output', '')}" for h in it.history)
        total += len(f"{it.query} {it.tools} {history} {it.candidate} {it.candidate_output}".split())
    return total


def each_query(episodes: Episodes, one: Callable[[SearchTask], Trajectory], tasks: Iterable[SearchTask],
               width: int, on_done: Hook | None = None) -> list[Trajectory]:
    """Run a per-query strategy ``one`` (best-of-N, beam) on every task: one query after another
    under batched rounds (its own episodes share the rounds), side by side under continuous
    scheduling (``episodes.episodes // width`` queries in flight, ``width`` being what one query
    keeps in flight). Each final trajectory gets the search's ``serving`` record if it has none.
    """
    done: list[Trajectory] = []

    def finished(traj: Trajectory) -> None:
        traj.serving = traj.serving or episodes.serving()
        done.append(traj)
        if on_done:
            on_done(traj)

    if episodes.continuous:
        stream(one, tasks, max(1, episodes.episodes // width), finished, admit=episodes.admit)
        return done
    for task in tasks:
        finished(one(task))
    return done
