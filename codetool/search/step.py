"""One candidate step, taken the same way by the search, the tree builder and the RL rollout.

A step is asked for, read, run, rewarded on the spot, shown and scored by the functions here, each
reading the step settings of :class:`~codetool.search.config.StepGroup`:

- asked for: :func:`reply_lead` (what the reply already opens with: the router's prefill on a first
  step, then the opening fence under ``code_prefix``) and :func:`stop_words`; the constrained
  decoding rule is :func:`codetool.search.expand.step_constraint`;
- read and run: :func:`run_step` turns the sampled text into the reply the search keeps
  (:func:`reply_text`), parses its code, runs it (in a fork of the node's executor for the search
  and the trees, in the episode's own executor for a rollout), and gives the candidate its
  on-the-spot reward, its LIT cost and the observation the policy sees next
  (``observation_cut`` included);
- scored: :func:`prm_item` is what the PRM reads of the step, under both PRM interfaces (our
  fields and the public CodeTool PRM's ``step_text``/``previous_steps``/``parent_result``); a step
  without code has no item (its latent reward is 0, in the search as in the RL reward).

``codetool.search.expand`` (the search and the trees) and ``codetool.policy.rollout`` (GRPO
episodes) both call these, so for the same sampled text and tools they record identical
candidates, observations and PRM items (``tests/test_search_step.py``). Generation itself differs
only in its input (a chat prompt for the search's backends, a token row for a rollout).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codetool.executor.result import (
    ExecutionResult,
    StepExecutor,
    host_error_result,
    no_code_result,
)
from codetool.rewards import PRMItem, ToolCostTable, on_the_spot, step_cost
from codetool.search.prompt import (
    CODE_PREFIX,
    format_observation,
    parse_candidate,
    reference_prm_fields,
    step_plan,
    visible_history,
)
from codetool.search.records import Candidate, ImportedResult
from codetool.secrets import redact

if TYPE_CHECKING:
    from codetool.search.config import StepGroup

logger = logging.getLogger(__name__)


@dataclass
class Expanded:
    """A sampled, executed candidate and the executor that holds its state (``None`` when the
    reply had no code and nothing ran, or when it ran in the caller's own executor; the caller
    owns and must close a fork)."""

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


def prefixed(cfg: StepGroup) -> bool:
    """Whether each reply starts inside an opening ```python fence (``code_prefix`` with ``code_only``)."""
    return bool(cfg.code_prefix) and cfg.step_format == "code_only"


def stop_words(cfg: StepGroup) -> list[str] | None:
    """Where sampling stops: at the closing fence when the reply starts inside the opening one."""
    return ["```"] if prefixed(cfg) else None


def reply_lead(cfg: StepGroup, prefill: str = "") -> str:
    """The text a reply already opens with: ``prefill`` (the router's, a first step only), then the
    opening fence under ``code_prefix`` (unless the prefill ends with it)."""
    lead = prefill
    if prefixed(cfg) and not lead.endswith(CODE_PREFIX):
        lead += CODE_PREFIX
    return lead


def reply_text(generated: str, lead: str, cfg: StepGroup) -> str:
    """The reply as the search keeps it: a prefixed reply gets its lead and closing fence back
    (sampling stopped at the fence), a prefill its lead; otherwise the text as sampled."""
    if prefixed(cfg) and not generated.lstrip().startswith("```"):
        return f"{lead}{generated}\n```"
    if lead and not prefixed(cfg):
        return lead + generated
    return generated


_COST_TABLES: dict[str | None, ToolCostTable] = {}


def cost_table(cfg: StepGroup) -> ToolCostTable:
    """The LIT cost table of ``cfg.cost_table`` (loaded once per path)."""
    if cfg.cost_table not in _COST_TABLES:
        _COST_TABLES[cfg.cost_table] = ToolCostTable.load(cfg.cost_table)
    return _COST_TABLES[cfg.cost_table]


