"""The settings of the stepwise search and its strategies (``search:`` in a recipe).

Below :mod:`codetool.search.expand` and every strategy, so that sampling, the episode mechanics
(:mod:`codetool.search.episode`) and the strategies read one config without importing each other.
Field names and defaults are what the recipes and the stage hashes are written against: a rename
here changes every recipe's hash.

The search's settings are config groups (issue 42), each documented with who reads it, composed by
inheritance so that the recipe keys stay flat (``search.k``): :class:`CandidateGroup` < :class:`StepGroup`
(one candidate step, issue 38; how many an episode takes), :class:`SamplingGroup` <
:class:`SelectionGroup` (how candidates are sampled; how many and which is kept),
:class:`LatentRewardGroup` < :class:`LatentGroup` (the latent reward), :class:`StrategyGroup` (with
the vote and the budget) and :class:`ScheduleGroup` < :class:`SchedulingGroup`. :class:`SearchConfig`
composes them all; ``build-trees``' ``search:`` composes the candidate, sampling and schedule groups
only, and ``train-policy``'s ``rollout:`` the step group only, so a key they never read does not
exist there (:func:`codetool.config.from_dict` refuses it naming the command). The search, the tree
builder and the RL rollout read a step through one function, :func:`codetool.search.step.run_step`,
so the three cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from codetool.config import ConfigError, option
from codetool.config_groups import Group
from codetool.search.allocation import VOTING, BudgetGroup
from codetool.search.prompt import OBSERVATION_HISTORIES, STEP_FORMATS
from codetool.search.schedule import SCHEDULES
from codetool.search.vote import VoteGroup

STRATEGY_NAMES = ("greedy", "best_of_n", "beam", "lookahead", "dvts", "compute_optimal")


@dataclass
class CandidateGroup(Group):
    """One candidate step, whatever the episode around it: how it is asked for (format, length,
    constrained decoding), run (the on-the-spot reward's tool-error rule, the LIT cost table) and
    shown next (the observation). Read by :func:`codetool.search.step.run_step`,
    :func:`codetool.search.expand.step_constraint` and the prompts; composed by :class:`StepGroup`
    and by ``build-trees``' ``search:`` (:class:`codetool.tree.config.TreeSearch`), whose depth is
    its own ``max_depth``."""

    max_new_tokens: int = option(256, "tokens per candidate step")
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
    observation_cut: str = option("middle", "how an output longer than max_observation_chars is cut: middle (head "
                                  "and tail, ours) or head (its first characters, as the public code's [0:500])",
                                  choices=["middle", "head"])

    def __post_init__(self):
        super().__post_init__()
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")


@dataclass
class StepGroup(CandidateGroup):
    """One candidate step (:class:`CandidateGroup`) and how many an episode may take. Composed by
    :class:`SearchConfig` and by ``train-policy``'s ``rollout:`` (``codetool.policy.config``); read
    by :func:`codetool.search.step.run_step` and the episode loop (:mod:`codetool.search.episode`)."""

    max_steps: int = option(5, "steps before an episode ends as max_steps")

    def __post_init__(self):
        super().__post_init__()
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}.")


STEP_KEYS = tuple(f.name for f in dataclasses.fields(StepGroup))


@dataclass
class SamplingGroup(Group):
    """How each candidate is sampled: read by :func:`codetool.search.expand.expand_each` (the
    search, the trees and the rollouts of ``latent: rollout`` and ``lookahead``, whose own
    temperature defaults to this one). Composed by :class:`SelectionGroup` and by ``build-trees``'
    ``search:``."""

    temperature: float = option(0.9, "sampling temperature (0 = greedy)")
    top_p: float = option(0.95, "nucleus sampling threshold")

    def __post_init__(self):
        super().__post_init__()
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"search.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"search.top_p must be in (0, 1], got {self.top_p}.")


@dataclass
class SelectionGroup(SamplingGroup):
    """How many candidates a step samples (:class:`SamplingGroup`) and how the search picks one:
    the reward weights (:mod:`codetool.search.scores`), ties (``tie_break`` with ``seed``, which also
    seeds the sampling) and the method's name in the records. Read by the strategies
    (:mod:`codetool.search.episode`, ``greedy``, ``best_of_n``, ``beam``, ``lookahead``, ``dvts``)
    and ``run``'s job (:mod:`codetool.jobs.queries`); composed by :class:`SearchConfig` only (the
    trees sample ``branching`` candidates and keep them all)."""

    method: str = option("spot+latent", "name of this method in trajectories and reports")
    k: int = option(2, "candidates sampled per step (1 = no search)")
    w_spot: float = option(1.0, "weight of the on-the-spot reward")
    w_latent: float = option(1.0, "weight of the latent reward")
    w_cost: float = option(0.0, "weight of the LIT tool cost (subtracted)")
    seed: int | None = option(0, "sampling seed (none = nondeterministic)")
    tie_break: str = option("random", "equal selection scores: random (a pick seeded by search.seed, the query "
                            "and the step; the reference ablation), first (the earlier sample among scores equal "
                            "to 1e-9) or reference (the public code's main method: exact comparison, the "
                            "earliest of the best wins)", choices=["random", "first", "reference"])

    def __post_init__(self):
        super().__post_init__()
        if self.k < 1:
            raise ConfigError(f"search.k must be >= 1, got {self.k}.")


@dataclass
class LatentRewardGroup(Group):
    """The constants of CodeTool's latent reward ``alpha^(1-LR) beta^(tau/L)`` (§3.3;
    :func:`codetool.rewards.latent_reward`). Composed by :class:`LatentGroup` (the search's Monte
    Carlo estimate) and by ``build-trees`` (its labels; a recipe's ``trees.alpha``)."""

    alpha: float = option(0.9, "latent reward: alpha^(1-LR)")
    beta: float = option(0.95, "latent reward: beta^(tau/L)")
    max_len: float = option(20.0, "latent reward: L, the path-length normaliser")


@dataclass
class LatentGroup(LatentRewardGroup):
    """Where the search's latent reward comes from: the PRM, Monte Carlo rollouts (their count,
    length, temperature and value; the last two also score ``lookahead``'s rollouts) or nothing.
    Read by :mod:`codetool.search.rollout`, :mod:`codetool.search.lookahead`, :mod:`codetool.assemble`
    and ``run``'s job; composed by :class:`SearchConfig` only."""

    latent: str = option("prm", "latent reward source", choices=["prm", "rollout", "none"])
    rollouts: int = option(2, "rollouts per candidate when latent=rollout (m)")
    rollout_max_steps: int = option(3, "steps per rollout when latent=rollout")
    rollout_temperature: float | None = option(None, "sampling temperature of rollouts (lookahead, latent=rollout); "
                                               "none = search.temperature, 0 = greedy rollouts")
    rollout_value: str = option("auto", "value of a rollout (lookahead, latent=rollout): success (CodeTool's Monte "
                                "Carlo latent reward alpha^(1-LR) beta^(tau/L) of grounded successes), prm (the "
                                "PRM's score of the rollout's last step, as search-and-learn's lookahead), auto "
                                "(prm when a PRM is loaded, else success)", choices=["auto", "success", "prm"])

    def __post_init__(self):
        super().__post_init__()
        if self.latent == "rollout" and self.rollouts < 1:
            raise ConfigError(f"search.rollouts must be >= 1 with latent=rollout, got {self.rollouts}.")


@dataclass
class StrategyGroup(VoteGroup, BudgetGroup):
    """Which search runs over the steps and its shape: the strategy (``codetool.assemble.STRATEGIES``),
    best-of-n's and DVTS's ``n``, beam and DVTS's ``beam_width``, lookahead's depth, how a
    trajectory's score aggregates its steps' PRM scores, the answer vote
    (:class:`~codetool.search.vote.VoteGroup`) and compute-optimal's budget
    (:class:`~codetool.search.allocation.BudgetGroup`). Read by the strategy modules and
    :mod:`codetool.search.compute_optimal`; composed by :class:`SearchConfig` only."""

    strategy: str = option("greedy", "search over steps: greedy (CodeTool: keep the best candidate per step), "
                           "best_of_n, beam, lookahead, dvts (diverse verifier tree search: n/beam_width independent "
                           "beams) or compute_optimal (per query, a strategy and a share of search.budget by estimated "
                           "difficulty) (codetool.assemble.STRATEGIES)", choices=list(STRATEGY_NAMES))
    n: int = option(4, "best_of_n: independent greedy episodes per query; dvts: paths kept per step over all "
                    "subtrees (n/beam_width subtrees)")
    aggregate: str = option("last", "best_of_n/beam/dvts: a trajectory's score from its chosen steps' PRM scores: "
                            "last step, product or minimum", choices=["last", "prod", "min"])
    beam_width: int = option(2, "beam: partial trajectories kept per step (B); dvts: those of each subtree (w); "
                             "each is expanded with k")
    lookahead_depth: int = option(1, "lookahead: steps of the single-sample rollout (at search.rollout_temperature) "
                                 "that scores each candidate (d)")

    def __post_init__(self):
        super().__post_init__()  # the vote's and the budget's checks
        for name in ("n", "beam_width", "lookahead_depth"):
            if getattr(self, name) < 1:
                raise ConfigError(f"search.{name} must be >= 1, got {getattr(self, name)}.")
        if self.strategy == "dvts" and self.n % self.beam_width:
            raise ConfigError(f"search.strategy dvts runs n/beam_width subtrees: search.n ({self.n}) must be a "
                              f"multiple of search.beam_width ({self.beam_width}).")
        if self.vote != "none" and self.strategy not in VOTING:
            raise ConfigError(f"search.vote {self.vote} needs several finished trajectories per query, but strategy "
                              f"{self.strategy} keeps one: use best_of_n, beam, dvts or compute_optimal, or vote none.")
        if (self.budget is None) == (self.strategy == "compute_optimal"):
            raise ConfigError("search.budget (generated tokens per query on average) is what strategy compute_optimal "
                              f"shares out and is read by it only; got strategy {self.strategy} with budget "
                              f"{self.budget}: set both or neither.")


@dataclass
class ScheduleGroup(Group):
    """How samples share the policy: rounds or continuous (:mod:`codetool.search.schedule`). Read by
    the search (:mod:`codetool.search.episode`) and the tree builder (:mod:`codetool.tree.grow`,
    :mod:`codetool.jobs.trees`); composed by :class:`SchedulingGroup` and ``build-trees``' ``search:``."""

    schedule: str = option("auto", "how episodes share the policy: rounds (all episodes' prompts in one generate "
                           "call per step, as a local model wants), continuous (each episode advances as soon as "
                           "its own generation returns, as a server wants), auto (continuous for http(s) "
                           "policies)", choices=list(SCHEDULES))


@dataclass
class SchedulingGroup(ScheduleGroup):
    """How ``run``'s episodes are run (:class:`ScheduleGroup`): how many are in flight and whether
    each is re-run afterwards as the public code runs it (``reference_steps``). Read by ``run``'s job
    (:mod:`codetool.jobs.queries`) and the episode loop; composed by :class:`SearchConfig` only."""

    concurrency: int | None = option(None, "episodes in flight (none: 4 under batched rounds, whose generations "
                                     "share forward passes; under continuous scheduling enough to fill the policy "
                                     "client twice over: 2 x policy_client.max_in_flight / k)")
    reference_steps: bool = option(True, "after each episode, re-run its chosen steps as the public CodeTool code "
                                   "does (earlier steps' first code blocks with prints stripped, then the step; one "
                                   "sandbox per trajectory) and record their status and output: SCEP as the public "
                                   "code counts it and answer.final_answer reference read them")

    def __post_init__(self):
        super().__post_init__()
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"search.concurrency must be >= 1, got {self.concurrency}.")


