"""Sampling and executing candidate steps: :func:`expand` (one batched ``generate`` call, each
candidate run in a fork of its node's executor, with its on-the-spot reward and LIT cost) and
:func:`expand_each` (the same, isolating a failing node). Shared by the search episodes
(``codetool.search.episode``), beam search, the decide-first router and the tree builder.

Limits: executions run one after another (the policy dominates the time on CPU); the caller owns
every returned executor state and must close it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codetool.executor.result import (
    ExecutionResult,
    StepExecutor,
    host_error_result,
    no_code_result,
)
from codetool.models.constraint import CallConstraint
from codetool.rewards import ToolCostTable, on_the_spot, step_cost
from codetool.search.prompt import CODE_PREFIX, format_observation, parse_candidate, policy_messages
from codetool.search.records import Candidate, ImportedResult
from codetool.secrets import redact

if TYPE_CHECKING:
    from codetool.search.config import SearchConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Node:
    """A point to expand from (a search episode's current step, a tree's frontier node).

    Args:
        state (`StepExecutor`): the executor holding the node's state; each candidate runs in a
            ``fork()`` of it, and the caller keeps owning it.
        history (`list[dict]`): the steps that led here (``code``, ``text``, ``observation``), as
            for :func:`~codetool.search.prompt.policy_messages`.
        task (`SearchTask`): the query and its tool environment.
    """

    state: StepExecutor
    history: list[dict]
    task: Any


@dataclass
class Expanded:
    """A sampled, executed candidate and the executor that holds its state (``None`` when the
    reply had no code and nothing ran; the caller owns and must close ``state``)."""

    candidate: Candidate
    state: StepExecutor | None
    observation: str
    parse_error: str | None = None

    @property
    def result(self) -> ExecutionResult | ImportedResult:
        """The candidate's result: an expanded candidate always has one (``no_code_result`` for a
        reply without code, ``host_error_result`` for an executor that raised)."""
        assert self.candidate.result is not None
        return self.candidate.result

    @property
    def ended(self) -> str | None:
        """``finish`` or ``give_up`` when this candidate's code ended the episode."""
        result = self.result
        if result.final_answer is not None:
            return "finish"
        if result.give_up_reason is not None:
            return "give_up"
        return None


def expand_each(policy, nodes: list[Node], n: int, cfg: SearchConfig, *,
                seed: int | list[int] | None = None, timings: dict[str, float] | None = None,
                ) -> list[list[Expanded] | Exception]:
    """:func:`expand`, isolating failures per node: if the batched call raises (a policy error
    for one prompt, e.g. its context is too long), each node is expanded on its own, so only the
    nodes that still fail get their exception back in place of their row. ``seed`` is one for the
    call or one per node (each node's samples then depend on its seed alone: the tree builder).

    Returns:
        Per node, its row of :class:`Expanded` or the exception that expanding it raised.
    """
    try:
        return [*expand(policy, nodes, n, cfg, seed=seed, timings=timings)]
    except Exception as exc:  # noqa: BLE001 - retried node by node below
        if len(nodes) == 1:
            return [exc]
    rows: list[list[Expanded] | Exception] = []
    for i, node in enumerate(nodes):
        try:
            rows.extend(expand(policy, [node], n, cfg, seed=seed[i:i + 1] if isinstance(seed, list) else seed,
                               timings=timings))
        except Exception as exc:  # noqa: BLE001 - recorded on this node by the caller
            rows.append(exc)
    return rows


