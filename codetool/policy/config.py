"""``TrainPolicyConfig``: the settings of ``codetool train-policy`` (a TRL ``GRPOConfig``).

Every ``GRPOConfig`` / ``TrainingArguments`` field is a recipe key and a ``--option`` (with TRL's
help text), as for ``train-prm``; the fields below are the method's own: which policy and PRM,
the reward weights (one :class:`RewardSetting`, or several ``settings`` compared at equal
generated tokens), how step rewards become advantages, the rollout's steps, the training prompts and the
held-out evaluation sets (:class:`QuerySet`), and the executor. ``rollout:`` is the search's step group
(:class:`~codetool.search.config.StepGroup`) and nothing else: any other search key there is
refused by name, with where it belongs.

Rollout sampling uses GRPO's ``temperature`` and ``top_p`` (TRL scales the trained log-probs by
that same temperature); ``rollout.temperature``/``top_p`` are refused (GRPO's are used). ``max_completion_length``
is set to ``rollout.max_new_tokens`` (tokens per step, what a vLLM generation call is given).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from codetool.config import ConfigError, Unread, option
from codetool.config_groups import with_defaults
from codetool.executor import ExecutorConfig
from codetool.judge.config import JudgeConfig
from codetool.models.lora import LoRAGroup
from codetool.models.spec import ModelSpec
from codetool.search.config import STEP_KEYS, SearchConfig, StepGroup
from codetool.tools.config import ToolsGroup
from codetool.tools.loaders import QueriesGroup

logger = logging.getLogger(__name__)

REWARDS = ("grounded", "judged", "on_the_spot", "prm", "tool_cost", "answer")
AGGREGATES = ("min", "mean", "last", "sum")
ADVANTAGES = ("anchored", "deepseekmath", "sequence")
BENCHMARKS = ("toolbench", "stabletoolbench", "restbench-tmdb", "world")


@dataclass
class RewardSetting:
    """Weights of the named reward functions of one training run (0 leaves a reward out).

    ``on_the_spot``, ``prm`` and ``tool_cost`` are per step (CodeTool's R_spot, the PRM's latent
    reward, LIT's cost, subtracted); ``grounded`` and ``judged`` score the episode's outcome.
    """

    name: str = option("", "label of this setting in reports (default: the names of its rewards joined by +)")
    grounded: float = option(1.0, "weight of the outcome reward: a finish answer after a successful listed-tool call")
    judged: float = option(0.0, "weight of the judge's verdict on the final answer (needs judge.model)")
    on_the_spot: float = option(0.0, "weight of the on-the-spot reward of each step (its code ran, its tool calls succeeded)")
    prm: float = option(0.0, "weight of the PRM's latent reward of each step")
    tool_cost: float = option(0.0, "weight of the LIT tool cost of each step (subtracted)")
    answer: float = option(0.0, "weight of the answer-key outcome: the finish answer names the query's known value "
                           "and no competing one (synthetic world queries; 0 on a query without a key)")

    def __post_init__(self):
        for key in REWARDS:
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"reward weight {key} must be a finite number >= 0, got {value!r} "
                                  "(tool_cost is subtracted: give it a positive weight).")
        if not any(getattr(self, key) for key in REWARDS):
            raise ConfigError(f"reward setting {self.name or '(unnamed)'}: every weight is 0; give at least one of "
                              f"{', '.join(REWARDS)} a weight > 0.")
        if not self.name:
            self.name = self.label

    @property
    def weights(self) -> dict[str, float]:
        """The rewards this setting uses, in :data:`REWARDS` order, with their weights (> 0)."""
        return {key: float(getattr(self, key)) for key in REWARDS if getattr(self, key)}

    @property
    def label(self) -> str:
        short = {"grounded": "outcome", "judged": "judged", "on_the_spot": "spot", "prm": "prm", "tool_cost": "cost",
                 "answer": "answer"}
        return "+".join(short[k] for k in self.weights)


@with_defaults(benchmark="toolbench")
class PolicyQueries(QueriesGroup):
    """The queries group of ``train-policy``'s query sets: ToolBench unless told otherwise."""


@dataclass
class QuerySet(PolicyQueries):
    """A slice of a benchmark (the queries group, :class:`~codetool.tools.loaders.QueriesGroup`):
    training prompts or a held-out evaluation set.

    ``toolbench`` reads ``queries`` (a ToolBench query file or folder; ToolBench's training
    distribution); ``stabletoolbench`` a test group (evaluation only: its solvable queries are
    test sets); ``restbench-tmdb`` the 100 TMDB queries (``subset`` codetool: 20 candidate APIs
    each; restgpt: all 54); ``world`` the synthetic world's generated queries (``group`` train or
    heldout: its template split; ``limit`` defaults to 40 there).
    """

    queries: str | None = option(None, "toolbench: a query file or folder (relative to the data folder, or absolute)")

    def __post_init__(self):
        super().__post_init__()  # the queries group's offset, limit and subset checks
        if self.benchmark is None:
            raise ConfigError(f"a query set needs a benchmark: one of {list(BENCHMARKS)}.")
        if self.benchmark == "toolbench" and not self.queries:
            raise ConfigError("a toolbench query set needs queries: a ToolBench query file or folder "
                              "(e.g. ToolBench/data_example/instruction).")
        if self.benchmark == "world" and self.group not in ("train", "heldout"):
            raise ConfigError(f"a world query set needs group train or heldout (its template split), got "
                              f"{self.group!r}.")

    @property
    def name(self) -> str:
        benchmark = self.benchmark or ""  # never None: __post_init__
        part = {"stabletoolbench": self.group, "restbench-tmdb": "tmdb", "world": self.group}.get(benchmark, "")
        return f"{benchmark}:{part}" if part else benchmark


def _default_prompts() -> list[QuerySet]:
    return [QuerySet("toolbench", queries="ToolBench/data_example/instruction"),
            QuerySet("restbench-tmdb", subset="codetool")]


def _default_evals() -> list[QuerySet]:
    return [QuerySet("stabletoolbench", group="G1_instruction", subset="codetool", limit=8),
            QuerySet("restbench-tmdb", subset="codetool", limit=8)]


@with_defaults(lora_r=16, lora_alpha=32)  # a policy adapter learns more than a PRM's
class PolicyLoRA(LoRAGroup):
    """The LoRA group of ``train-policy``."""

@with_defaults(tool_doc="brief")  # a small policy's prompt
class PolicyTools(ToolsGroup):
    """The tools group of ``train-policy``: brief tool docs unless told otherwise. Its
    ``tools_backend`` answers ToolBench and StableToolBench queries (``auto``: the simulator);
    RestBench-TMDB queries take ``restbench_backend``."""


# Where each search key that a rollout does not read belongs (train-policy refuses it by name).
_ROLLOUT_HOMES = {"k": "A rollout samples one step per episode: the GRPO group (num_generations) is its sampling.",
                  "temperature": "Rollouts sample at GRPO's temperature (the trained log-probs use it too): set "
                                 "temperature.",
                  "top_p": "Rollouts sample at GRPO's top_p: set top_p.",
                  "seed": "Each run's sampling seed is its training seed: set seed / seeds."}


def _rollout_home(key: str) -> str:
    return _ROLLOUT_HOMES.get(key, f"{key} is a setting of the search over queries: set eval_search.{key} (the search "
                                   "that evaluates the policy before and after training).")


ROLLOUT_UNREAD = Unread(reader="train-policy", reads=STEP_KEYS,
                        homes={f.name: _rollout_home(f.name) for f in dataclasses.fields(SearchConfig)
                               if f.init and f.name not in STEP_KEYS})


@dataclass
class TrainPolicyConfig(GRPOConfig, PolicyLoRA, PolicyTools):
    """Settings of ``codetool train-policy``: every TRL ``GRPOConfig`` option plus the method's own.

    Method fields: ``policy`` (and ``finetune``, ``lora_*``), ``prm``, ``rewards`` / ``settings``,
    ``aggregate``, ``advantage``, ``seeds``, ``token_budget``, ``prompts``, ``evals``,
    ``never_train_on``, ``rollout``, ``eval_search``, ``executor``, ``judge`` and the tool backend.
    Defaults that differ from ``GRPOConfig`` are redeclared below (no reference model, LoRA-sized
    learning rate, checkpoints every 10 steps, fp32 on CPU, ...).

    Raises:
        ConfigError: on a value out of range (the message names the key and the fix), or a key of
            ``rollout:`` that the rollout does not read (``rollout.strategy``: the step group only).
    """

    config_unread = {"rollout": ROLLOUT_UNREAD}  # search keys a rollout never reads: refused by name

    # ---- the policy
    policy: str = option("default", "the policy to train: default (the embedded 135M model), a folder or a Hub id")
    policy_dtype: str = option("auto", "dtype the policy is loaded in", choices=("auto", "float32", "bfloat16"))
    lora_layers: int = option(0, "LoRA on the last N decoder layers only (the backward pass stops there: "
                              "cheaper on a CPU); 0: every layer")
    # ---- rewards and advantages
    prm: str = option("auto", "the PRM: a train-prm folder, a serve-prm URL, none, or auto (the pipeline's "
                      "runs/quickstart/train/prm, else a small one trained here on synthetic rows)")
    prm_device: str = option("auto", "device of a local PRM (it may differ from the policy's)")
    prm_share_prefix: str = option("auto", "how a local PRM shares an episode's prefixes: trie (nested: the query "
                                   "and tools, then each earlier step; best on CPU), packed (one forward, the query "
                                   "and tools once), none, or auto (timed on the first call)",
                                   choices=("auto", "trie", "packed", "none"))
    prm_fallback_steps: int = option(6, "prm auto without a pipeline PRM: training steps of the synthetic-row PRM")
    rewards: RewardSetting = field(default_factory=RewardSetting,
                                   metadata={"help": "reward weights of a single run (when settings is empty)"})
    settings: list[RewardSetting] = option(default_factory=list, help="reward settings compared at equal generated "
                                           "tokens, each trained once per seed (empty: rewards alone)")
    aggregate: str = option("mean", "how a per-step reward becomes one number per episode (advantage sequence: "
                            "the episode reward; anchored: the episode's value of that reward)", choices=AGGREGATES)
    advantage: str = option("anchored", "how rewards become advantages: anchored (outcome-anchored step credit: "
                            "GRPO's advantage of the episode's length-neutral return, spread over its steps by their "
                            "rewards; fair to length), deepseekmath (DeepSeekMath's process supervision: step rewards "
                            "normalised in the group, a token's advantage the sum over its own and later steps; the "
                            "default before, favours length), sequence (TRL's GRPO advantage of the weighted episode "
                            "reward, on every token)", choices=ADVANTAGES,
                            renamed={"process": "deepseekmath"})  # 0.2.0: refused naming the new value
    credit_temperature: float = option(1.0, "advantage anchored: how sharply an episode's credit follows its steps' "
                                       "standardised rewards (large: evenly over its steps)")
    judge: JudgeConfig = field(default_factory=lambda: JudgeConfig(model="none"),
                               metadata={"help": "the judge of the judged reward (model none: no judged reward)"})
    allow_weak_judge: bool = option(False, "train the judged reward on a weak judge (a local model, judge.weak) "
                                    "anyway; refused by default: the embedded judge rules failed answers Solved")
    seeds: list[int] = option(default_factory=lambda: [0], help="training seeds; every setting trains once per seed")
    token_budget: int = option(0, "stop a run once its rollouts generated this many policy tokens (compute "
                               "matching across settings); 0: max_steps alone")
    share_prompt: bool = option(True, "compute a group's shared prompt once in the training forward (not with "
                                "activation checkpointing)")
    rollout_workers: int = option(1, "steps of a rollout round executed at once (threads; raise it when tool "
                                  "calls wait on a server)")
    torch_threads: int = option(0, "CPU threads of torch (0: its default); 1 keeps a shared 2-core machine from "
                                "making two threads wait on each other")
    resume: str = option("auto", "auto (each run's last checkpoint), none, or a checkpoint folder (single run; "
                         "resume_from_checkpoint works too)")
    evaluate: bool = option(True, "evaluate the policy before and after training on the evals sets")
    # ---- prompts, evaluation, environment
    prompts: list[QuerySet] = option(default_factory=_default_prompts, help="training queries (never test queries)")
    evals: list[QuerySet] = option(default_factory=_default_evals, help="held-out evaluation sets")
    never_train_on: list[QuerySet] = option(default_factory=_default_evals, help="query sets kept out of training "
                                            "besides evals (default: the pipeline quickstart's evaluation sets)")
    test_sets: list[str] = option(default_factory=lambda: ["stabletoolbench"],
                                  help="named test sets no training prompt may hold, by id and by text, whatever "
                                       "evals says: stabletoolbench[:<group>] (ToolBench's G*_query.json files hold "
                                       "its 765 test queries), restbench-tmdb[:<first>-<last>] (codetool.tools.heldout)")
    rollout: StepGroup = field(default_factory=lambda: StepGroup(max_steps=3, max_new_tokens=64, constrain="line"),
                                  metadata={"help": "the steps of a rollout: the search's step group (format, length, "
                                                    "constrained decoding, observation, on-the-spot rule), nothing else"})
    eval_search: SearchConfig = field(default_factory=lambda: SearchConfig(method="policy", k=1, latent="none",
                                                                           w_latent=0.0, max_steps=3,
                                                                           max_new_tokens=64, constrain="line"),
                                      metadata={"help": "the search that evaluates the policy before and after"})
    executor: ExecutorConfig = field(default_factory=ExecutorConfig, metadata={"help": "the sandbox"})
    restbench_backend: str = option("mock-tmdb", "tool backend of RestBench-TMDB queries: mock-tmdb (our mock "
                                    "server) or tmdb (the real API, TMDB_ACCESS_TOKEN)", choices=("mock-tmdb", "tmdb"))
    # ---- GRPOConfig / TrainingArguments fields whose default differs here
    output_dir: str = option("runs/policy", "runs, checkpoints, policies and the report go here")
    learning_rate: float = option(1e-5, "peak learning rate")
    num_generations: int = option(4, "episodes per query (the GRPO group)")
    per_device_train_batch_size: int = option(4, "episodes per device per optimisation step")
    max_steps: int = option(100, "optimisation steps per run (token_budget may stop it earlier)")
    beta: float = option(0.0, "KL coefficient to the reference policy (0: no reference model)")
    temperature: float = option(0.9, "sampling temperature of rollouts (and of the trained log-probs)")
    loss_type: str = option("grpo", "loss normalisation (TRL): grpo, each episode's mean over its generated tokens, "
                            "then the mean over episodes (DeepSeekMath's 1/|o_i|: every episode weighs the same, "
                            "whatever its length); dapo (TRL's default), bnpo, dr_grpo: token sums, so a longer episode "
                            "with the same advantage pushes harder", choices=("grpo", "dapo", "bnpo", "dr_grpo"))
    top_p: float = option(0.95, "nucleus sampling of rollouts")
    logging_steps: float = option(1, "log rewards every N steps")
    save_steps: float = option(10, "write checkpoint-N every N steps")
    save_total_limit: int | None = option(2, "keep at most this many checkpoint-N folders")
    report_to: str | list[str] | None = option("none", "experiment tracker(s): none, wandb, tensorboard, ...")
    bf16: bool | None = option(None, "bf16 mixed precision; unset: on a bf16 GPU")
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory; no shared prompt)")
    remove_unused_columns: bool = option(False, "keep the task column for the rollout")
    restore_callback_states_from_checkpoint: bool = option(True, "resume restores the generated-token count")
    seed: int = option(0, "seed of a single run (settings runs use seeds)")

    def __post_init__(self):
        # what the user gave, before TrainingArguments rewrites fields: run_config() rebuilds from it
        self._given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                       if f.init and not f.name.startswith("_")}
        if not self.seeds:
            raise ConfigError("seeds: give at least one training seed, e.g. [0].")
        if self.token_budget < 0 or self.prm_fallback_steps < 1 or self.lora_r < 1 or self.lora_layers < 0:
            raise ConfigError(f"need token_budget >= 0, prm_fallback_steps >= 1, lora_r >= 1 and lora_layers >= 0; got "
                              f"{self.token_budget}, {self.prm_fallback_steps}, {self.lora_r}, {self.lora_layers}.")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}.")
        if self.torch_threads < 0:
            raise ConfigError(f"torch_threads must be >= 0 (0: torch's default), got {self.torch_threads}.")
        if self.rollout_workers < 1:
            raise ConfigError(f"rollout_workers must be >= 1, got {self.rollout_workers}.")
        if self.use_vllm and self.rollout.constrain != "off":
            raise ConfigError(f"rollout.constrain is {self.rollout.constrain!r} but use_vllm samples rollouts without the "
                              "constraint (its log-probabilities would then train another policy than sampled); set "
                              "rollout.constrain off, or train without vLLM.")
        if not self.credit_temperature > 0:
            raise ConfigError(f"credit_temperature must be > 0, got {self.credit_temperature}.")
        shown = [k for k in STEP_KEYS if k not in ("max_steps", "max_new_tokens", "observation_history")
                 and getattr(self.rollout, k) != getattr(self.eval_search, k)]
        if shown:  # allowed (an ablation may want it), but the policy is then evaluated on other steps
            logger.warning("rollout and eval_search differ in %s: the policy trains on other steps than the "
                           "evaluation shows it", ", ".join(f"{k} ({getattr(self.rollout, k)!r} vs "
                                                           f"{getattr(self.eval_search, k)!r})" for k in shown))
        if self.rollout.observation_history != "all":
            raise ConfigError(f"rollout.observation_history is {self.rollout.observation_history!r}: an episode's "
                              "token row cannot hide an output it already showed; use all.")
        if any(q.benchmark == "stabletoolbench" for q in self.prompts):
            raise ConfigError("prompts: StableToolBench's solvable queries are its test sets; train on toolbench "
                              "(ToolBench's training distribution) or restbench-tmdb queries, and evaluate on "
                              "stabletoolbench in evals.")
        if any(q.benchmark == "world" and q.group == "heldout" for q in self.prompts):
            raise ConfigError("prompts: the world's heldout templates are its evaluation split; train on group "
                              "train and evaluate on heldout in evals.")
        if not self.prompts:
            raise ConfigError("prompts: give at least one training query set (toolbench or restbench-tmdb).")
        names = [s.name for s in self.run_settings]
        if len(set(names)) != len(names):
            raise ConfigError(f"settings: names must differ, got {names}; give each a name.")
        if any(s.judged for s in self.run_settings) and not self.judge.enabled:
            raise ConfigError("a setting weights the judged reward but judge.model is none; set judge.model "
                              "(an OpenAI-compatible URL or a local model) or the judged weight to 0.")
        weak = self.judge.weak if self.judge.weak is not None else not (self.judge.model_spec and self.judge.model_spec.remote)
        if any(s.judged for s in self.run_settings) and self.judge.enabled and weak and not self.allow_weak_judge:
            raise ConfigError(f"a setting weights the judged reward, but judge.model {self.judge.model!r} is a weak "
                              "judge (a local model): its verdicts are close to chance and a policy would learn to "
                              "please it; use an OpenAI-compatible judge (judge.model http(s)://...), set judge.weak "
                              "false for a strong local model, or allow_weak_judge true to train on it anyway.")
        several = len(self.run_settings) > 1 or len(self.seeds) > 1
        if several and (self.resume_from_checkpoint or self.resume not in ("auto", "none")):
            raise ConfigError("resume_from_checkpoint (or a resume folder) names one run's checkpoint, but this "
                              "config trains several settings or seeds; use resume auto (each run resumes from "
                              "its own last checkpoint).")
        if self.report_to is None:
            self.report_to = "none"
        if self.bf16 is None:
            self.bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        if not torch.cuda.is_available():
            self.use_cpu = True
            self.dataloader_pin_memory = False
        self.max_completion_length = self.rollout.max_new_tokens
        # The model specs, parsed once (not settings); the backends' defaults beside policy_dtype, as before.
        self.policy_spec = ModelSpec.parse(self.policy, dtype=self.policy_dtype, max_batch_size=16,
                                           api_key_env="OPENAI_API_KEY")
        self.prm_spec = None if self.prm == "auto" else ModelSpec.parse(self.prm, role="prm")  # auto: resolve_prm
        try:
            super().__post_init__()
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"train-policy: {e}") from None

    @property
    def run_settings(self) -> list[RewardSetting]:
        """The settings to train: ``settings``, or ``rewards`` alone."""
        return list(self.settings) or [self.rewards]

    def run_config(self, setting: RewardSetting, seed: int, output_dir: str) -> TrainPolicyConfig:
        """This config for one run: ``setting``'s rewards, ``seed``, checkpoints in ``output_dir``."""
        given = {**self._given, "rewards": setting, "settings": [], "seed": seed, "seeds": [seed],
                 "output_dir": output_dir}
        return type(self)(**given)

    def to_dict(self):
        out = super().to_dict()
        for name in ("rewards", "judge", "rollout", "eval_search", "executor"):
            out[name] = dataclasses.asdict(getattr(self, name))
        for name in ("settings", "prompts", "evals", "never_train_on"):
            out[name] = [dataclasses.asdict(x) for x in getattr(self, name)]
        return out
