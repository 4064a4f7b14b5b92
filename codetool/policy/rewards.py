"""The named reward functions of policy RL, each a TRL reward function with a weight in the recipe.

Each function gives every step of an episode a value (``per_step``: a float, or ``None`` where it
says nothing) and stores it on the episode (``Episode.step_rewards[name]``, what process
supervision reads); called by TRL it returns one number per episode:

- ``on_the_spot`` (per step): CodeTool's R_spot, 1 if the step's code ran and its tool calls
  succeeded (``codetool.rewards.on_the_spot``), 0 otherwise, from what the host recorded;
- ``prm`` (per step): the PRM's latent reward of each step, the item the search would score
  (query, tools, the history the policy saw, the step), one ``score`` call per episode so its
  steps share their prefix; a step without code gets 0 (as in the search). The PRM reads the
  rendered steps, not the policy's token ids, so policy and PRM tokenizers may differ, and the PRM
  may run on another device or behind ``serve-prm``;
- ``tool_cost`` (per step, LIT): minus the step's tool cost (code cost + P+D+C of its API calls);
- ``grounded`` (outcome): 1 when the episode finished with a non-empty answer after at least one
  successful call of a listed tool (``codetool.rewards.grounded_success``), else 0; given to the
  last step;
- ``judged`` (outcome): the judge's verdict on the final answer (Solved 1 / Unsure 0.5 /
  Unsolved 0; no answer is Unsolved without a call); given to the last step;
- ``answer`` (outcome, the synthetic world): 1 when the episode finished with an answer that the
  query's answer key accepts (:func:`codetool.world.check_answer`: the known value, no competing
  one), else 0 (also on a query without a key); given to the last step.

Sequence-level GRPO needs one number per episode: a per-step reward is reduced by ``aggregate``
(``min``, ``mean``, ``last`` or ``sum`` of its defined values, 0 for none); an outcome reward is
its own value whatever the aggregate.

Integrity: every value comes from host-side records (tool calls the host performed, the first
``finish`` it saw, the run's outcome), never from what the code printed; a step that rebinds
the tool proxies, prints text shaped like a tool's reply, or finishes with an invented answer
earns no outcome reward (``tests/test_policy_integrity.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from codetool.rewards import PRMItem, grounded_success
from codetool.search.prompt import step_plan, visible_history

from .episode import Episode

if TYPE_CHECKING:
    from codetool.judge.records import Judge
    from codetool.rewards import PRMScorer

logger = logging.getLogger(__name__)


def aggregate(values: Sequence[float | None], mode: str) -> float:
    """One number from per-step values: ``min``, ``mean``, ``last`` or ``sum`` of the defined ones
    (0.0 when none is defined).

    Raises:
        ValueError: an unknown ``mode``.
    """
    defined = [float(v) for v in values if v is not None]
    if mode not in ("min", "mean", "last", "sum"):
        raise ValueError(f"aggregate must be min, mean, last or sum, got {mode!r}.")
    if not defined:
        return 0.0
    return {"min": min, "mean": lambda v: sum(v) / len(v), "last": lambda v: v[-1], "sum": sum}[mode](defined)


class StepReward:
    """Base of the reward functions: ``per_step(episode)``; calling it returns one value per episode.

    Args:
        aggregate (`str`, *optional*, defaults to ``"mean"``): how per-step values become one.
    """

    name = "reward"
    outcome = False  # an outcome reward: the last step's value is the episode's, whatever the aggregate

    def __init__(self, aggregate: str = "mean"):
        self.aggregate = aggregate
        self.__name__ = self.name  # TRL names reward functions by __name__ in its logs
        self.seconds = 0.0

    def per_step(self, episode: Episode) -> list[float | None]:
        raise NotImplementedError

    def score_episodes(self, episodes: list[Episode]) -> list[list[float | None]]:
        """``per_step`` of each episode (subclasses batch here)."""
        return [self.per_step(e) for e in episodes]

    def __call__(self, prompts=None, completions=None, episode: list[Episode] | None = None, **kwargs) -> list[float]:
        episodes = list(episode or [])
        start = time.perf_counter()
        values = self.score_episodes(episodes)
        self.seconds += time.perf_counter() - start
        out = []
        for ep, steps in zip(episodes, values):
            ep.step_rewards[self.name] = steps
            if self.outcome:
                out.append(float(steps[-1]) if steps and steps[-1] is not None else 0.0)
            else:
                out.append(aggregate(steps, self.aggregate))
        return out


class OnTheSpotReward(StepReward):
    """``on_the_spot``: each step's R_spot (see the module docstring)."""

    name = "on_the_spot"

    def per_step(self, episode):
        return [float(s.candidate.r_spot) for s in episode.steps]


class ToolCostReward(StepReward):
    """``tool_cost``: minus each step's LIT tool cost."""

    name = "tool_cost"

    def per_step(self, episode):
        return [-float(s.candidate.cost) for s in episode.steps]


