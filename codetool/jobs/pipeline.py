"""The settings of ``codetool pipeline`` (:class:`PipelineConfig`, with its methods and evaluation
sets) and what each stage is handed: the trees' config (:func:`tree_config`), the trainer's
(:func:`train_config`), one run config per (seed, method, evaluation set) (:func:`run_configs`),
and the canonical text of what determines each stage's output (:func:`stage_texts`, hashed by
:func:`stage_hashes`). The command that runs the stages is :mod:`codetool.commands.pipeline`.

One policy per pipeline: the top-level policy group (``policy``, ``remote_model``,
``policy_max_batch_size``, ``policy_client``) and ``tool_doc`` are given to the trees and the
search; a recipe that sets one of them under ``trees:`` to another value is refused
(``ConfigError``) instead of being silently replaced. So is a key of ``search:`` that each method
or seed sets for itself (``search.k``: set ``methods[].k``; ``search.seed``: set ``seeds``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codetool.config import ConfigError, Unread, option, section, to_dict
from codetool.config_groups import flat_settings, group_values, with_defaults
from codetool.executor import ExecutorConfig
from codetool.jobs.queries import RunConfig
from codetool.jobs.stages import settings_text, text_hash
from codetool.judge.config import JudgeConfig
from codetool.models.remote import RemoteConfig
from codetool.models.spec import PolicyGroup
from codetool.search.answer import AnswerConfig
from codetool.search.config import SearchConfig
from codetool.tools.config import ToolBackendGroup, ToolDocGroup
from codetool.tools.loaders import QueriesGroup
from codetool.tree.config import TreeConfig

if TYPE_CHECKING:  # imported when a config is built (TRL takes seconds): see codetool.config.section
    from codetool.prm.config import PRMConfig

STAGES = ("trees", "train", "search", "eval")


@dataclass
class MethodConfig:
    """One method of the comparison: how candidates are sampled and chosen."""

    name: str = option("spot+latent", "name in trajectories and reports")
    k: int = option(2, "candidates per step (1: no search)")
    w_spot: float = option(1.0, "weight of the on-the-spot reward")
    w_latent: float = option(1.0, "weight of the latent reward")
    w_cost: float = option(0.0, "weight of the LIT tool cost")
    latent: str = option("prm", "latent reward source", choices=["prm", "none", "rollout"])
    temperature: float | None = option(None, "sampling temperature (default: the pipeline's search setting)")


@with_defaults(benchmark="stabletoolbench", limit=10)
class EvalQueries(QueriesGroup):
    """The queries group of an evaluation set: 10 StableToolBench queries unless told otherwise."""


EVAL_BENCHMARKS = ("stabletoolbench", "restbench-tmdb", "world")  # the benchmarks that read their own files
# (world: the synthetic world's generated queries, codetool.world; its group is the template split)


@dataclass
class EvalSetConfig(EvalQueries, ToolBackendGroup):
    """One evaluation set: its queries and tools groups, and what it changes of the pipeline's
    search and prompt."""

    # ignored for mypy: the set's own setting, none meaning the pipeline's (ToolDocGroup's is a str)
    tool_doc: str | None = option(None, "tool docs for this set (default: the pipeline's tool_doc)",  # type: ignore[assignment]
                                  choices=[None, "full", "compact", "brief"])
    concurrency: int | None = option(None, "episodes in flight for this set (default: search.concurrency); "
                                           "lower it for long prompts, whose KV caches take memory")
    max_observation_chars: int | None = option(None, "output shown to the policy per step for this set (default: "
                                                     "search.max_observation_chars; the public code uses 1,500 for TMDB)")
    queries: str | None = option(None, "your own queries (sets benchmark: toolbench): a ToolBench-format file, or "
                                       "RestGPT's layout (a list of {query, solution}) with tools")
    tools: str | None = option(None, "with RestGPT-layout queries: the OpenAPI spec of their API")

    def __post_init__(self) -> None:
        if self.queries:
            self.benchmark = "toolbench"  # queries from a file (codetool.tools.files reads any layout)
        super().__post_init__()
        if self.benchmark not in EVAL_BENCHMARKS and not self.queries:
            raise ConfigError(f"evals[].benchmark: got {self.benchmark!r}; an evaluation set runs the files of "
                              f"{' or '.join(EVAL_BENCHMARKS)}, or your own: {{queries: FILE, tools: SPEC}}.")

    @property
    def slug(self) -> str:
        if self.queries:
            return Path(self.queries).stem
        if self.benchmark == "world":
            return f"world-{self.group}"
        return self.group if self.benchmark == "stabletoolbench" else "restbench-tmdb"


def _default_methods() -> list[MethodConfig]:
    return [MethodConfig(name="single-sample", k=1, w_latent=0.0, latent="none", temperature=0.0),
            MethodConfig(name="spot-only", k=2, w_latent=0.0, latent="none"),
            MethodConfig(name="spot+latent", k=2, latent="prm")]


# Settings the pipeline passes down to its trees stage (the top-level value wins; see __post_init__).
PIPELINE_WIDE = (*(f.name for f in dataclasses.fields(PolicyGroup)), "tool_doc")

# The keys of search: that each method (methods[]) or seed (seeds) sets for itself in run_configs.
_PER_RUN = {"method": "methods[].name", "k": "methods[].k", "w_spot": "methods[].w_spot",
            "w_latent": "methods[].w_latent", "w_cost": "methods[].w_cost", "latent": "methods[].latent",
            "seed": "seeds"}
PIPELINE_SEARCH = Unread(
    reader="pipeline",
    reads=tuple(f.name for f in dataclasses.fields(SearchConfig) if f.init and f.name not in _PER_RUN),
    homes={key: f"Each {'seed' if home == 'seeds' else 'method'} sets its own: set {{group}}{home} instead."
           for key, home in _PER_RUN.items()},
)


@dataclass
class PipelineConfig(PolicyGroup, ToolDocGroup):
    """Settings of ``codetool pipeline`` (see the recipes in ``configs/pipeline/``): the policy and
    tool-doc groups the trees and the search share, and the nested configs of its stages."""

    config_unread = {"search": PIPELINE_SEARCH}  # per-method and per-seed keys: set under methods[] / seeds

    name: str = option("quickstart", "run name: everything goes to <runs_dir>/<name>/")
    runs_dir: str = option("runs", "parent folder of runs")
    prm_client: RemoteConfig = field(default_factory=RemoteConfig)
    prm_checkpoint: str | None = option(None, "use this PRM (dir or serve-prm URL) and skip the train stage")
    stages: list[str] = option(default_factory=lambda: list(STAGES), help="stages to run, in order")
    force: list[str] = option(default_factory=list, help="stages to rerun even if their outputs are current")
    trees: TreeConfig = field(default_factory=TreeConfig)
    train: PRMConfig = section("codetool.prm.config:PRMConfig", "PRM training: the options of 'codetool train-prm'")
    search: SearchConfig = field(default_factory=SearchConfig)
    methods: list[MethodConfig] = option(
        default_factory=_default_methods, help="the methods compared, a YAML list of {name, k, w_spot, w_latent, "
        "w_cost, latent, temperature}, e.g. --methods '[{name: spot-only, k: 2, latent: none, w_latent: 0}, "
        "{name: spot+latent, k: 2}]'")
    evals: list[EvalSetConfig] = option(
        default_factory=lambda: [EvalSetConfig()], help="the evaluation sets, a YAML list of {benchmark, group, "
        "subset, offset, limit, ...}, e.g. --evals '[{benchmark: stabletoolbench, group: G1_instruction, limit: 4}]'")
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    reference: str = option("", "SoWR reference: a method name or a StableToolBench converted-answer file or "
                            "folder (the field's: ChatGPT CoT); default: the first method")
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    policy_rl: str | None = option(None, "a train-policy recipe that the eval stage runs on this pipeline's policy "
                                   "and trained PRM (before/after at equal generated tokens; the testbed's "
                                   "configs/policy/testbed.yaml), writing <root>/policy_rl/")
    seeds: list[int] = option(default_factory=lambda: [0],
                              help="search seeds: every method runs every evaluation set once per seed (search.seed); "
                                   "the report gives the judge-free metrics as mean ± spread over them and judges the "
                                   "first seed's runs")

    def __post_init__(self):
        super().__post_init__()  # the policy group parses policy_spec (a remote_model needs a URL)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of distinct integers, got {self.seeds}; e.g. seeds: [0, 1].")
        for name in [*self.stages, *self.force]:
            if name not in STAGES:
                raise ConfigError(f"unknown pipeline stage {name!r}; stages are {list(STAGES)}.")
        if self.policy_rl and not Path(self.policy_rl).is_file():
            raise ConfigError(f"policy_rl: no such train-policy recipe {self.policy_rl!r}; pass a file such as "
                              "configs/policy/testbed.yaml, or leave policy_rl empty.")
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ConfigError(f"method names must be unique, got {names}.")
        if not self.methods or not self.evals:
            raise ConfigError("a pipeline needs at least one method and one evaluation set.")
        # One policy per pipeline: the top-level settings are given to the trees; a different value
        # under trees: would be replaced silently, so it is refused (issue 18).
        tree_defaults = TreeConfig()
        for name in PIPELINE_WIDE:
            value, top = getattr(self.trees, name), getattr(self, name)
            if value != getattr(tree_defaults, name) and value != top:
                raise ConfigError(f"trees.{name} is {value!r} but the pipeline's {name} is {top!r}: the pipeline "
                                  f"gives its own {name} to the trees and the search; set {name} at the top level "
                                  f"(or give trees.{name} the same value).")

    @property
    def root(self) -> Path:
        return Path(self.runs_dir) / self.name


# What a stage's text leaves out: where it writes (the pipeline's folder), its clients' pace (in
# flight, timeouts, retries) and its memory cap: they change how fast a stage runs, not what it writes.
# The trees also leave out never_train_on: it only decides which queries get trees, and the export
# drops held-out trees whatever was built.
TREES_LEAVE_OUT = ("output", "dataset_dir", "policy_client.", "max_memory_mb", "never_train_on")
TRAIN_LEAVE_OUT = ("output_dir", "dataset", "eval_dataset")
RUN_LEAVE_OUT = ("output", "prm", "policy_client.", "prm_client.", "max_memory_mb")  # prm: the train stage's hash
EVAL_LEAVE_OUT = ("client.",)


def _read(settings: dict[str, Any], leave_out: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if not any(k == x or (x.endswith(".") and k.startswith(x))
                                                         for x in leave_out)}


def tree_config(cfg: PipelineConfig) -> TreeConfig:
    """The trees stage's ``build-trees`` config: ``trees:`` with the pipeline's policy, tool docs and
    executor, writing under ``<root>/trees/``."""
    return dataclasses.replace(cfg.trees, **{name: getattr(cfg, name) for name in PIPELINE_WIDE}, executor=cfg.executor,
                               output=str(cfg.root / "trees" / "trees.jsonl"),
                               dataset_dir=str(cfg.root / "trees" / "prm_dataset"), shard=None, merge=False)


def train_config(cfg: PipelineConfig) -> PRMConfig:
    """The train stage's ``train-prm`` config: ``train:`` on the trees' dataset, writing ``<root>/train/prm``."""
    data = cfg.root / "trees" / "prm_dataset"
    return cfg.train.with_settings(dataset=[str(data / "train.jsonl")], eval_dataset=[str(data / "validation.jsonl")],
                                   output_dir=str(cfg.root / "train" / "prm"))


def run_configs(cfg: PipelineConfig, prm: str) -> list[RunConfig]:
    """One ``RunConfig`` per (seed, method, evaluation set), seeds outermost. With one seed the
    trajectories go to ``search/<method>/<slug>.jsonl``; with several, ``<slug>.seed<k>.jsonl``."""
    runs = []
    for seed, method in ((s, m) for s in cfg.seeds for m in cfg.methods):
        search = dataclasses.replace(cfg.search, method=method.name, k=method.k, w_spot=method.w_spot,
                                     w_latent=method.w_latent, w_cost=method.w_cost, latent=method.latent,
                                     temperature=cfg.search.temperature if method.temperature is None
                                     else method.temperature, seed=seed)
        suffix = f".seed{seed}" if len(cfg.seeds) > 1 else ""
        for ev in cfg.evals:
            run_search = search if ev.concurrency is None else dataclasses.replace(search, concurrency=ev.concurrency)
            if ev.max_observation_chars is not None:
                run_search = dataclasses.replace(run_search, max_observation_chars=ev.max_observation_chars)
            groups = {**group_values(ev, QueriesGroup), **group_values(ev, ToolBackendGroup),
                      **group_values(cfg, PolicyGroup), "tool_doc": ev.tool_doc or cfg.tool_doc}
            runs.append(RunConfig(**groups, queries=ev.queries, tools=ev.tools, prm_client=cfg.prm_client,
                                  prm=prm if method.latent == "prm" else method.latent,
                                  search=run_search, executor=cfg.executor, answer=cfg.answer,
                                  output=str(cfg.root / "search" / method.name / f"{ev.slug}{suffix}.jsonl")))
    return runs


def open_root(cfg: PipelineConfig) -> Path:
    """Make the pipeline's folder and write its settings there (``pipeline.json``), after what can
    fail before any stage runs: a judge whose reference prompts have no checkout. Returns the folder."""
    if "eval" in cfg.stages and cfg.judge.enabled:
        from codetool.judge.reference_prompts import load_reference_prompts

        load_reference_prompts(cfg.judge.prompts, cfg.judge.reference_dir, evaluator=cfg.judge.stabletoolbench_evaluator,
                               instruction=cfg.judge.codetool_instruction)
    cfg.root.mkdir(parents=True, exist_ok=True)
    (cfg.root / "pipeline.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    return cfg.root


def held_out_rows(cfg: PipelineConfig, prm: str) -> Path | None:
    """The trees' held-out PRM rows that the PRM ``prm`` is measured on (the pipeline's own, or a
    given ``prm_checkpoint``: a folder or a serve-prm URL, measured on this run's held-out trees), or
    ``None``: no method that uses the PRM, no PRM or no held-out rows."""
    rows = cfg.root / "trees" / "prm_dataset" / "validation.jsonl"
    reachable = Path(prm).is_dir() or str(prm).startswith(("http://", "https://"))
    if not any(m.latent == "prm" for m in cfg.methods) or not reachable \
            or not rows.is_file() or not rows.read_text().strip():
        return None
    return rows


def comparability_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The run settings the eval report's comparability block checks (``codetool.eval.comparability``),
    flattened, with where they come from (``__source__``)."""
    from codetool.eval.comparability import RUN_SECTIONS, flatten

    settings = flatten({k: [to_dict(x) for x in getattr(cfg, k)] if isinstance(getattr(cfg, k), list)
                        else to_dict(getattr(cfg, k)) for k in RUN_SECTIONS if hasattr(cfg, k)})
    settings["__source__"] = f"pipeline {cfg.name}"
    return settings


