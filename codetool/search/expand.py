"""Sampling and executing candidate steps: :func:`expand` (one batched ``generate`` call, each
candidate run in a fork of its node's executor by :func:`codetool.search.step.run_step`, with its
on-the-spot reward, LIT cost and observation) and :func:`expand_each` (the same, isolating a
failing node). Shared by the search episodes (``codetool.search.episode``), beam search, the
decide-first router and the tree builder; the RL rollout takes its steps with the same
``run_step`` and :func:`step_constraint`.

Limits: executions run one after another (the policy dominates the time on CPU); the caller owns
every returned executor state and must close it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codetool.executor.result import StepExecutor
from codetool.models.constraint import CallConstraint
from codetool.search.prompt import CODE_PREFIX, policy_messages
from codetool.search.step import Expanded, prefixed, reply_lead, reply_text, run_step, stop_words
from codetool.text import step_key

if TYPE_CHECKING:
    from codetool.search.config import SearchConfig, StepGroup

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


def expand_each(policy, nodes: list[Node], n: int, cfg: SearchConfig, *,
                seed: int | list[int] | None = None, timings: dict[str, float] | None = None,
                distinct_draws: int = 0) -> list[list[Expanded] | Exception]:
    """:func:`expand`, isolating failures per node: if the batched call raises (a policy error
    for one prompt, e.g. its context is too long), each node is expanded on its own, so only the
    nodes that still fail get their exception back in place of their row. ``seed`` is one for the
    call or one per node (each node's samples then depend on its seed alone: the tree builder).

    Returns:
        Per node, its row of :class:`Expanded` or the exception that expanding it raised.
    """
    try:
        return [*expand(policy, nodes, n, cfg, seed=seed, timings=timings, distinct_draws=distinct_draws)]
    except Exception as exc:  # noqa: BLE001 - retried node by node below
        if len(nodes) == 1:
            return [exc]
    rows: list[list[Expanded] | Exception] = []
    for i, node in enumerate(nodes):
        try:
            rows.extend(expand(policy, [node], n, cfg, seed=seed[i:i + 1] if isinstance(seed, list) else seed,
                               timings=timings, distinct_draws=distinct_draws))
        except Exception as exc:  # noqa: BLE001 - recorded on this node by the caller
            rows.append(exc)
    return rows


def expand(policy, nodes: list[Node], n: int, cfg: SearchConfig, *, seed: int | list[int] | None = None,
           timings: dict[str, float] | None = None, distinct_draws: int = 0) -> list[list[Expanded]]:
    """Sample ``n`` candidates for each node in one batched call and execute each in a fork.

    Args:
        policy (`LLMBackend`): the policy model.
        nodes (`list[Node]`): where to expand from.
        n (`int`): candidates per node.
        cfg (`SearchConfig`): sampling settings and reward options.
        timings (`dict`, *optional*): ``generation``/``execution`` seconds are added to it.
        distinct_draws (`int`, *optional*, defaults to 0): with 0, the ``n`` samples as drawn, repeats
            included. Above 0, a candidate whose reply repeats an earlier one of its node (the same
            text, trailing whitespace aside) is dropped before it runs, and the nodes short of ``n``
            sample again, at most this many more times (each draw with its own seed): a node gets
            up to ``n`` distinct candidates, fewer when its policy keeps repeating itself (the tree
            builder's ``trees.distinct_draws``). A node's first candidate then carries the prompt
            tokens of every draw and the generated tokens of the repeats dropped.
    Returns:
        One list of :class:`Expanded` per node, in sampling order: ``n`` of them, or with
        ``distinct_draws`` from 1 to ``n``.
    """
    timings = timings if timings is not None else {}
    prompts = [policy_messages(node.task.query, node.task.env.render(), node.history, step_format=cfg.step_format,
                               observation_history=cfg.observation_history) for node in nodes]
    # A first step may open with the router's prefill; the fence of code_prefix follows it.
    leads = [reply_lead(cfg, "" if node.history else getattr(node.task, "prefill", "")) for node in nodes]
    prompts = [p + [{"role": "assistant", "content": lead}] if lead else p for p, lead in zip(prompts, leads)]
    extra = {}
    if cfg.constrain != "off":  # from the first generated character, or from the fence the model opens
        extra["constraint"] = [step_constraint(node.task, len(node.history), cfg, lead)
                               for node, lead in zip(nodes, leads)]
    t0 = time.perf_counter()

    def draw(which: list[int], draw_index: int) -> list[list[Any]]:
        seeds: Any = seed
        if isinstance(seed, list):
            seeds = [seed[i] + 104_729 * draw_index for i in which]
        elif seed is not None:
            seeds = seed + 104_729 * draw_index
        return policy.generate([prompts[i] for i in which], n=n, temperature=cfg.temperature, top_p=cfg.top_p,
                               max_new_tokens=cfg.max_new_tokens, stop=stop_words(cfg), seed=seeds,
                               **{k: [v[i] for i in which] for k, v in extra.items()})

    outputs = draw(list(range(len(nodes))), 0)
    spent = [[0, 0] for _ in nodes]  # per node: prompt tokens of its draws, generated tokens of its repeats
    if distinct_draws > 0:
        outputs, spent = _distinct(outputs, n, distinct_draws, draw, lambda i, c: reply_text(c.text, leads[i], cfg))
    timings["generation"] = timings.get("generation", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    expanded = [[run_step(node.state, reply_text(completion.text, lead, cfg), node.task, cfg, index=i,
                          prompt_tokens=(completion.prompt_tokens + used[0]) if i == 0 else 0,
                          completion_tokens=completion.completion_tokens + (used[1] if i == 0 else 0))
                 for i, completion in enumerate(completions)]
                for node, completions, lead, used in zip(nodes, outputs, leads, spent)]
    timings["execution"] = timings.get("execution", 0.0) + time.perf_counter() - t0
    from codetool.progress import note_work  # the commands' progress counts steps and tree nodes

    note_work(len(expanded))
    return expanded


def _distinct(outputs: list[list[Any]], n: int, draws: int, draw, reply_of) -> tuple[list[list[Any]], list[list[int]]]:
    """:func:`expand`'s ``distinct_draws``: per node up to ``n`` completions whose replies
    (``reply_of(node index, completion)``) differ, drawing again (``draw(node indices, draw index)``)
    for the nodes short of ``n``; with the per-node ``[extra prompt tokens, generated tokens of the
    repeats dropped]``."""
    kept: list[list[Any]] = [[] for _ in outputs]
    seen: list[set[str]] = [set() for _ in outputs]
    spent = [[0, 0] for _ in outputs]

    def take(i: int, row: list[Any]) -> None:
        for completion in row:
            text = step_key(reply_of(i, completion))
            if text in seen[i] or len(kept[i]) >= n:
                spent[i][1] += completion.completion_tokens
                continue
            seen[i].add(text)
            kept[i].append(completion)

    for i, row in enumerate(outputs):
        take(i, row)
    for d in range(1, draws + 1):
        short = [i for i, row in enumerate(kept) if len(row) < n]
        if not short:
            break
        for i, row in zip(short, draw(short, d)):
            spent[i][0] += row[0].prompt_tokens if row else 0
            take(i, row)
    return kept, spent


def check_constraints(policy, cfg: SearchConfig) -> None:
    """With ``search.constrain`` on, ask a policy that can tell (a server) whether it applies call
    constraints before any episode relies on them: it raises ConfigError naming the setting, or
    turns them off with one warning (``RemoteConfig.require_constraints``)."""
    check = getattr(policy, "check_constraints", None)
    if cfg.constrain != "off" and callable(check):
        check("search.constrain", cfg.constrain)


def step_constraint(task, steps_taken: int, cfg: StepGroup, lead: str = "") -> CallConstraint | None:
    """The constrained-decoding rule of the next step (``cfg.constrain``; ``None`` when off).

    The constraint applies from the first generated character when the reply starts inside the
    opening fence (``code_prefix``, or a ``lead`` such as the router's prefill that holds it), else
    from the fence the model opens. A first step (nothing known yet, ``constrain_first_tool``) calls a listed tool as ``result = tool(...)``; the last
    allowed step (``constrain_last_finish``, ``steps_taken + 1 >= max_steps``) calls ``finish`` or
    ``give_up``. Shared by :func:`expand` and policy RL rollouts (``codetool.policy.rollout``).

    Args:
        task (`SearchTask`): its ``env.apis`` are the callable functions.
        steps_taken (`int`): steps already in the episode's history.
        cfg (`StepGroup`): ``constrain``, ``constrain_*``, ``max_steps``, ``code_prefix``, ``step_format``.
        lead (`str`): the text the reply already opens with (prefill and/or the fence).
    """
    if cfg.constrain == "off":
        return None
    first = not steps_taken and cfg.constrain_first_tool
    last = cfg.constrain_last_finish and steps_taken + 1 >= cfg.max_steps and not first
    return CallConstraint.for_functions(
        [] if last else [a.name for a in task.env.apis], ends=not first, assign=first,
        shape="opening" if cfg.constrain == "call" else "line",
        trigger="" if prefixed(cfg) or CODE_PREFIX in lead else CODE_PREFIX, answer_openings=ANSWER_OPENINGS, arguments=cfg.constrain_arguments)


# Under a constraint, finish's argument starts as a text or the last result (a small model otherwise
# passes invented variable names: NameError).
ANSWER_OPENINGS = ('"', "'", 'f"', "result", "str(result)")