def expand(policy, nodes: list[Node], n: int, cfg: SearchConfig, *,
           seed: int | list[int] | None = None, timings: dict[str, float] | None = None) -> list[list[Expanded]]:
    """Sample ``n`` candidates for each node in one batched call and execute each in a fork.

    Args:
        policy (`LLMBackend`): the policy model.
        nodes (`list[Node]`): where to expand from.
        n (`int`): candidates per node.
        cfg (`SearchConfig`): sampling settings and reward options.
        timings (`dict`, *optional*): ``generation``/``execution`` seconds are added to it.
    Returns:
        One list of ``n`` :class:`Expanded` per node, in sampling order.
    """
    timings = timings if timings is not None else {}
    prompts = [policy_messages(node.task.query, node.task.env.render(), node.history, step_format=cfg.step_format,
                               observation_history=cfg.observation_history) for node in nodes]
    stop = None
    prefixed = cfg.code_prefix and cfg.step_format == "code_only"
    # A first step may open with the router's prefill; the fence of code_prefix follows it.
    leads = []
    for node in nodes:
        lead = "" if node.history else getattr(node.task, "prefill", "")
        if prefixed and not lead.endswith(CODE_PREFIX):
            lead += CODE_PREFIX
        leads.append(lead)
    prompts = [p + [{"role": "assistant", "content": lead}] if lead else p for p, lead in zip(prompts, leads)]
    if prefixed:
        stop = ["```"]
    extra = {}
    if cfg.constrain != "off":  # from the first generated character, or from the fence the model opens
        extra["constraint"] = [step_constraint(node.task, len(node.history), cfg, lead)
                               for node, lead in zip(nodes, leads)]
    t0 = time.perf_counter()
    outputs = policy.generate(prompts, n=n, temperature=cfg.temperature, top_p=cfg.top_p,
                              max_new_tokens=cfg.max_new_tokens, stop=stop, seed=seed, **extra)
    timings["generation"] = timings.get("generation", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    expanded = []
    for node, completions, lead in zip(nodes, outputs, leads):
        state, task = node.state, node.task
        row = []
        for i, completion in enumerate(completions):
            text = completion.text
            if prefixed and not text.lstrip().startswith("```"):
                text = f"{lead}{text}\n```"
            elif lead and not prefixed:
                text = lead + text
            parsed = parse_candidate(text)
            cand = Candidate(index=i, text=text, code=parsed.code,
                             prompt_tokens=completion.prompt_tokens if i == 0 else 0,
                             completion_tokens=completion.completion_tokens)
            child = None
            if parsed.code is None:
                cand.result = no_code_result(parsed.error)
            else:
                child, cand.result = _execute(state, parsed.code)
            cand.r_spot = on_the_spot(cand.result, tool_error_is_failure=cfg.tool_error_is_failure)
            called = [task.env.api_for(c.name) for c in cand.result.tool_calls]
            cand.cost = step_cost(parsed.code or "", [a for a in called if a is not None], _cost_table(cfg))
            obs = format_observation(cand.result, max_chars=cfg.max_observation_chars, parse_error=parsed.error,
                                     cut=getattr(cfg, "observation_cut", "middle"))
            row.append(Expanded(cand, child, obs, parsed.error))
        expanded.append(row)
    timings["execution"] = timings.get("execution", 0.0) + time.perf_counter() - t0
    return expanded


def check_constraints(policy, cfg: SearchConfig) -> None:
    """With ``search.constrain`` on, ask a policy that can tell (a server) whether it applies call
    constraints before any episode relies on them: it raises ConfigError naming the setting, or
    turns them off with one warning (``RemoteConfig.require_constraints``)."""
    check = getattr(policy, "check_constraints", None)
    if cfg.constrain != "off" and callable(check):
        check("search.constrain", cfg.constrain)


def step_constraint(task, steps_taken: int, cfg: SearchConfig, lead: str = "") -> CallConstraint | None:
    """The constrained-decoding rule of the next step (``cfg.constrain``; ``None`` when off).

    The constraint applies from the first generated character when the reply starts inside the
    opening fence (``code_prefix``, or a ``lead`` such as the router's prefill that holds it), else
    from the fence the model opens. A first step (nothing known yet, ``constrain_first_tool``) calls a listed tool as ``result = tool(...)``; the last
    allowed step (``constrain_last_finish``, ``steps_taken + 1 >= max_steps``) calls ``finish`` or
    ``give_up``. Shared by :func:`expand` and policy RL rollouts (``codetool.policy.rollout``).

    Args:
        task (`SearchTask`): its ``env.apis`` are the callable functions.
        steps_taken (`int`): steps already in the episode's history.
        cfg (`SearchConfig`): ``constrain``, ``constrain_*``, ``max_steps``, ``code_prefix``, ``step_format``.
        lead (`str`): the text the reply already opens with (prefill and/or the fence).
    """
    if cfg.constrain == "off":
        return None
    prefixed = cfg.code_prefix and cfg.step_format == "code_only"
    first = not steps_taken and cfg.constrain_first_tool
    last = cfg.constrain_last_finish and steps_taken + 1 >= cfg.max_steps and not first
    return CallConstraint.for_functions(
        [] if last else [a.name for a in task.env.apis], ends=not first, assign=first,
        shape="opening" if cfg.constrain == "call" else "line",
        trigger="" if prefixed or CODE_PREFIX in lead else CODE_PREFIX, answer_openings=ANSWER_OPENINGS, arguments=cfg.constrain_arguments)


# Under a constraint, finish's argument starts as a text or the last result (a small model otherwise
# passes invented variable names: NameError).
ANSWER_OPENINGS = ('"', "'", 'f"', "result", "str(result)")

_COST_TABLES: dict[str | None, ToolCostTable] = {}


def _cost_table(cfg: SearchConfig) -> ToolCostTable:
    if cfg.cost_table not in _COST_TABLES:
        _COST_TABLES[cfg.cost_table] = ToolCostTable.load(cfg.cost_table)
    return _COST_TABLES[cfg.cost_table]


def _execute(state, code: str) -> tuple[Any, ExecutionResult]:
    """Run ``code`` in a fork of ``state``: ``(fork, result)``. A fault of the executor itself
    (it raised instead of reporting) gives ``(None, a host_error_result)``, which
    ends the episode as an error (``codetool.search.episode``) or the tree (``TreeBuilder``)."""
    child = None
    try:
        child = state.fork()
        return child, child.run(code)
    except Exception as exc:  # noqa: BLE001 - recorded on the episode, the run goes on
        if child is not None:
            try:
                child.close()
            except Exception:  # noqa: BLE001 - already failing
                logger.debug("could not close a failed fork", exc_info=True)
        message = redact(f"{type(exc).__name__}: {exc}")[:2000]
        return None, host_error_result(message, type(exc).__name__)