def runs_stage(cfg: PipelineConfig, name: str) -> bool:
    """Whether the pipeline runs stage ``name`` at all: it is listed in ``stages``; ``train`` not
    with a given ``prm_checkpoint``; ``trees`` and ``train`` only when a method uses the PRM (or
    ``force`` names them)."""
    needs_prm = any(m.latent == "prm" for m in cfg.methods)
    return name in cfg.stages and not (name == "train" and cfg.prm_checkpoint) and not (
        name in ("trees", "train") and not needs_prm and not cfg.prm_checkpoint and name not in cfg.force)


def stage_texts(cfg: PipelineConfig) -> dict[str, str]:
    """``{stage: text}``: the canonical text (:func:`codetool.jobs.stages.settings_text`) of the
    settings each stage's command reads, with the hashes of the stages it reads: ``trees`` the
    trees' ``build-trees`` config, ``train`` the PRM's settings (:meth:`PRMConfig.stage_settings`)
    or the given checkpoint, ``search`` every run config keyed by its trajectory file
    (``spot-only/G1_instruction.search.k``), ``eval`` the judge and the SoWR reference."""
    tree_cfg, train_cfg = tree_config(cfg), train_config(cfg)
    texts = {"trees": settings_text(_read(flat_settings(tree_cfg), TREES_LEAVE_OUT))}
    h_trees = text_hash(texts["trees"])
    texts["train"] = (settings_text({"prm_checkpoint": cfg.prm_checkpoint}) if cfg.prm_checkpoint else
                      settings_text(_read(train_cfg.stage_settings(), TRAIN_LEAVE_OUT), {"trees": h_trees}))
    runs: dict[str, Any] = {}
    for run in run_configs(cfg, cfg.prm_checkpoint or train_cfg.output_dir):
        name = Path(run.output).relative_to(cfg.root / "search").with_suffix("").as_posix()
        runs.update({f"{name}.{k}": v for k, v in _read(flat_settings(run), RUN_LEAVE_OUT).items()})
    needs_prm = any(m.latent == "prm" for m in cfg.methods)
    texts["search"] = settings_text(runs, {"train": text_hash(texts["train"])} if needs_prm else {})
    judge = {f"judge.{k}": v for k, v in _read(flat_settings(cfg.judge), EVAL_LEAVE_OUT).items()}
    evals: dict[str, Any] = {**judge, "reference": cfg.reference}
    if cfg.policy_rl:  # the testbed's RL before/after runs in the eval stage: its recipe's text is part of it
        evals["policy_rl"] = Path(cfg.policy_rl).read_text() if Path(cfg.policy_rl).is_file() else cfg.policy_rl
    texts["eval"] = settings_text(evals, {"search": text_hash(texts["search"])})
    return texts


def stage_hashes(cfg: PipelineConfig) -> dict[str, str]:
    """``{stage: hash}`` of what determines each stage's output (``trees``, ``train``, ``search``,
    ``eval``; :func:`stage_texts`): a stage whose recorded hash equals this one is skipped."""
    return {stage: text_hash(text) for stage, text in stage_texts(cfg).items()}
