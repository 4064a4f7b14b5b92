"""The named reward functions of policy RL, each a TRL reward function with a weight in the recipe.

Each function gives every step of an episode a value (``per_step``: a float, or ``None`` where it
says nothing) and stores it on the episode (``Episode.step_rewards[name]``, what process
supervision reads); called by TRL it returns one number per episode:

- ``on_the_spot`` (per step): CodeTool's R_spot, 1 if the step's code ran and its tool calls
  succeeded (``codetool.rewards.on_the_spot``), 0 otherwise, from what the host recorded; a step
  that ran cleanly but did nothing new the host can see (:func:`free_steps`: no tool call and no
  end, only calls the episode already made, or an end before any tool was called) has no value
  (``None``), so padding an episode with free steps or repeated calls cannot raise it, and giving up
  at once does not score 1 (a failing step is 0);
- ``prm`` (per step): the PRM's latent reward of each step, the very item the search would score
  (:func:`codetool.search.step.prm_item`: query, tools, the history the policy saw, the step, and
  the public PRM's fields for ``format.interface: reference``), one ``score`` call per episode so
  its steps share their prefix; a step without code gets 0 (as in the search). The PRM reads the
  rendered steps, not the policy's token ids, so policy and PRM tokenizers may differ, and the PRM
  may run on another device or behind ``serve-prm``;
- ``tool_cost`` (per step, LIT): minus the step's tool cost (code cost + P+D+C of its API calls),
  summed over the episode whatever ``aggregate`` says (a plan costs the sum of its steps, LIT; a
  mean would pay for padding an episode with cheap steps);
- ``grounded`` (outcome): 1 when the episode finished with a non-empty answer that uses what a
  successful call of a listed tool returned (``codetool.rewards.grounded_success``), from a step
  that itself ran to its end (a ``finish`` called from a ``__del__`` of a step that then raised
  earns nothing), else 0; given to the last step;
- ``judged`` (outcome): the judge's verdict on the final answer (Solved 1 / Unsure 0.5 /
  Unsolved 0), asked only about a grounded answer (any other is 0 without a call: a judge's word
  never pays alone); a weak judge (a small local model) is refused unless ``allow_weak_judge``.
  Given to the last step;
- ``answer`` (outcome, the synthetic world): 1 when the episode finished, from a step that ran
  cleanly, with an answer that the query's answer key accepts (:func:`codetool.world.check_answer`:
  the known value, no competing one), else 0 (also on a query without a key); given to the last step.

An episode that says nothing about the policy (``Episode.dropped``: a step the executor could not
run, ``not_executed``, or a fault of the host) gets ``None`` from every reward function, for the
episode and each step: TRL then leaves it out of its group's baseline and gives it advantage 0
(its "unscorable" rows), and process advantages skip its steps (:mod:`codetool.policy.advantages`
ignores ``None``). It is never scored 0, and it is counted (``episodes/dropped``).

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from codetool.grounding import response_items, sent_items
from codetool.rewards import PRMItem, grounded_success, score_items
from codetool.search.config import StepGroup
from codetool.search.step import prm_item
from codetool.tools.names import canonical_arguments

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
    aggregate: dict[str, Callable[[list[float]], float]] = {"min": min, "mean": lambda v: sum(v) / len(v),
                                                            "last": lambda v: v[-1], "sum": sum}
    return aggregate[mode](defined)


class StepReward:
    """Base of the reward functions: ``per_step(episode)``; calling it returns one value per episode.

    Args:
        aggregate (`str`, *optional*, defaults to ``"mean"``): how per-step values become one.
    """

    name = "reward"
    outcome = False  # an outcome reward: the last step's value is the episode's, whatever the aggregate
    always: str | None = None  # an aggregate this reward always uses (tool cost: sum)

    def __init__(self, aggregate: str = "mean"):
        self.aggregate = aggregate
        self.__name__ = self.name  # TRL names reward functions by __name__ in its logs
        self.seconds = 0.0

    def per_step(self, episode: Episode) -> list[float | None]:
        raise NotImplementedError

    def score_episodes(self, episodes: list[Episode]) -> list[list[float | None]]:
        """``per_step`` of each episode (subclasses batch here)."""
        return [self.per_step(e) for e in episodes]

    def __call__(self, prompts=None, completions=None, episode: list[Episode] | None = None,
                 **kwargs) -> list[float | None]:
        episodes = list(episode or [])
        start = time.perf_counter()
        kept = [e for e in episodes if not e.dropped]
        scored = dict(zip(map(id, kept), self.score_episodes(kept)))
        self.seconds += time.perf_counter() - start
        out: list[float | None] = []
        for ep in episodes:
            if id(ep) not in scored:  # no information: out of the group, never a 0
                ep.step_rewards[self.name] = [None] * len(ep.steps)
                out.append(None)
                continue
            steps = ep.step_rewards[self.name] = scored[id(ep)]
            if self.outcome:
                out.append(float(steps[-1]) if steps and steps[-1] is not None else 0.0)
            else:
                out.append(aggregate(steps, self.always or self.aggregate))
        return out


class OnTheSpotReward(StepReward):
    """``on_the_spot``: each step's R_spot, ``None`` for a free step (:func:`free_steps`)."""

    name = "on_the_spot"

    def per_step(self, episode):
        free = free_steps(episode)
        return [None if f else float(s.candidate.r_spot) for s, f in zip(episode.steps, free)]