@dataclass
class SearchConfig(SchedulingGroup, StrategyGroup, LatentGroup, SelectionGroup, StepGroup):
    """Settings of the stepwise search (``search:`` of ``run``, ``eval-decision``, the pipeline and
    ``train-policy``'s ``eval_search``): the step (:class:`StepGroup`), selection and sampling
    (:class:`SelectionGroup`), latent reward (:class:`LatentGroup`), strategy
    (:class:`StrategyGroup`) and scheduling (:class:`SchedulingGroup`) groups, and the checks that
    span two of them. Paper defaults: K=2, temperature 0.9, top_p 0.95, at most 5 steps, weights
    1/1/0 (CodeTool §4.1)."""

    def __post_init__(self):
        super().__post_init__()  # the groups' checks
        if self.strategy == "lookahead" and self.w_latent <= 0:
            raise ConfigError(f"search.strategy lookahead scores each candidate by its rollout through the latent "
                              f"reward, but search.w_latent is {self.w_latent}: set search.w_latent > 0 (e.g. 1), "
                              "or use strategy greedy.")
        if self.strategy == "compute_optimal" and "lookahead" in self.level_strategies and self.w_latent <= 0:
            raise ConfigError("search.level_strategies names lookahead, which scores candidates through the latent "
                              f"reward, but search.w_latent is {self.w_latent}: set it > 0 or drop lookahead.")
