"""Stepwise code search: the CodeTool inference loop (Lu et al., ACL 2025, §3).

Per step, the policy samples K candidate snippets (one ``generate`` call with ``n=K``); each runs
in a ``fork()`` of the episode's executor, so no earlier step or tool call is repeated; each gets
the on-the-spot reward, a latent reward (PRM, rollouts, or none) and a LIT tool cost; the
candidate with the best ``w_spot*R_spot + w_latent*R_latent - w_cost*cost`` becomes the new state
and the other forks are closed. Fair selection (see :func:`select`): the cost term never overturns
an on-the-spot difference; with ``w_cost > 0`` equally good candidates go to the cheapest (LIT's
cheapest correct plan); remaining ties go to a seeded random pick (the reference ablation), so a
run is deterministic given the samples and the seed.

Throughput: batch-1 decoding leaves a CPU or GPU idle, so :class:`StepwiseSearch` keeps
``concurrency`` episodes in flight. With a local policy it sends the prompts of all of them in
one ``generate`` call per round, and all their candidates to the PRM in one ``score`` call; with
a remote policy each episode advances on its own as its requests return (continuous scheduling,
:mod:`codetool.search.schedule`). A step's seed comes from its query and step number either way.

:func:`codetool.search.expand.expand` (sample + execute in forks) is shared with the tree builder (``codetool.tree``).
Limits: executions inside a round run one after another (the policy dominates the time on CPU);
an exception inside one episode ends that episode as ``finish_type='error'``, not the run.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from codetool.config import ConfigError, option
from codetool.executor.channel import log_safe
from codetool.resume import unit_seed
from codetool.rewards import (
    PRMItem,
    PRMScorer,
)
from codetool.search.expand import Expanded, Node, check_constraints, expand_each
from codetool.search.prompt import (
    OBSERVATION_HISTORIES,
    STEP_FORMATS,
    history_entry,
    reference_prm_fields,
    step_plan,
    visible_history,
)
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.schedule import (
    SCHEDULES,
    is_continuous,
    serving_records,
    stream,
    thread_safe,
    units_in_flight,
)
from codetool.secrets import redact

logger = logging.getLogger(__name__)


@dataclass
class SearchConfig:
    """Settings of the stepwise search. Paper defaults: K=2, temperature 0.9, top_p 0.95,
    at most 5 steps, weights 1/1/0 (CodeTool §4.1)."""

    method: str = option("spot+latent", "name of this method in trajectories and reports")
    k: int = option(2, "candidates sampled per step (1 = no search)")
    max_steps: int = option(5, "steps before an episode ends as max_steps")
    temperature: float = option(0.9, "sampling temperature (0 = greedy)")
    top_p: float = option(0.95, "nucleus sampling threshold")
    max_new_tokens: int = option(256, "tokens per candidate step")
    w_spot: float = option(1.0, "weight of the on-the-spot reward")
    w_latent: float = option(1.0, "weight of the latent reward")
    w_cost: float = option(0.0, "weight of the LIT tool cost (subtracted)")
    latent: str = option("prm", "latent reward source", choices=["prm", "rollout", "none"])
    rollouts: int = option(2, "rollouts per candidate when latent=rollout (m)")
    rollout_max_steps: int = option(3, "steps per rollout when latent=rollout")
    alpha: float = option(0.9, "latent reward: alpha^(1-LR)")
    beta: float = option(0.95, "latent reward: beta^(tau/L)")
    max_len: float = option(20.0, "latent reward: L, the path-length normaliser")
    concurrency: int | None = option(None, "episodes in flight (none: 4 under batched rounds, whose generations "
                                     "share forward passes; under continuous scheduling enough to fill the policy "
                                     "client twice over: 2 x policy_client.max_in_flight / k)")
    schedule: str = option("auto", "how episodes share the policy: rounds (all episodes' prompts in one generate "
                           "call per step, as a local model wants), continuous (each episode advances as soon as "
                           "its own generation returns, as a server wants), auto (continuous for http(s) "
                           "policies)", choices=list(SCHEDULES))
    max_observation_chars: int = option(1500, "output shown to the policy per step (public code: 500; 1,500 for TMDB)")
    observation_history: str = option("all", "past outputs the policy (and the PRM) sees: all, or only the last "
                                      "(public code)", choices=list(OBSERVATION_HISTORIES))
    step_format: str = option("code_only", "policy reply: code_only (one code block; small models) or step_text "
                              "(public code: a one-line plan in words, then the code block)", choices=list(STEP_FORMATS))
    code_prefix: bool = option(True, "start each reply with an opening ```python fence and stop at the closing "
                               "one (small models then write code; needs a backend that continues a final "
                               "assistant message: transformers, vLLM, SGLang); step_format code_only only")
    constrain: str = option("off", "constrained step decoding: 'call' makes the step's first statement call a "
                            "listed function, finish or give_up (optionally as `result = name(`); 'line' makes "
                            "the whole step that one call on one line, then optionally print(result): a logits "
                            "mask locally, a regex (structured outputs) for vLLM and servers",
                            choices=["off", "call", "line"])
    constrain_arguments: str = option("literal", "with constrain line: literal allows only literal argument values, "
                                      "bare or as keywords (city=\"Paris\", days=3), so a step cannot copy an "
                                      "annotated stub or leave a string open; free allows any text",
                                      choices=["literal", "free"])
    constrain_first_tool: bool = option(True, "with constrain on, an episode's first step must be `result = "
                                        "<listed tool>(...)` (not finish/give_up: nothing is known yet)")
    constrain_last_finish: bool = option(True, "with constrain on, the last allowed step (max_steps; a tree's "
                                         "max_depth) must call finish or give_up: a step that cannot end the "
                                         "episode there is wasted")
    tool_error_is_failure: bool = option(True, "a failed tool call makes R_spot 0 even if caught")
    cost_table: str | None = option(None, "YAML of tool costs (default: the packaged table)")
    seed: int | None = option(0, "sampling seed (none = nondeterministic)")
    tie_break: str = option("random", "equal selection scores: random (a pick seeded by search.seed, the query "
                            "and the step; the reference ablation), first (the earlier sample among scores equal "
                            "to 1e-9) or reference (the public code's main method: exact comparison, the "
                            "earliest of the best wins)", choices=["random", "first", "reference"])
    reference_steps: bool = option(True, "after each episode, re-run its chosen steps as the public CodeTool code "
                                   "does (earlier steps' first code blocks with prints stripped, then the step; one "
                                   "sandbox per trajectory) and record their status and output: SCEP as the public "
                                   "code counts it and answer.final_answer reference read them")
    observation_cut: str = option("middle", "how an output longer than max_observation_chars is cut: middle (head "
                                  "and tail, ours) or head (its first characters, as the public code's [0:500])",
                                  choices=["middle", "head"])
    strategy: str = option("greedy", "search over steps: greedy (CodeTool: keep the best candidate per step), "
                           "best_of_n, beam or lookahead (codetool.search.strategies)",
                           choices=["greedy", "best_of_n", "beam", "lookahead"])
    n: int = option(4, "best_of_n: independent greedy episodes per query")
    aggregate: str = option("last", "best_of_n/beam: a trajectory's score from its chosen steps' PRM scores: "
                            "last step, product or minimum", choices=["last", "prod", "min"])
    beam_width: int = option(2, "beam: partial trajectories kept per step (B); each is expanded with k")
    lookahead_depth: int = option(1, "lookahead: steps of the single-sample rollout (at search.rollout_temperature) "
                                 "that scores each candidate (d)")
    rollout_temperature: float | None = option(None, "sampling temperature of rollouts (lookahead, latent=rollout); "
                                               "none = search.temperature, 0 = greedy rollouts")
    rollout_value: str = option("auto", "value of a rollout (lookahead, latent=rollout): success (CodeTool's Monte "
                                "Carlo latent reward alpha^(1-LR) beta^(tau/L) of grounded successes), prm (the "
                                "PRM's score of the rollout's last step, as search-and-learn's lookahead), auto "
                                "(prm when a PRM is loaded, else success)", choices=["auto", "success", "prm"])

    def __post_init__(self):
        if self.k < 1:
            raise ConfigError(f"search.k must be >= 1, got {self.k}.")
        if self.max_steps < 1:
            raise ConfigError(f"search.max_steps must be >= 1, got {self.max_steps}.")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"search.concurrency must be >= 1, got {self.concurrency}.")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"search.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"search.top_p must be in (0, 1], got {self.top_p}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"search.max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.latent == "rollout" and self.rollouts < 1:
            raise ConfigError(f"search.rollouts must be >= 1 with latent=rollout, got {self.rollouts}.")
        if self.strategy == "lookahead" and self.w_latent <= 0:
            raise ConfigError(f"search.strategy lookahead scores each candidate by its rollout through the latent "
                              f"reward, but search.w_latent is {self.w_latent}: set search.w_latent > 0 (e.g. 1), "
                              "or use strategy greedy.")
        for name in ("n", "beam_width", "lookahead_depth"):
            if getattr(self, name) < 1:
                raise ConfigError(f"search.{name} must be >= 1, got {getattr(self, name)}.")


@dataclass
class SearchTask:
    """One query to solve.

    Args:
        query_id (`str`), query (`str`): the benchmark query.
        env (`codetool.tools.ToolEnvironment`): its APIs and tool backend.
        benchmark (`str`), group (`str` or `None`): where it comes from.
        extra (`dict`): copied into the trajectory (e.g. RestBench ``gold_path``).
        history (`list[dict]`): steps already taken (``{"code", "observation"}``) when an episode
            continues from a given state (rollouts, a router's fallback); empty for a new query.
        prefill (`str`): text that opens the first step's reply (the model continues it; the
            candidate's text includes it): the decide-first router's Probe&Prefill steering.
    """

    query_id: str
    query: str
    env: Any
    benchmark: str = "custom"
    group: str | None = None
    extra: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    prefill: str = ""


def select(candidates: list[Candidate], cfg: SearchConfig, *, tie_key: str = "") -> int:
    """Score every candidate and return the index of the one to keep.

    Sets ``score`` on each candidate: ``w_spot*r_spot + w_latent*r_latent - w_cost*cost`` (a
    missing latent reward counts as 0). The pick, in order:

    1. with ``w_cost > 0``, only candidates whose R_spot is at least that of the best candidate
       *without* the cost term stay in: a cheaper candidate can never win by failing on the spot
       (LIT taxes each API call, yet picks the cheapest among the plans that work);
    2. the highest ``score`` (equal up to 1e-9, so 0.9 and 0.8999999999999999 tie);
    3. with ``w_cost > 0``, the lowest cost among equally scored candidates; with ``w_cost == 0``
       cost plays no part (a tool-free ``finish`` does not beat an equally good tool call);
    4. ``tie_break='random'``: a pick seeded by ``cfg.seed`` and ``tie_key`` (e.g. query id and
       step), like the reference ablation's random choice among equal candidates; ``first``: the
       earlier sample. ``reference`` skips the rounding of 2: the public code's main method keeps
       candidate 1 unless candidate 2's score is strictly greater (``>=`` on the raw sums), so
       the earliest of the exactly best wins.

    Args:
        candidates (`list[Candidate]`): the step's executed candidates (``index`` = sample order).
        cfg (`SearchConfig`): weights, ``tie_break`` and ``seed``.
        tie_key (`str`, *optional*): what makes this step's random pick differ from other steps'.
    Returns:
        The ``index`` of the chosen candidate.
    """
    for c in candidates:
        c.score = cfg.w_spot * c.r_spot + cfg.w_latent * (c.r_latent or 0.0) - cfg.w_cost * c.cost
    pool = list(candidates)
    if cfg.w_cost > 0:
        quality = {c.index: cfg.w_spot * c.r_spot + cfg.w_latent * (c.r_latent or 0.0) for c in pool}
        top = max(quality.values())
        floor = max(c.r_spot for c in pool if quality[c.index] >= top - 1e-9)
        pool = [c for c in pool if c.r_spot >= floor]
    if cfg.tie_break == "reference":
        top = max(c.score for c in pool)
        return min(c.index for c in pool if c.score == top)
    best = max(round(c.score, 9) for c in pool)
    pool = [c for c in pool if round(c.score, 9) == best]
    if cfg.w_cost > 0:
        cheapest = min(round(c.cost, 9) for c in pool)
        pool = [c for c in pool if round(c.cost, 9) == cheapest]
    pool.sort(key=lambda c: c.index)
    if len(pool) == 1 or cfg.tie_break == "first":
        return pool[0].index
    if cfg.seed is None:
        return random.choice(pool).index
    digest = hashlib.sha256(f"{cfg.seed}|{tie_key}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16)).choice(pool).index


@dataclass
class _Episode:
    """One episode in flight: its task, the executor holding its chosen path's state (``None``
    once closed or when starting it failed), the trajectory so far, the history the policy sees
    and when it started (``time.perf_counter``)."""

    task: SearchTask
    state: Any
    traj: Trajectory
    history: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)


class StepwiseSearch:
    """CodeTool's stepwise search over many queries at once.

    Args:
        policy (`LLMBackend`): the policy (``codetool.models.backends``).
        config (`SearchConfig`): search settings.
        make_executor (`Callable[[SearchTask], Executor]`): a fresh executor for a task (with the
            task's tool functions).
        scorer (`PRMScorer`, *optional*): the latent reward source when ``latent='prm'``.
        config_hash (`str`, *optional*): stored in every trajectory.
    """

    def __init__(self, policy, config: SearchConfig, make_executor: Callable[[SearchTask], Any],
                 scorer: PRMScorer | None = None, config_hash: str = ""):
        if config.latent == "prm" and config.w_latent and scorer is None and config.strategy != "lookahead":
            raise ConfigError("search.latent is 'prm' but no PRM was given: pass --prm PATH|URL, "
                              "or set search.latent to none or rollout.")
        uses_rollouts = config.latent == "rollout" or config.strategy == "lookahead"
        if uses_rollouts and config.rollout_value == "prm" and scorer is None:
            raise ConfigError("search.rollout_value is 'prm' but no PRM was given: pass --prm PATH|URL, or set "
                              "search.rollout_value to success or auto.")
        self.policy, self.cfg, self.make_executor = policy, config, make_executor
        self.config_hash = config_hash
        self.continuous = is_continuous(policy, config.schedule)
        self.scorer = thread_safe(scorer) if self.continuous else scorer
        self.episodes = units_in_flight(config.concurrency, policy, self.continuous, local_default=4,
                                        per_unit=config.k)
        check_constraints(policy, config)

    def run(self, tasks: Iterable[SearchTask], on_done: Callable[[Trajectory], None] | None = None,
            progress: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Solve every task, ``concurrency`` at a time; ``on_done`` sees each finished trajectory
        (e.g. to append it to a JSONL file) as soon as its episode ends."""
        if self.cfg.strategy != "greedy":
            from codetool.search.strategies import run_strategy
            return run_strategy(self, tasks, on_done, progress)
        finished: list[Trajectory] = []

        def land(traj: Trajectory) -> None:
            finished.append(traj)
            for hook in (on_done, progress):
                if hook:
                    hook(traj)

        if self.continuous:
            stream(self.episode, tasks, self.episodes, land)
            return finished
        pending, active = iter(tasks), []
        rounds = 0
        while True:
            while len(active) < self.episodes:
                task = next(pending, None)
                if task is None:
                    break
                active.append(self._start(task))
            if not active:
                return finished
            done = self._round(active, rounds)
            rounds += 1
            for ep in done:
                active.remove(ep)
                land(self._finish(ep))

    def solve(self, task: SearchTask) -> Trajectory:
        """Solve one task."""
        return self.run([task])[0]

    def episode(self, task: SearchTask) -> Trajectory:
        """One whole episode on its own (continuous scheduling): each step is a round of one."""
        ep = self._start(task)
        while not self._round([ep], len(ep.traj.steps), quiet=True):
            pass
        return self._finish(ep)

    def _start(self, task: SearchTask) -> _Episode:
        traj = Trajectory(query_id=task.query_id, query=task.query, benchmark=task.benchmark,
                          group=task.group, method=self.cfg.method, config_hash=self.config_hash,
                          available_tools=task.env.describe(), extra=dict(task.extra),
                          phase_seconds={"generation": 0.0, "execution": 0.0, "scoring": 0.0})
        ep = _Episode(task, None, traj, history=list(task.history))
        try:
            ep.state = self.make_executor(task)
        except Exception as exc:  # noqa: BLE001 - this episode ends as an error, the run goes on
            self._fail(ep, exc)
        return ep

    def _round(self, active: list[_Episode], round_index: int, *, quiet: bool = False) -> list[_Episode]:
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
        rows = expand_each(self.policy, [Node(ep.state, ep.history, ep.task) for ep in active],
                           self.cfg.k, self.cfg, seed=seed, timings=timings)
        failed += [self._fail(ep, row) for ep, row in zip(active, rows) if isinstance(row, Exception)]
        active, expansions = ([ep for ep, row in zip(active, rows) if not isinstance(row, Exception)],
                              [row for row in rows if not isinstance(row, Exception)])
        if not active:
            return failed
        t0 = time.perf_counter()
        self._guarded_latent(active, expansions)
        timings["scoring"] = time.perf_counter() - t0
        ended = []
        for ep, row in zip(active, expansions):
            for phase, seconds in timings.items():  # a shared round's time is split evenly
                ep.traj.phase_seconds[phase] += seconds / len(active)
            if self._guarded_advance(ep, row):
                ended.append(ep)
        # A user waits on these rounds (all episodes in flight end together): say what each did.
        (logger.debug if quiet else logger.info)("search round %d: %d episodes, %d candidates; generation %.1f s, execution %.1f s, "
                    "scoring %.1f s; %d ended", round_index + 1, len(active), sum(map(len, expansions)),
                    timings.get("generation", 0.0), timings.get("execution", 0.0), timings["scoring"],
                    len(ended) + len(failed))
        return failed + ended

    def _latent(self, active: list[_Episode], expansions: list[list[Expanded]]) -> None:
        if self.cfg.latent == "none" or not self.cfg.w_latent:
            return
        if self.cfg.latent == "rollout":
            for ep, row in zip(active, expansions):
                for e in row:
                    e.candidate.r_latent = rollout_value(self, ep, e)
            return
        items, slots, owners = [], [], []
        for ep, row in zip(active, expansions):
            for e in row:
                if e.candidate.code is None:
                    e.candidate.r_latent = 0.0
                    continue
                items.append(self.prm_item(ep.task, ep.history, e.candidate, e.observation))
                slots.append(e.candidate)
                owners.append(ep)
        if items:
            for cand, value in zip(slots, self.scorer.score(items), strict=True):
                cand.r_latent = float(value)
            for owner, item in zip(owners, items):  # compute accounting
                owner.traj.prm_scored_tokens += prm_tokens(self.scorer, [item])

    def prm_item(self, task: SearchTask, history: list[dict], candidate: Candidate, observation: str) -> PRMItem:
        """What the PRM sees of ``candidate`` after ``history`` (the chosen steps before it)."""
        cfg = self.cfg
        return PRMItem(query=task.query, tools=task.env.render(),
                       history=visible_history(history, cfg.observation_history, cfg.step_format),
                       candidate=candidate.code, candidate_output=observation,
                       candidate_plan=step_plan(candidate.text) if cfg.step_format == "step_text" else "",
                       **reference_prm_fields(history, candidate.text))

    def _advance(self, ep: _Episode, row: list[Expanded]) -> bool:
        """Record the step, keep the chosen fork, close the rest; True when the episode ended."""
        cands = [e.candidate for e in row]
        chosen = select(cands, self.cfg, tie_key=f"{ep.task.query_id}|{len(ep.traj.steps)}")
        cands[chosen].chosen = True
        pick = row[chosen]
        for e in row:
            if e is not pick and e.state is not None:
                e.state.close()
        if pick.state is not None:
            ep.state.close()
            ep.state = pick.state
        step = Step(index=len(ep.traj.steps), candidates=cands, chosen=chosen, observation=pick.observation)
        ep.traj.steps.append(step)
        ep.traj.tool_cost += pick.candidate.cost
        ep.traj.prompt_tokens += sum(c.prompt_tokens for c in cands)
        ep.traj.completion_tokens += sum(c.completion_tokens for c in cands)
        count_step(ep.traj, row)
        ep.traj.isolation = pick.candidate.result.isolation or ep.traj.isolation
        ep.history.append(history_entry(pick.candidate, pick.observation))
        ended = pick.ended
        if ended == "finish":
            ep.traj.finish_type, ep.traj.final_answer = "finish", str(pick.candidate.result.final_answer)
        elif ended == "give_up":
            ep.traj.finish_type = "give_up"
            ep.traj.extra["give_up_reason"] = pick.candidate.result.give_up_reason
        elif len(ep.traj.steps) >= self.cfg.max_steps:
            ep.traj.finish_type = "max_steps"
        else:
            return False
        return True

    def _finish(self, ep: _Episode) -> Trajectory:
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

    # -- episode isolation: a failure inside one episode ends that episode, not the run
    def _guarded_latent(self, active: list[_Episode], expansions: list[list[Expanded]]) -> None:
        """``_latent`` for the round; if it raises (a PRM scorer failure), each episode is scored
        on its own and the ones that still fail are marked as errors."""
        try:
            self._latent(active, expansions)
        except Exception:  # noqa: BLE001 - retried per episode below
            for ep, row in zip(active, expansions):
                try:
                    self._latent([ep], [row])
                except Exception as exc:  # noqa: BLE001 - this episode ends as an error
                    self._fail(ep, exc)

    def _guarded_advance(self, ep: _Episode, row: list[Expanded]) -> bool:
        """``_advance``, unless the episode failed this round (executor fault, scorer failure)
        or advancing raises: then its candidates' forks are closed and it ends as an error."""
        fault = next((e.candidate.result.host_error for e in row if e.candidate.result.host_error), None)
        if fault and ep.traj.finish_type != "error":
            self._fail(ep, fault)
        if ep.traj.finish_type != "error":
            try:
                return self._advance(ep, row)
            except Exception as exc:  # noqa: BLE001 - this episode ends as an error
                self._fail(ep, exc)
        for e in row:
            if e.state is not None and e.state is not ep.state:
                e.state.close()
        return True

    def _fail(self, ep: _Episode, error: Exception | str) -> _Episode:
        """End ``ep`` as ``finish_type='error'`` with the error's message (secrets redacted)."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        ep.traj.finish_type, ep.traj.error = "error", redact(text)[:2000]
        logger.warning("episode %s ended with an error: %s", ep.task.query_id, log_safe(ep.traj.error, 500))
        return ep


def count_step(traj: Trajectory, row: list[Expanded]) -> None:
    """Compute accounting of one expanded step: generated tokens, tool calls, forks."""
    traj.generated_tokens += sum(e.candidate.completion_tokens for e in row)
    traj.tool_calls += sum(len(e.candidate.result.tool_calls) for e in row)
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