def free_steps(episode: Episode) -> list[bool]:
    """Which steps ran cleanly (R_spot 1) and did nothing new the host can see, so have no on-the-spot
    value (issue 37; a failing step is never free):

    - no tool call and no end (``finish``/``give_up``): padding (``x = 1``);
    - every tool call repeats a successful call of an earlier clean step, and no end: padding with a
      call the episode already made. A repeat is a call of the same function with the same arguments
      as the service reads them (``codetool.tools.names.canonical_arguments``: ``x=1``, ``x="1"`` and
      ``x=1.0`` alike) whose response holds the same salient items (``codetool.grounding``) beyond
      its arguments' (an echo of the argument's spelling aside); a poll whose answer changed is new,
      and so is a call with other arguments. The first clean run of a call after a step that failed
      is the recovery, and counts;
    - an end (``finish`` or ``give_up``) without a tool call, before any step of the episode called a
      tool, on a query that offers tools: an episode that never tried (its end step would otherwise
      score 1 and make giving up at once the best an on-the-spot reward can pay).

    Args:
        episode (`Episode`): the rollout (its steps' ``candidate.result``, ``candidate.r_spot``, ``ended``).
    Returns:
        One bool per step.
    """
    offers_tools = bool(episode.tool_names())
    made: set[tuple[str, str, frozenset[str]]] = set()  # the clean steps' successful calls (_call_key)
    tried = False  # an earlier step called a tool
    out = []
    for step in episode.steps:
        result = step.candidate.result
        calls: list[Any] = list(result.tool_calls) if result is not None else []
        clean = result is not None and bool(result.ok) and step.candidate.r_spot == 1.0
        if not calls:
            free = clean and (step.ended is None or (offers_tools and not tried))
        else:
            free = clean and step.ended is None and all(_call_key(c) in made for c in calls)
        out.append(free)
        tried = tried or bool(calls)
        if clean:
            made.update(_call_key(c) for c in calls if c.status == "ok")
    return out


def _call_key(call: Any) -> tuple[str, str, frozenset[str]]:
    """``(function, canonical arguments, items)``: a call as the service read it, and the salient items
    of its response beyond those of its arguments."""
    arguments = getattr(call, "arguments", None)
    arguments = arguments if isinstance(arguments, dict) else {"": arguments}
    told = response_items(getattr(call, "response", "") or "") - sent_items(arguments)
    return str(call.name), canonical_arguments(arguments), frozenset(told)


class ToolCostReward(StepReward):
    """``tool_cost``: minus each step's LIT tool cost, summed over the episode."""

    name = "tool_cost"
    always = "sum"

    def per_step(self, episode):
        return [-float(s.candidate.cost) for s in episode.steps]


class GroundedReward(StepReward):
    """``grounded``: 1 for a finish answer that uses a successful listed tool call's result, given by a
    step that ran cleanly; on the last step."""

    name = "grounded"
    outcome = True

    def per_step(self, episode):
        if not episode.steps:
            return []
        last = episode.steps[-1].candidate.result
        value = float(episode.finish_type == "finish" and last is not None and bool(last.ok)
                      and grounded_success(episode.final_answer, episode.calls(), episode.tool_names(),
                                            query=episode.task.query))
        return [None] * (len(episode.steps) - 1) + [value]


class AnswerReward(StepReward):
    """``answer``: 1 for a finish answer the query's answer key accepts (``task.extra["answer"]``), given
    by a step that ran cleanly; on the last step."""

    name = "answer"
    outcome = True

    def per_step(self, episode):
        from codetool.world import check_answer

        if not episode.steps:
            return []
        key = (episode.task.extra or {}).get("answer")
        last = episode.steps[-1].candidate.result
        value = float(isinstance(key, dict) and bool(key) and episode.finish_type == "finish"
                      and last is not None and bool(last.ok) and check_answer(key, episode.final_answer))
        return [None] * (len(episode.steps) - 1) + [value]