def run_step(state: StepExecutor | None, text: str, task: Any, cfg: StepGroup, *, index: int = 0,
             prompt_tokens: int = 0, completion_tokens: int = 0, fork: bool = True) -> Expanded:
    """Read, run and reward one sampled reply.

    Args:
        state (`StepExecutor`): the node's executor (``None`` only when the reply has no code).
        text (`str`): the reply as the search keeps it (:func:`reply_text`).
        task (`SearchTask`): its ``env`` names the APIs of the tool calls (for the cost).
        cfg (`StepGroup`): ``observation_cut``, ``max_observation_chars``, ``tool_error_is_failure``,
            ``cost_table``.
        index (`int`): the candidate's index among its siblings.
        fork (`bool`, *optional*, defaults to `True`): run in a ``fork()`` of ``state`` (returned as
            ``Expanded.state``; the search and the trees) or in ``state`` itself (a rollout).
    Returns:
        The :class:`Expanded` candidate. A fault of the executor itself (it raised instead of
        reporting) gives a ``host_error`` result, which ends the episode or the tree as an error.
    """
    parsed = parse_candidate(text)
    cand = Candidate(index=index, text=text, code=parsed.code, prompt_tokens=prompt_tokens,
                     completion_tokens=completion_tokens)
    child = None
    if parsed.code is None:
        cand.result = no_code_result(parsed.error)
    else:
        child, cand.result = _execute(state, parsed.code, fork)
    cand.r_spot = on_the_spot(cand.result, tool_error_is_failure=cfg.tool_error_is_failure)
    called = [task.env.api_for(c.name) for c in cand.result.tool_calls]
    cand.cost = step_cost(parsed.code or "", [a for a in called if a is not None], cost_table(cfg))
    observation = format_observation(cand.result, max_chars=cfg.max_observation_chars, parse_error=parsed.error,
                                     cut=cfg.observation_cut)
    return Expanded(cand, child if fork else None, observation, parsed.error)


def _execute(state, code: str, fork: bool) -> tuple[Any, ExecutionResult]:
    """Run ``code`` in a fork of ``state`` (or in ``state``): ``(fork or None, result)``."""
    child = None
    try:
        child = state.fork() if fork else state
        return child, child.run(code)
    except Exception as exc:  # noqa: BLE001 - recorded on the episode, the run goes on
        if fork and child is not None:
            try:
                child.close()
            except Exception:  # noqa: BLE001 - already failing
                logger.debug("could not close a failed fork", exc_info=True)
        message = redact(f"{type(exc).__name__}: {exc}")[:2000]
        return None, host_error_result(message, type(exc).__name__)


def step_item(query: str, tools: str, history: list[dict], code: str | None, text: str | None, observation: str, *,
              step_format: str = "code_only", observation_history: str = "all") -> PRMItem:
    """Our PRM interface's fields of a step (``interface: ours``): the query, the tools, the history
    as the policy saw it (:func:`~codetool.search.prompt.visible_history`), the step's code, its
    output and, with ``step_text``, its plan line. The tree builder's training rows use the same."""
    return PRMItem(query=query, tools=tools,
                   history=visible_history(history, observation_history, step_format),
                   candidate=code or "", candidate_output=observation,
                   candidate_plan=step_plan(text) if step_format == "step_text" else "")


def prm_item(task: Any, history: list[dict], candidate: Candidate, observation: str,
             cfg: StepGroup) -> PRMItem | None:
    """What the PRM scores of ``candidate`` after ``history`` (the chosen steps before it, as
    history entries), under every PRM interface: :func:`step_item` plus the public PRM's fields
    (:func:`~codetool.search.prompt.reference_prm_fields`). ``None`` for a reply without code:
    its latent reward is 0 (docs/FIDELITY.md: the public search scores it with the PRM)."""
    if candidate.code is None:
        return None
    item = step_item(task.query, task.env.render(), history, candidate.code, candidate.text, observation,
                     step_format=cfg.step_format, observation_history=cfg.observation_history)
    for key, value in reference_prm_fields(history, candidate.text).items():
        setattr(item, key, value)
    return item
