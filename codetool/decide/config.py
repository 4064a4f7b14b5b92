"""The settings of the decide-first commands: ``DecisionEvalConfig`` (``codetool eval-decision``)
and ``TrainProbeConfig`` (``codetool train-probe``), next to the code that reads them.

Each ``__post_init__`` checks the values (a ``ConfigError`` names the key and the fix) and parses
the model specs once into :class:`~codetool.models.spec.ModelSpec` attributes (``model_spec``, ...)
that are not settings: they are left out of ``to_dict``, hashes and flags. Nothing here loads a
model or touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codetool.config import ConfigError, option
from codetool.config_groups import with_defaults
from codetool.decide.labelled import DrawGroup
from codetool.decide.stage import RouterConfig
from codetool.executor import ExecutorConfig
from codetool.judge.config import JudgeConfig
from codetool.models.spec import ModelSpec
from codetool.search.config import SearchConfig
from codetool.tools.config import ToolBackendGroup, ToolDocGroup


@with_defaults(tool_doc="compact")  # the 135M model's prompts stay short
class CompactToolDoc(ToolDocGroup):
    """The tool-doc group of the decide-first commands."""


@with_defaults(tool_doc="compact", tools_backend="simulator")
class DecisionTools(ToolBackendGroup):
    """The tools group of ``eval-decision``: compact tool docs and the simulator for ``run_search``
    unless told otherwise."""


@dataclass
class DecisionEvalConfig(DrawGroup, DecisionTools):
    """Settings of ``codetool eval-decision``."""

    model: str = option("default", "policy model: default, a path, a Hub id, an http(s) URL or vllm:<model>")
    decider: str = option("", "a separate deciding model (default: the policy)")
    output: str = option("runs/eval-decision", "folder for report.json, report.md, the PNG and records")
    answer_direct: bool = option(True, "generate a direct answer for every query (cost of the direct route, "
                                 "answer accuracy on tool-free queries)")
    run_search: bool = option(False, "run the fast path and the always-search baseline (needs the executor)")
    reuse: str = option("", "records.jsonl of an earlier run on the same draw: reuse its decisions and direct "
                        "answers instead of recomputing them")
    thresholds: list[float] = option(default_factory=list, help="thresholds to sweep (default: every recorded confidence)")
    dtype: str = option("auto", "model dtype", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device: auto, cpu, cuda, ...")
    compare: list[str] = option(default_factory=lambda: ["probe", "agreement", "logprobs"],
                                help="methods whose P(tool necessary) is compared side by side (AUROC, trade-off): "
                                "probe (needs router.probe), agreement (verbalised), logprobs")
    heldout_only: bool = option(True, "with router.probe: score the probe's held-out queries (its draw and split, "
                                "labels from its labels.jsonl) instead of this command's draw")
    tradeoff_thresholds: list[float] = option(default_factory=lambda: [round(0.1 * k, 1) for k in range(1, 10)],
                                              help="thresholds of the accuracy-vs-tool-calls sweep (When2Tool: 0.1-0.9)")
    baselines: list[str] = option(default_factory=lambda: ["force", "default", "necessary", "sparse", "no_tool"],
                                  help="prompt-only modes run as baselines (empty: none)")
    baseline_reasoning: list[str] = option(default_factory=lambda: ["direct", "reason"],
                                           help="direct and/or reason (reason-then-act) for each baseline mode")
    baseline_max_new_tokens: int = option(32, "tokens of a baseline's first reply (enough for a sentence of reasoning and the code block's first line)")
    bootstrap_samples: int = option(1000, "resamples of queries for the AUROC intervals")
    router: RouterConfig = field(default_factory=RouterConfig)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(method="spot", latent="none", w_latent=0.0,
                                                                      max_steps=3, max_new_tokens=192))
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def __post_init__(self):
        super().__post_init__()
        # the models, parsed once (not settings: not in to_dict, hashes or flags)
        self.model_spec = ModelSpec.parse(self.model, dtype=self.dtype, device=self.device)
        self.decider_spec = ModelSpec.parse(self.decider, dtype=self.dtype, device=self.device) if self.decider else None
        self.probe_spec = ModelSpec.parse(self.router.probe_model, dtype=self.dtype, device=self.device
                                          ) if self.router.probe_model else None
        if self.n_tool + self.n_free == 0:
            raise ConfigError(f"need some queries: n_tool and n_free are {self.n_tool} and {self.n_free}.")
        if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"thresholds must lie in [0, 1], got {self.thresholds}.")
        from codetool.decide.tradeoff import MODES, REASONING  # numpy: not for --help

        bad = [m for m in self.baselines if m not in MODES] + [r for r in self.baseline_reasoning if r not in REASONING]
        if bad:
            raise ConfigError(f"unknown baselines {bad}: modes are {list(MODES)}, reasoning {list(REASONING)}.")
        if any(m not in ("probe", "agreement", "logprobs") for m in self.compare):
            raise ConfigError(f"compare takes probe, agreement and logprobs, got {self.compare}.")
        if self.run_search and self.search.latent == "prm":
            raise ConfigError("eval-decision runs the search without a PRM, but search.latent is 'prm' (a "
                              "--search.* override resets the nested defaults): add --search.latent none "
                              "--search.w_latent 0.")


# the probe reads more queries, of every benchmark, than eval-decision draws by default
@with_defaults(n_tool=24, n_restbench=12, n_toolbench=8, n_free=40)
class ProbeDraw(DrawGroup):
    """The query draw of ``train-probe``."""


@dataclass
class TrainProbeConfig(ProbeDraw, CompactToolDoc):
    """Settings of ``codetool train-probe``."""

    model: str = option("default", "model whose hidden states the probe reads and that answers without tools "
                        "(a local transformers model: default, a path or a Hub id)")
    when2tool: str = option("", "a When2Tool task file (tasks_v1_train.json or the Hub's rows), labelled by the "
                            "grounded check of the no-tool answer")
    when2tool_envs: str = option("", "When2Tool's envs/ folder (tool descriptions for its tasks)")
    label_benchmarks: str = option("judge", "StableToolBench, RestBench and ToolBench labels: judge (a judge labels "
                                   "the no-tool answer) or given (tool-necessary by construction, no run)",
                                   choices=["judge", "given"])
    label_tool_free: str = option("given", "tool-free labels: given (needs no tool, by construction) or reference "
                                  "(the no-tool answer checked against the query's answer, where it has one)",
                                  choices=["given", "reference"])
    judge: JudgeConfig = field(default_factory=lambda: JudgeConfig(protocol="codetool"))
    answer_max_new_tokens: int = option(96, "tokens of each no-tool answer")
    step_format: str = option("code_only", "the policy prompt's step format (as the search that will be routed)",
                              choices=["code_only", "step_text"])
    layers: list[int] = option(default_factory=list, help="hidden-state indices to concatenate (0 = embeddings, "
                               "-1 = last layer); empty: all of them (When2Tool)")
    C: float = option(1e-3, "inverse L2 strength of the logistic regression (When2Tool's all-layer probe: 1e-4)")
    heldout_fraction: float = option(0.3, "share of query ids held out for the AUROC (codetool.split)")
    split_seed: int = option(0, "seed of the held-out split")
    bootstrap_samples: int = option(1000, "resamples of held-out queries for the AUROC's 95% interval")
    output: str = option("runs/probe", "folder of the probe, labels.jsonl and the report")
    dtype: str = option("auto", "model dtype", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device: auto, cpu, cuda, ...")

    def __post_init__(self):
        super().__post_init__()
        self.model_spec = ModelSpec.parse(self.model, dtype=self.dtype, device=self.device)  # not a setting
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"heldout_fraction must lie in (0, 1), got {self.heldout_fraction}.")
        if self.C <= 0:
            raise ConfigError(f"C must be > 0, got {self.C}.")
