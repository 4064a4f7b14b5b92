"""Decide first, then route: answer directly, take a one-step fast path, or run the full search.

Many queries need one obvious function, or none; only uncertain ones should pay for the full
search. :func:`codetool.decide.stage.decide` names the first function (or ``NONE``) with a
confidence taken from the model itself (see that module); :class:`Router` acts on it.

**Routes** (thresholds in :class:`RouterConfig`): ``NONE`` with confidence >= ``t_none`` ->
``direct`` (one short generation, the answer goes to ``final_answer``, no tools); a function with
confidence >= ``t_tool`` -> ``fast`` (one code step, prompted to call that function and
``finish``, executed once; if it fails, the full search continues from that state and history);
otherwise -> ``search``. Every trajectory records its decision in ``Trajectory.routing``.

**Probe&Prefill** (``method: probe``, When2Tool): a hidden-state probe gives P(tool necessary)
for the policy's first-step prompt (:mod:`codetool.decide.probe`); below ``t_probe`` the query
takes the no-tool side, else the tool side, and the prefill opens the first reply accordingly.
``soft``: the no-tool side takes the fast path with its reply opened by a steering sentence
(``prompts/probe_prefill_none.txt``; the model may still call a tool, and a step that does not
finish falls back to the full search as today); the tool side runs the full search with its first
reply opened by ``prompts/probe_prefill_tool.txt``. ``hard``: the no-tool side is the direct answer
(no tool can be called); the tool side's first reply opens a code block (no prose answer).

Limits: a fast-path fallback gets the search's full step budget after the fast step (so it may use
``max_steps + 1`` steps), which can only make the router look more expensive, never cheaper.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from codetool import CodetoolError, prompts
from codetool.decide.stage import (
    Decision,
    RouterConfig,
    answer_messages,
    candidates_of,
    decide,
    route_for,
)
from codetool.executor.result import StepExecutor
from codetool.rewards import not_executed
from codetool.search.episode import Search
from codetool.search.expand import Node, expand
from codetool.search.prompt import CODE_PREFIX, history_entry
from codetool.search.records import Step, Trajectory
from codetool.search.search import SearchTask

logger = logging.getLogger(__name__)

ROUTES = ("direct", "fast", "search")


def _available_tools(env) -> list[dict[str, Any]]:
    """``Trajectory.available_tools``: ``env.describe()``, or built from ``env.apis``."""
    describe = getattr(env, "describe", None)
    if callable(describe):
        return describe()
    return [{"name": a.name, "tool": a.tool, "api": a.api} for a in getattr(env, "apis", [])]


def prefill_text(decision: Decision, route: str, cfg: RouterConfig) -> str:
    """What opens the first reply of a probe-routed query on ``route`` (empty for other methods,
    and for the direct route, whose prompt allows no tool)."""
    if decision.method != "probe" or route == "direct":
        return ""
    if route == "fast":
        return prompts.load("probe_prefill_none").strip() + "\n"
    return CODE_PREFIX if cfg.prefill == "hard" else prompts.load("probe_prefill_tool").strip() + "\n"


def fast_failure(expanded, need_tool: bool = True) -> str | None:
    """Why a fast-path step failed, or ``None`` when it succeeded.

    A success ran without error, had no failed tool call, called at least one tool (unless
    ``need_tool`` is False: Probe&Prefill's no-tool fast path) and called ``finish``. Reasons:
    ``no_code``, ``not_executed`` (the machine could not run it: not the code's failure, but the
    search still takes over), ``code_error``, ``tool_error``, ``give_up``, ``no_finish``,
    ``no_tool_call`` (finished without calling any function: an unsupported answer).
    """
    cand = expanded.candidate
    result = cand.result
    if cand.code is None:
        return "no_code"
    if not_executed(result):
        return "not_executed"
    if not result.ok:
        return "code_error"
    calls = result.tool_calls
    if any(c.status != "ok" for c in calls):
        return "tool_error"
    if expanded.ended == "give_up":
        return "give_up"
    if expanded.ended != "finish":
        return "no_finish"
    if not calls and need_tool:
        return "no_tool_call"
    return None


def routing_record(decision: Decision, route: str, cfg: RouterConfig, fallback: str | None = None,
                   top: int = 5) -> dict[str, Any]:
    """The ``Trajectory.routing`` entry: route, decision, confidence, method, tokens, seconds.

    ``fallback`` is the fast path's failure reason when the full search took over, else ``None``.
    """
    ranked = sorted(decision.scores.items(), key=lambda kv: -kv[1])[:top]
    return {"route": route, "choice": decision.choice, "tool": decision.tool,
            "confidence": round(decision.confidence, 6), "method": decision.method,
            "scoring": (("pmi-" if cfg.calibrate else "") + cfg.length_norm) if decision.method == "logprobs" else None,
            "t_none": cfg.t_none, "t_tool": cfg.t_tool, "fallback": fallback,
            **({"p_tool": None if decision.p_tool is None else round(decision.p_tool, 6), "t_probe": cfg.t_probe, "prefill": cfg.prefill,
                "prefill_text": prefill_text(decision, route, cfg)} if decision.method == "probe" else {}),
            "top": [[name, round(p, 6)] for name, p in ranked], "samples": list(decision.samples),
            "tokens": {"prompt": decision.prompt_tokens, "completion": decision.completion_tokens,
                       "scored": decision.scored_tokens},
            "seconds": round(decision.seconds, 4)}


@dataclass
class _Pending:
    """A task's decision and, after a failed fast path, that step and what it cost."""

    task: SearchTask
    decision: Decision
    route: str
    fast_step: Step | None = None
    fast_reason: str | None = None
    fast_phases: dict[str, float] = field(default_factory=dict)


class Router:
    """Decide first, then answer directly, take the one-step fast path, or run the full search.

    Args:
        config (`RouterConfig`): thresholds and decision settings.
        search (`Search`): the full search (its policy, config, scorer, executors and strategy).
        policy (`LLMBackend`): writes direct answers and fast-path steps (normally ``search.policy``).
        make_executor (`Callable[[SearchTask], StepExecutor]`, *optional*): executors for fast paths
            (default: ``search.make_executor``); a failed fast path hands its executor to the search.
        decider (`LLMBackend`, *optional*): the deciding model (default: ``policy``).
        probe (`Probe`, *optional*): method probe's probe (default: loaded from ``config.probe``).
        probe_backend (`TransformersBackend`, *optional*): whose hidden states the probe reads
            (default: ``config.probe_model`` when set, else the decider).
    """

    def __init__(self, config: RouterConfig, search: Search, policy=None,
                 make_executor: Callable[[SearchTask], StepExecutor] | None = None, decider=None, *, probe=None,
                 probe_backend=None):
        self.cfg, self.search = config, search
        self.policy = policy if policy is not None else search.policy
        self.make_executor = make_executor or search.make_executor
        self.decider = decider if decider is not None else self.policy
        self.method = f"{search.cfg.method}+router"
        self.probe, self.probe_backend = probe, probe_backend

    def _decide(self, tasks: list[SearchTask]) -> list[Decision]:
        if self.cfg.method != "probe":
            return decide(self.decider, [(t.query, candidates_of(t.env)) for t in tasks], self.cfg)
        from codetool.decide.probe import Probe, probe_decisions, probe_messages

        if self.probe is None:
            self.probe = Probe.load(self.cfg.probe)
        if self.probe_backend is None:
            if self.cfg.probe_spec is not None:  # parsed from probe_model
                from codetool.assemble import make_policy

                self.probe_backend = make_policy(self.cfg.probe_spec)
            else:
                self.probe_backend = self.decider
        step_format = self.search.cfg.step_format
        if step_format != self.probe.step_format:
            logger.warning("the probe was trained on %s prompts; the search uses %s", self.probe.step_format, step_format)
        prompts = [probe_messages(t.query, t.env, step_format) for t in tasks]
        return probe_decisions(self.probe_backend, prompts, self.probe, self.cfg)

    def run(self, tasks: Sequence[SearchTask], on_done: Callable[[Trajectory], None] | None = None,
            decisions: Sequence[Decision] | None = None) -> list[Trajectory]:
        """Route and solve every task; returns trajectories in task order.

        Args:
            on_done (`Callable`, *optional*): sees each finished trajectory as soon as it exists.
            decisions (`Sequence[Decision]`, *optional*): decisions already made for ``tasks``
                (benchmarks reuse one decision across threshold settings); made here otherwise.
        Raises:
            CodetoolError: two tasks share a query id.
        """
        tasks = list(tasks)
        ids = [t.query_id for t in tasks]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise CodetoolError(f"the router got query id {dup!r} twice; query ids of one run must be unique.")
        if decisions is None:
            decisions = self._decide(tasks)
        pending = [_Pending(t, d, route_for(d, self.cfg)) for t, d in zip(tasks, decisions, strict=True)]
        for p in pending:
            logger.debug("%s: %s (%s %.3f) -> %s", p.task.query_id, p.decision.choice, p.decision.method,
                         p.decision.confidence, p.route)
        done: dict[str, Trajectory] = {}

        def emit(traj: Trajectory) -> None:
            done[traj.query_id] = traj
            if on_done:
                on_done(traj)

        for traj in self._direct([p for p in pending if p.route == "direct"]):
            emit(traj)
        held: dict[str, Any] = {}
        for traj in self._fast([p for p in pending if p.route == "fast"], held):
            emit(traj)
        rest = {p.task.query_id: p for p in pending
                if p.route == "search" or (p.route == "fast" and p.fast_reason is not None)}
        if rest:
            def make(task: SearchTask):
                state = held.pop(task.query_id, None)
                return state if state is not None else self.search.make_executor(task)

            def finished(traj: Trajectory) -> None:
                self._complete(traj, rest[traj.query_id])
                emit(traj)

            runner = self.search.with_executors(make)
            search_tasks = []
            for p in rest.values():
                # The confidence goes with the task: compute_optimal reads it as a difficulty estimate.
                extra = {**p.task.extra, "decision_confidence": p.decision.confidence}
                if p.fast_step is None:
                    search_tasks.append(replace(p.task, prefill=prefill_text(p.decision, p.route, self.cfg), extra=extra))
                else:
                    step = history_entry(p.fast_step.chosen_candidate, p.fast_step.observation)
                    search_tasks.append(replace(p.task, history=[step], extra=extra))
            runner.run(search_tasks, on_done=finished)
        for state in held.values():  # only left when the search failed to start an episode
            state.close()
        return [done[i] for i in ids]

    def _trajectory(self, p: _Pending) -> Trajectory:
        task = p.task
        traj = Trajectory(query_id=task.query_id, query=task.query, benchmark=task.benchmark, group=task.group,
                          method=self.method, config_hash=self.search.config_hash,
                          available_tools=_available_tools(task.env), extra=dict(task.extra),
                          phase_seconds={"decision": 0.0, "generation": 0.0, "execution": 0.0, "scoring": 0.0})
        self._add_decision(traj, p)
        return traj

    def _add_decision(self, traj: Trajectory, p: _Pending, fallback: str | None = None) -> None:
        d = p.decision
        traj.method = self.method
        traj.prompt_tokens += d.prompt_tokens + d.scored_tokens
        traj.completion_tokens += d.completion_tokens
        traj.phase_seconds["decision"] = traj.phase_seconds.get("decision", 0.0) + d.seconds
        traj.wall_time_s += d.seconds
        traj.routing = routing_record(d, p.route, self.cfg, fallback)

    def _direct(self, pending: list[_Pending]) -> list[Trajectory]:
        """One batched generation answers every NONE query; no tools, no code."""
        if not pending:
            return []
        prompts = [answer_messages(p.task.query) for p in pending]
        start = time.perf_counter()
        outputs = self.policy.generate(prompts, n=1, temperature=0.0, max_new_tokens=self.cfg.answer_max_new_tokens,
                                       seed=self.cfg.seed)
        share = (time.perf_counter() - start) / len(pending)
        out = []
        for p, [completion] in zip(pending, outputs, strict=True):
            traj = self._trajectory(p)
            traj.final_answer, traj.finish_type = completion.text.strip(), "finish"
            traj.prompt_tokens += completion.prompt_tokens
            traj.completion_tokens += completion.completion_tokens
            traj.phase_seconds["generation"] += share
            traj.wall_time_s += share
            out.append(traj)
        return out

    def _fast(self, pending: list[_Pending], held: dict[str, Any]) -> list[Trajectory]:
        """One code step per query, prompted to call the chosen function and finish.

        Returns the trajectories of the successes; a failure keeps its step on the pending entry
        and its executor (the state after the step) in ``held`` for the search to continue from.
        """
        if not pending:
            return []
        cfg = replace(self.search.cfg, temperature=self.cfg.fast_temperature)
        nodes = []
        for p in pending:
            if p.decision.method == "probe":  # steered by the prefill, no function named
                hinted = replace(p.task, prefill=prefill_text(p.decision, "fast", self.cfg))
            else:
                hinted = replace(p.task, query=p.task.query + "\n\n" + prompts.render("decide_fast", tool=p.decision.tool).strip())
            nodes.append(Node(self.make_executor(p.task), [], hinted))
        timings: dict[str, float] = {}
        start = time.perf_counter()
        rows = expand(self.policy, nodes, 1, cfg, seed=self.cfg.seed, timings=timings)
        n = len(pending)
        phases = {"wall": (time.perf_counter() - start) / n,
                  **{phase: timings.get(phase, 0.0) / n for phase in ("generation", "execution")}}
        out = []
        for p, node, [e] in zip(pending, nodes, rows, strict=True):
            parent = node.state
            cand = e.candidate
            cand.chosen = True
            step = Step(index=0, candidates=[cand], chosen=0, observation=e.observation)
            reason = fast_failure(e, need_tool=p.decision.method != "probe")
            if reason is None:
                if e.state is not None:
                    e.state.close()
                parent.close()
                traj = self._trajectory(p)
                traj.steps = [step]
                traj.final_answer, traj.finish_type = str(e.result.final_answer), "finish"
                self._add_step_cost(traj, step, phases)
                out.append(traj)
                continue
            logger.debug("%s: fast path failed (%s); the full search continues", p.task.query_id, reason)
            if e.state is not None:
                parent.close()
                held[p.task.query_id] = e.state
            else:
                held[p.task.query_id] = parent
            p.fast_step, p.fast_reason, p.fast_phases = step, reason, phases
        return out

    @staticmethod
    def _add_step_cost(traj: Trajectory, step: Step, phases: dict[str, float]) -> None:
        """Add a fast step's tokens, tool cost and seconds (``wall``, ``generation``, ``execution``)."""
        cand = step.chosen_candidate
        traj.prompt_tokens += cand.prompt_tokens
        traj.completion_tokens += cand.completion_tokens
        traj.tool_cost += cand.cost
        if cand.result is not None:
            traj.isolation = cand.result.isolation or traj.isolation
        for phase in ("generation", "execution"):
            traj.phase_seconds[phase] = traj.phase_seconds.get(phase, 0.0) + phases.get(phase, 0.0)
        traj.wall_time_s += phases.get("wall", 0.0)

    def _complete(self, traj: Trajectory, p: _Pending) -> None:
        """Add the decision (and a failed fast step) to a trajectory the search produced."""
        if p.fast_step is not None:
            traj.steps = [p.fast_step, *traj.steps]
            for i, step in enumerate(traj.steps):
                step.index = i
            self._add_step_cost(traj, p.fast_step, p.fast_phases)
        self._add_decision(traj, p, fallback=p.fast_reason)


def route_and_solve(tasks: Sequence[SearchTask], router_cfg: RouterConfig, search: Search, policy=None,
                    make_executor: Callable[[SearchTask], StepExecutor] | None = None, *, decider=None,
                    on_done: Callable[[Trajectory], None] | None = None,
                    decisions: Sequence[Decision] | None = None, probe=None) -> list[Trajectory]:
    """Decide first for every task, then answer directly, take the fast path, or search.

    A thin wrapper over :class:`Router` (see it for the arguments); returns trajectories in task
    order, each with its decision in ``Trajectory.routing``.
    """
    return Router(router_cfg, search, policy, make_executor, decider, probe=probe).run(tasks, on_done=on_done,
                                                                                        decisions=decisions)
