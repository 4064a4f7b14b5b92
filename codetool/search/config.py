"""The settings of the stepwise search and its strategies (``search:`` in a recipe).

Below :mod:`codetool.search.expand` and every strategy, so that sampling, the episode mechanics
(:mod:`codetool.search.episode`) and the strategies read one config without importing each other.
Field names and defaults are what the recipes and the stage hashes are written against: a rename
here changes every recipe's hash.

:class:`StepGroup` is the config group of one candidate step (issue 38): how many steps an episode
may take, how each is asked for, run, rewarded on the spot and shown to the policy next. The search
(:class:`SearchConfig` composes it), the tree builder (its ``search:``) and the RL rollout
(``train-policy``'s ``rollout:``, which composes nothing else) read it through one function,
:func:`codetool.search.step.run_step`, so the three cannot drift apart.
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
class StepGroup(Group):
    """One candidate step: how many an episode may take, how each is asked for (format, length,
    constrained decoding), run (the on-the-spot reward's tool-error rule, the LIT cost table) and
    shown next (the observation). Composed by :class:`SearchConfig` (the search and the trees) and
    by ``train-policy``'s ``rollout:`` (``codetool.policy.config``); read by
    :func:`codetool.search.step.run_step` and :func:`codetool.search.expand.step_constraint`."""

    max_steps: int = option(5, "steps before an episode ends as max_steps")
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
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")


STEP_KEYS = tuple(f.name for f in dataclasses.fields(StepGroup))


@dataclass
class SearchConfig(StepGroup, VoteGroup, BudgetGroup):
    """Settings of the stepwise search: the step group (:class:`StepGroup`) and the sampling,
    selection and strategy settings. Paper defaults: K=2, temperature 0.9, top_p 0.95, at most 5
    steps, weights 1/1/0 (CodeTool §4.1)."""

    method: str = option("spot+latent", "name of this method in trajectories and reports")
    k: int = option(2, "candidates sampled per step (1 = no search)")
    temperature: float = option(0.9, "sampling temperature (0 = greedy)")
    top_p: float = option(0.95, "nucleus sampling threshold")
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
    seed: int | None = option(0, "sampling seed (none = nondeterministic)")
    tie_break: str = option("random", "equal selection scores: random (a pick seeded by search.seed, the query "
                            "and the step; the reference ablation), first (the earlier sample among scores equal "
                            "to 1e-9) or reference (the public code's main method: exact comparison, the "
                            "earliest of the best wins)", choices=["random", "first", "reference"])
    reference_steps: bool = option(True, "after each episode, re-run its chosen steps as the public CodeTool code "
                                   "does (earlier steps' first code blocks with prints stripped, then the step; one "
                                   "sandbox per trajectory) and record their status and output: SCEP as the public "
                                   "code counts it and answer.final_answer reference read them")
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
    rollout_temperature: float | None = option(None, "sampling temperature of rollouts (lookahead, latent=rollout); "
                                               "none = search.temperature, 0 = greedy rollouts")
    rollout_value: str = option("auto", "value of a rollout (lookahead, latent=rollout): success (CodeTool's Monte "
                                "Carlo latent reward alpha^(1-LR) beta^(tau/L) of grounded successes), prm (the "
                                "PRM's score of the rollout's last step, as search-and-learn's lookahead), auto "
                                "(prm when a PRM is loaded, else success)", choices=["auto", "success", "prm"])

    def __post_init__(self):
        super().__post_init__()  # the groups' checks
        if self.k < 1:
            raise ConfigError(f"search.k must be >= 1, got {self.k}.")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"search.concurrency must be >= 1, got {self.concurrency}.")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"search.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"search.top_p must be in (0, 1], got {self.top_p}.")
        if self.latent == "rollout" and self.rollouts < 1:
            raise ConfigError(f"search.rollouts must be >= 1 with latent=rollout, got {self.rollouts}.")
        if self.strategy == "lookahead" and self.w_latent <= 0:
            raise ConfigError(f"search.strategy lookahead scores each candidate by its rollout through the latent "
                              f"reward, but search.w_latent is {self.w_latent}: set search.w_latent > 0 (e.g. 1), "
                              "or use strategy greedy.")
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
        if self.strategy == "compute_optimal" and "lookahead" in self.level_strategies and self.w_latent <= 0:
            raise ConfigError("search.level_strategies names lookahead, which scores candidates through the latent "
                              f"reward, but search.w_latent is {self.w_latent}: set it > 0 or drop lookahead.")
