"""One RL rollout: an :class:`Episode` of :class:`EpisodeStep` records, and its token row.

An episode is what the search would record for one query with one candidate per step, plus the
token row GRPO trains on: ``prompt_ids`` (the first step's prompt) and ``completion_ids`` (each
step's generated ids, then the ids of what the environment adds before the next step: the closing
fence, the observation turn, the next assistant header), with ``env_mask`` 1 on generated ids
and 0 on environment ids (TRL masks the latter out of the loss). ``span`` locates each step's
generated ids in ``completion_ids``.

Everything the rewards read is decided by the host, never by the sandbox's own printout: the
tool calls the host performed (``ExecutionResult.tool_calls``), the first ``finish``/``give_up``
it saw, the step's outcome. :func:`step_category` names what each step did, for the per-step
outcome histogram that makes reward hacking visible (a rising share of ``ok_no_tool`` steps, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codetool.rewards import not_executed
from codetool.search.records import Candidate

CATEGORIES = ("tool_ok", "tool_error", "ok_no_tool", "finish", "give_up", "no_code", "runtime_error", "timeout",
              "resource_limit", "sandbox_violation", "worker_lost", "host_error", "not_executed")


@dataclass
class EpisodeStep:
    """One step of an episode.

    Args:
        candidate (`Candidate`): the sampled step as the search records it (text, code, result,
            ``r_spot``, ``cost``, ``completion_tokens``).
        observation (`str`): what the policy sees next (``format_observation``).
        history (`list[dict]`): the chosen steps before this one, as the search's history entries
            (what the PRM item of this step is built from).
        span (`tuple[int, int]`): ``[start, end)`` of the step's generated ids in ``completion_ids``.
        exact (`bool`): the episode row's text equals the search's rendering of the next prompt
            (``False`` when the generated text ran past what the search keeps of it).
        constraint (`CallConstraint`, *optional*): the constrained-decoding rule the step was sampled
            under (``None``: free); the loss computes its log-probabilities under the same rule.
    """

    candidate: Candidate
    observation: str
    history: list[dict] = field(default_factory=list)
    span: tuple[int, int] = (0, 0)
    exact: bool = True
    constraint: Any = None

    @property
    def ended(self) -> str | None:
        """``finish`` or ``give_up`` when this step ended the episode."""
        result = self.candidate.result
        if result is None:
            return None
        if result.final_answer is not None:
            return "finish"
        return "give_up" if result.give_up_reason is not None else None


@dataclass
class Episode:
    """A whole rollout on one query.

    Args:
        task (`SearchTask`): the query and its tool environment.
        prompt_ids (`list[int]`): the first step's prompt, as the search renders it.
        completion_ids (`list[int]`), env_mask (`list[int]`): the rest of the row (see the module docstring).
        steps (`list[EpisodeStep]`): in order.
        finish_type (`str`): ``finish``, ``give_up``, ``max_steps`` or ``error``.
        final_answer (`str`, *optional*): ``finish``'s answer.
        error (`str`, *optional*): why an ``error`` episode ended.
        step_rewards (`dict[str, list]`): per reward name, one value (or ``None``) per step, filled
            by the reward functions (``codetool.policy.rewards``).
        seconds (`dict[str, float]`): ``generation``/``execution`` time spent on this episode.
        capped (`bool`): the row reached the policy's context, so no further step was sampled.
    """

    task: Any
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    steps: list[EpisodeStep] = field(default_factory=list)
    finish_type: str = "max_steps"
    final_answer: str | None = None
    error: str | None = None
    step_rewards: dict[str, list[float | None]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"generation": 0.0, "execution": 0.0})
    capped: bool = False

    @property
    def history(self) -> list[dict]:
        """The search's history entries of every step (``{"code", "text", "observation"}``)."""
        return [*self.steps[-1].history, _entry(self.steps[-1])] if self.steps else []

    @property
    def generated_tokens(self) -> int:
        """Tokens the policy generated in this episode (environment tokens excluded)."""
        return sum(self.env_mask)

    def tool_names(self) -> set[str]:
        """The functions the query offers."""
        return {api.name for api in self.task.env.apis}

    def calls(self) -> list:
        """Every tool call the host performed in this episode, in order."""
        return [c for s in self.steps if s.candidate.result is not None for c in s.candidate.result.tool_calls]

    @property
    def dropped(self) -> bool:
        """Whether the episode says nothing about the policy: a step the executor could not run
        (``not_executed``, a failure of the machine after its retries) or a fault of the host
        (``error``: its executor did not start or raised). Every reward function gives it ``None``,
        so GRPO leaves it out of its group (:mod:`codetool.policy.rewards`); it is never scored 0."""
        return self.finish_type == "error" or any(not_executed(s.candidate.result) for s in self.steps)


def _entry(step: EpisodeStep) -> dict:
    from codetool.search.prompt import history_entry

    return history_entry(step.candidate, step.observation)


def step_category(step: EpisodeStep, tool_names: set[str]) -> str:
    """What one step did, one of :data:`CATEGORIES` (the per-step outcome histogram).

    Order: no code; not executed (the machine's failure); a failure of the run (its ``outcome``);
    ``finish``/``give_up``; a failed tool
    call; a successful call of a listed tool; else ``ok_no_tool`` (the code ran and called none).
    """
    cand = step.candidate
    result = cand.result
    if cand.code is None or result is None or result.outcome == "no_code":
        return "no_code"
    if not_executed(result):
        return "not_executed"
    if not result.ok:
        return result.outcome if result.outcome in CATEGORIES else "runtime_error"
    if step.ended:
        return step.ended
    if any(c.status != "ok" for c in result.tool_calls):
        return "tool_error"
    if any(c.status == "ok" and c.name in tool_names for c in result.tool_calls):
        return "tool_ok"
    return "ok_no_tool"