class GroundedReward(StepReward):
    """``grounded``: 1 for a finish answer after a successful call of a listed tool, on the last step."""

    name = "grounded"
    outcome = True

    def per_step(self, episode):
        if not episode.steps:
            return []
        value = float(episode.finish_type == "finish"
                      and grounded_success(episode.final_answer, episode.calls(), episode.tool_names()))
        return [None] * (len(episode.steps) - 1) + [value]


class AnswerReward(StepReward):
    """``answer``: 1 for a finish answer the query's answer key accepts (``task.extra["answer"]``)."""

    name = "answer"
    outcome = True

    def per_step(self, episode):
        from codetool.world import check_answer

        if not episode.steps:
            return []
        key = (episode.task.extra or {}).get("answer")
        value = float(bool(key) and episode.finish_type == "finish" and check_answer(key, episode.final_answer))
        return [None] * (len(episode.steps) - 1) + [value]


class JudgedReward(StepReward):
    """``judged``: the judge's score of the final answer, on the last step.

    Args:
        judge (`codetool.judge.records.Judge`): labels answers (all of a batch in one call).
    """

    name = "judged"
    outcome = True

    def __init__(self, judge: Judge, aggregate: str = "mean"):
        super().__init__(aggregate)
        self.judge = judge

    def score_episodes(self, episodes):
        from codetool.judge.records import AnswerRequest

        asked = [e for e in episodes if e.finish_type == "finish" and (e.final_answer or "").strip()]
        verdicts = self.judge.judge_answers([AnswerRequest(e.task.query, e.final_answer) for e in asked]) if asked else []
        score = {id(e): v.score for e, v in zip(asked, verdicts)}
        return [[None] * (len(e.steps) - 1) + [float(score.get(id(e), 0.0))] if e.steps else [] for e in episodes]


class PRMReward(StepReward):
    """``prm``: the PRM's latent reward of every step, one ``score`` call per episode.

    Args:
        scorer (`PRMScorer`): a local scorer, a ``serve-prm`` client or any ``score(items)``.
        step_format, observation_history (`str`): as the rollout's (what the PRM sees, as in the search).
    """

    name = "prm"

    def __init__(self, scorer: PRMScorer, aggregate: str = "mean", *, step_format: str = "code_only",
                 observation_history: str = "all"):
        super().__init__(aggregate)
        self.scorer, self.step_format, self.observation_history = scorer, step_format, observation_history
        self.calls = 0

    def items(self, episode: Episode) -> list[PRMItem | None]:
        """The PRM item of each step (``None`` for a step without code)."""
        task = episode.task
        out: list[PRMItem | None] = []
        for step in episode.steps:
            cand = step.candidate
            if cand.code is None:
                out.append(None)
                continue
            out.append(PRMItem(query=task.query, tools=task.env.render(),
                               history=visible_history(step.history, self.observation_history, self.step_format),
                               candidate=cand.code, candidate_output=step.observation,
                               candidate_plan=step_plan(cand.text) if self.step_format == "step_text" else ""))
        return out

    def per_step(self, episode):
        items = self.items(episode)
        scored = [it for it in items if it is not None]
        values = iter(self.scorer.score(scored)) if scored else iter(())
        self.calls += bool(scored)
        return [0.0 if it is None else float(next(values)) for it in items]


def build_rewards(weights: dict[str, float], *, aggregate: str, scorer: PRMScorer | None = None,
                  judge: Judge | None = None,
                  step_format: str = "code_only", observation_history: str = "all") -> tuple[list[StepReward], list[float]]:
    """The reward functions of a setting and their weights (TRL's ``reward_funcs``/``reward_weights``).

    Args:
        weights (`dict[str, float]`): reward name -> weight (``RewardSetting.weights``).
    Raises:
        ValueError: ``prm`` without a scorer, ``judged`` without a judge, or an unknown name.
    """
    funcs: list[StepReward] = []
    for name in weights:
        if name == "on_the_spot":
            funcs.append(OnTheSpotReward(aggregate))
        elif name == "tool_cost":
            funcs.append(ToolCostReward(aggregate))
        elif name == "grounded":
            funcs.append(GroundedReward(aggregate))
        elif name == "answer":
            funcs.append(AnswerReward(aggregate))
        elif name == "prm":
            if scorer is None:
                raise ValueError("the prm reward needs a PRM scorer.")
            funcs.append(PRMReward(scorer, aggregate, step_format=step_format, observation_history=observation_history))
        elif name == "judged":
            if judge is None:
                raise ValueError("the judged reward needs a judge.")
            funcs.append(JudgedReward(judge, aggregate))
        else:
            raise ValueError(f"unknown reward {name!r}.")
    return funcs, [float(weights[f.name]) for f in funcs]