class JudgedReward(StepReward):
    """``judged``: the judge's score of the final answer, on the last step; 0 without asking when
    the answer is not grounded (the judge's word never pays alone).

    Args:
        judge (`codetool.judge.records.Judge`): labels answers (all of a batch in one call).
        allow_weak_judge (`bool`, *optional*, defaults to `False`): accept a judge flagged ``weak``.
    Raises:
        ValueError: a weak judge without ``allow_weak_judge``.
    """

    name = "judged"
    outcome = True

    def __init__(self, judge: Judge, aggregate: str = "mean", *, allow_weak_judge: bool = False):
        super().__init__(aggregate)
        if getattr(judge, "weak", False) and not allow_weak_judge:
            raise ValueError(f"the judged reward would train the policy on a weak judge's verdicts "
                             f"({getattr(judge, 'name', 'a local model')}: the embedded 135M judge rules an answer "
                             "that says it failed Solved); use an OpenAI-compatible judge (judge.model http(s)://...), "
                             "or set allow_weak_judge true to train on it anyway.")
        self.judge = judge
        self.grounded = GroundedReward(aggregate)

    def score_episodes(self, episodes):
        from codetool.judge.records import AnswerRequest

        grounded = {id(e): bool(g and g[-1]) for e, g in zip(episodes, self.grounded.score_episodes(episodes))}
        asked = [e for e in episodes if grounded[id(e)]]  # the judge can only lower a grounded answer
        verdicts = self.judge.judge_answers([AnswerRequest(e.task.query, e.final_answer) for e in asked]) if asked else []
        score = {id(e): v.score for e, v in zip(asked, verdicts)}
        return [[None] * (len(e.steps) - 1) + [float(score.get(id(e), 0.0))] if e.steps else [] for e in episodes]


class PRMReward(StepReward):
    """``prm``: the PRM's latent reward of every step, one ``score`` call per episode.

    Args:
        scorer (`PRMScorer`): a local scorer, a ``serve-prm`` client or any ``score(items)``.
        step (`StepGroup`, *optional*): the rollout's step settings (``step_format`` and
            ``observation_history`` shape what the PRM sees, as in the search); default: the group's.
    """

    name = "prm"

    def __init__(self, scorer: PRMScorer, aggregate: str = "mean", *, step: StepGroup | None = None):
        super().__init__(aggregate)
        self.scorer, self.step = scorer, step if step is not None else StepGroup()
        self.calls = 0

    def items(self, episode: Episode) -> list[PRMItem | None]:
        """The PRM item of each step, exactly the one the search would score after the same history
        (:func:`codetool.search.step.prm_item`: our fields and the public PRM's, so every
        ``format.interface`` reads its own; ``None`` for a step without code)."""
        return [prm_item(episode.task, step.history, step.candidate, step.observation, self.step)
                for step in episode.steps]

    def per_step(self, episode):
        items = self.items(episode)
        scored = [it for it in items if it is not None]
        self.calls += bool(scored)
        values = iter(score_items(self.scorer, scored))  # one per scored step, else ScorerFault
        return [0.0 if it is None else next(values) for it in items]


def build_rewards(weights: dict[str, float], *, aggregate: str, scorer: PRMScorer | None = None,
                  judge: Judge | None = None, allow_weak_judge: bool = False,
                  step: StepGroup | None = None) -> tuple[list[StepReward], list[float]]:
    """The reward functions of a setting and their weights (TRL's ``reward_funcs``/``reward_weights``).

    Args:
        weights (`dict[str, float]`): reward name -> weight (``RewardSetting.weights``).
        step (`StepGroup`, *optional*): the rollout's step settings (what the PRM reward sees).
        allow_weak_judge (`bool`, *optional*): accept a weak judge for ``judged`` (:class:`JudgedReward`).
    Raises:
        ValueError: ``prm`` without a scorer, ``judged`` without a judge (or with a weak one not
            allowed), or an unknown name.
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
            funcs.append(PRMReward(scorer, aggregate, step=step))
        elif name == "judged":
            if judge is None:
                raise ValueError("the judged reward needs a judge.")
            funcs.append(JudgedReward(judge, aggregate, allow_weak_judge=allow_weak_judge))
        else:
            raise ValueError(f"unknown reward {name!r}.")
    return funcs, [float(weights[f.name]) for f in funcs]
