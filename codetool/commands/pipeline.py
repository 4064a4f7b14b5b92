"""``codetool pipeline``: the whole CodeTool method, end to end, resumable stage by stage.

    codetool pipeline --config configs/pipeline/quickstart.yaml        # what `make demo` runs
    codetool pipeline --config configs/pipeline/quickstart.yaml --force search

Stages, each writing under ``runs/<name>/``:

1. ``trees``: DFS action trees on the training queries and the PRM dataset (``codetool.tree``);
2. ``train``: the PRM trained on that dataset (``codetool train-prm``), or a given checkpoint;
3. ``search``: the stepwise search on every evaluation set for every method (e.g. one sample
   per step, spot only, spot + latent with the trained PRM);
4. ``eval``: SoPR, path rates, SCEP, tokens, cost and the report (``report.md``, ``report.json``,
   plots) in ``runs/<name>/``; its one-screen summary gives the judge-free metrics as mean ± spread
   over ``seeds`` (the search runs once per seed, ``search/<method>/<set>.seed<k>.jsonl``; the first
   seed's runs are judged) and the PRM's held-out pairwise accuracy (``eval-prm`` on the trees'
   validation split, ``prm_eval/``).

Every stage records the hash of what determines its output (its settings and the hashes of the
stages it reads) in ``<stage>/stage.json``. A stage whose record matches is skipped; one that
crashed resumes (each stage's command resumes by itself); one whose settings changed is redone
from scratch, and so are the stages after it. ``--force STAGE`` reruns one stage.

One policy per pipeline: the top-level ``policy``, ``remote_model``, ``policy_max_batch_size`` and
``tool_doc`` are given to the trees and the search; a recipe that sets one of them under
``trees:`` to another value is refused (``ConfigError``) instead of being silently replaced. The
parts are built by :mod:`codetool.assemble`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codetool import CodetoolError
from codetool.commands.build_trees import build_trees_command
from codetool.commands.run import execute_run
from codetool.config import ConfigError, config_hash, option, section, to_dict
from codetool.executor import ExecutorConfig
from codetool.jobs.queries import RunConfig
from codetool.jobs.stages import Stage
from codetool.judge.config import JudgeConfig
from codetool.models.memory import release_host_memory
from codetool.models.remote import RemoteConfig
from codetool.models.spec import ModelSpec
from codetool.search.answer import AnswerConfig
from codetool.search.config import SearchConfig
from codetool.tree.config import TreeConfig

if TYPE_CHECKING:  # imported when a config is built (TRL takes seconds): see codetool.config.section
    from codetool.prm.config import PRMConfig

logger = logging.getLogger(__name__)

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


@dataclass
class EvalSetConfig:
    """One evaluation set."""

    benchmark: str = option("stabletoolbench", "benchmark", choices=["stabletoolbench", "restbench-tmdb"])
    group: str = option("G1_instruction", "StableToolBench group")
    subset: str = option("codetool", "stabletoolbench: codetool or full; restbench-tmdb: restgpt or codetool")
    offset: int = option(0, "skip this many queries")
    limit: int | None = option(10, "queries to run")
    tools_backend: str = option("auto", "tool backend (auto: simulator; TMDB mock for RestBench)")
    tool_server_url: str | None = option(None, "StableToolBench server URL (tools_backend server/stabletoolbench)")
    tool_cache_dir: str | None = option(None, "StableToolBench response cache folder")
    tool_doc: str | None = option(None, "tool docs for this set (default: the pipeline's tool_doc)",
                                  choices=[None, "full", "compact", "brief"])
    concurrency: int | None = option(None, "episodes in flight for this set (default: search.concurrency); "
                                           "lower it for long prompts, whose KV caches take memory")
    max_observation_chars: int | None = option(None, "output shown to the policy per step for this set (default: "
                                                     "search.max_observation_chars; the public code uses 1,500 for TMDB)")

    @property
    def slug(self) -> str:
        return self.group if self.benchmark == "stabletoolbench" else "restbench-tmdb"


def _default_methods() -> list[MethodConfig]:
    return [MethodConfig(name="single-sample", k=1, w_latent=0.0, latent="none", temperature=0.0),
            MethodConfig(name="spot-only", k=2, w_latent=0.0, latent="none"),
            MethodConfig(name="spot+latent", k=2, latent="prm")]


# Settings the pipeline passes down to its trees stage (the top-level value wins; see __post_init__).
PIPELINE_WIDE = ("policy", "remote_model", "policy_max_batch_size", "tool_doc", "policy_client")


@dataclass
class PipelineConfig:
    """Settings of ``codetool pipeline`` (see the recipes in ``configs/pipeline/``)."""

    name: str = option("quickstart", "run name: everything goes to <runs_dir>/<name>/")
    runs_dir: str = option("runs", "parent folder of runs")
    policy: str = option("default", "policy for trees and search: default, a path, Hub id, http(s) URL, vllm:<model>")
    policy_max_batch_size: int = option(16, "sequences decoded together (local policy)")
    remote_model: str | None = option(None, "model name sent to an http(s) policy server")
    policy_client: RemoteConfig = field(default_factory=RemoteConfig)
    prm_client: RemoteConfig = field(default_factory=RemoteConfig)
    tool_doc: str = option("full", "tool docs in prompts: full, compact or brief (one line each)", choices=["full", "compact", "brief"])
    prm_checkpoint: str | None = option(None, "use this PRM (dir or serve-prm URL) and skip the train stage")
    stages: list[str] = option(default_factory=lambda: list(STAGES), help="stages to run, in order")
    force: list[str] = option(default_factory=list, help="stages to rerun even if their outputs are current")
    trees: TreeConfig = field(default_factory=TreeConfig)
    train: PRMConfig = section("codetool.prm.config:PRMConfig", "PRM training: the options of 'codetool train-prm'")
    search: SearchConfig = field(default_factory=SearchConfig)
    methods: list[MethodConfig] = field(default_factory=_default_methods)
    evals: list[EvalSetConfig] = field(default_factory=lambda: [EvalSetConfig()])
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    reference: str = option("", "SoWR reference: a method name or a StableToolBench converted-answer file or "
                            "folder (the field's: ChatGPT CoT); default: the first method")
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    seeds: list[int] = option(default_factory=lambda: [0],
                              help="search seeds: every method runs every evaluation set once per seed (search.seed); "
                                   "the report gives the judge-free metrics as mean ± spread over them and judges the "
                                   "first seed's runs")

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of distinct integers, got {self.seeds}; e.g. seeds: [0, 1].")
        for name in [*self.stages, *self.force]:
            if name not in STAGES:
                raise ConfigError(f"unknown pipeline stage {name!r}; stages are {list(STAGES)}.")
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ConfigError(f"method names must be unique, got {names}.")
        if not self.methods or not self.evals:
            raise ConfigError("a pipeline needs at least one method and one evaluation set.")
        # One policy per pipeline: the top-level settings are given to the trees; a different value
        # under trees: would be replaced silently, so it is refused (issue 18).
        tree_defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                         for f in dataclasses.fields(TreeConfig) if f.name in PIPELINE_WIDE}
        for name in PIPELINE_WIDE:
            value, top = getattr(self.trees, name), getattr(self, name)
            if value != tree_defaults[name] and value != top:
                raise ConfigError(f"trees.{name} is {value!r} but the pipeline's {name} is {top!r}: the pipeline "
                                  f"gives its own {name} to the trees and the search; set {name} at the top level "
                                  f"(or give trees.{name} the same value).")
        ModelSpec.parse(self.policy, role="policy", remote_model=self.remote_model)  # remote_model needs a URL

    @property
    def root(self) -> Path:
        return Path(self.runs_dir) / self.name


def _hash(*parts: Any) -> str:
    return config_hash([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts])


def _tree_cfg(cfg: PipelineConfig) -> TreeConfig:
    return dataclasses.replace(cfg.trees, policy=cfg.policy, policy_max_batch_size=cfg.policy_max_batch_size,
                               remote_model=cfg.remote_model, tool_doc=cfg.tool_doc, executor=cfg.executor,
                               policy_client=cfg.policy_client,
                               output=str(cfg.root / "trees" / "trees.jsonl"),
                               dataset_dir=str(cfg.root / "trees" / "prm_dataset"), shard=None, merge=False)


def _train_cfg(cfg: PipelineConfig) -> PRMConfig:
    data = cfg.root / "trees" / "prm_dataset"
    return cfg.train.with_settings(dataset=[str(data / "train.jsonl")], eval_dataset=[str(data / "validation.jsonl")],
                                   output_dir=str(cfg.root / "train" / "prm"))


def _run_cfgs(cfg: PipelineConfig, prm: str) -> list[RunConfig]:
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
            runs.append(RunConfig(benchmark=ev.benchmark, group=ev.group, subset=ev.subset, offset=ev.offset,
                                  limit=ev.limit, tools_backend=ev.tools_backend, tool_server_url=ev.tool_server_url,
                                  tool_cache_dir=ev.tool_cache_dir, policy=cfg.policy,
                                  policy_max_batch_size=cfg.policy_max_batch_size, remote_model=cfg.remote_model,
                                  policy_client=cfg.policy_client, prm_client=cfg.prm_client,
                                  tool_doc=ev.tool_doc or cfg.tool_doc,
                                  prm=prm if method.latent == "prm" else method.latent,
                                  search=run_search, executor=cfg.executor, answer=cfg.answer,
                                  output=str(cfg.root / "search" / method.name / f"{ev.slug}{suffix}.jsonl")))
    return runs


def stage_hashes(cfg: PipelineConfig) -> dict[str, str]:
    """``{stage: hash}`` of what determines each stage's output (``trees``, ``train``, ``search``,
    ``eval``): a stage whose recorded hash equals this one is skipped. Client limits (in flight,
    timeouts, retries) change how fast a stage runs, not what it writes, so they are left out."""
    tree_cfg, train_cfg = _tree_cfg(cfg), _train_cfg(cfg)
    h_trees = _hash(dataclasses.replace(tree_cfg, policy_client=RemoteConfig()))
    h_train = _hash(cfg.prm_checkpoint) if cfg.prm_checkpoint else _hash(train_cfg.stage_settings(), h_trees)
    run_cfgs = _run_cfgs(cfg, cfg.prm_checkpoint or train_cfg.output_dir)
    needs_prm = any(m.latent == "prm" for m in cfg.methods)
    h_search = _hash([dataclasses.replace(r, output="", policy_client=RemoteConfig(), prm_client=RemoteConfig())
                      for r in run_cfgs], h_train if needs_prm else "")
    judge = dataclasses.replace(cfg.judge, client=RemoteConfig())
    h_eval = _hash(judge, cfg.reference, h_search) if cfg.reference else _hash(judge, h_search)
    return {"trees": h_trees, "train": h_train, "search": h_search, "eval": h_eval}


def run_pipeline(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the stages of ``cfg`` in order; returns ``{stage: "ran" | "skipped"}``."""
    root = cfg.root
    if "eval" in cfg.stages and cfg.judge.enabled:  # a missing reference checkout fails now, not after the search
        from codetool.judge.reference_prompts import load_reference_prompts

        load_reference_prompts(cfg.judge.prompts, cfg.judge.reference_dir, evaluator=cfg.judge.stabletoolbench_evaluator,
                               instruction=cfg.judge.codetool_instruction)
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    tree_cfg, train_cfg = _tree_cfg(cfg), _train_cfg(cfg)
    prm = cfg.prm_checkpoint or train_cfg.output_dir
    run_cfgs = _run_cfgs(cfg, prm)
    needs_prm = any(m.latent == "prm" for m in cfg.methods)
    plan = stage_hashes(cfg)
    status: dict[str, Any] = {}
    changed = False  # once a stage reruns, every later stage reruns too

    def stage(name: str, work: Callable[[], dict | None]) -> None:
        nonlocal changed
        if name not in cfg.stages or (name == "train" and cfg.prm_checkpoint) or (
                name in ("trees", "train") and not needs_prm and not cfg.prm_checkpoint and name not in cfg.force):
            status[name] = "not run"
            return
        record = Stage(root, name, plan[name])
        if not record.prepare(force=name in cfg.force or changed):
            status[name] = "skipped"
            return
        changed = True
        start = time.perf_counter()
        try:
            info = work()
        except BaseException as e:  # recorded, so the next run says why it starts this stage again
            record.failed(e)
            raise
        record.done(time.perf_counter() - start, **(info or {}))
        status[name] = "ran"
        logger.info("stage %s finished in %.1f s", name, time.perf_counter() - start)
        release_host_memory(collect=True)  # the stage's models are gone: the next one starts lean

    # The stages in order (STAGES), each the command it runs, called with its own config.
    stage("trees", lambda: stage_trees(tree_cfg))
    stage("train", lambda: stage_train(train_cfg))
    stage("search", lambda: stage_search(cfg, run_cfgs, prm))
    stage("eval", lambda: stage_eval(cfg, run_cfgs, prm))
    return status


def stage_trees(tree_cfg: TreeConfig) -> dict:
    """``codetool build-trees`` with the pipeline's tree settings; refuses trees that gave no rows."""
    build_trees_command(tree_cfg)
    data = Path(tree_cfg.dataset_dir) / "train.jsonl"
    if not data.exists():
        raise CodetoolError(f"the trees gave no PRM training rows ({data} is missing). Use a deeper tree "
                            "(trees.max_depth), more queries, or a stronger policy.")
    return {"trees": tree_cfg.output, "dataset": tree_cfg.dataset_dir}


def stage_train(train_cfg: PRMConfig) -> dict:
    """``codetool train-prm`` on the trees' dataset (without held-out rows when there are none)."""
    from codetool.commands.train_prm import train_command

    if not Path(train_cfg.eval_dataset[0]).exists() or not Path(train_cfg.eval_dataset[0]).read_text().strip():
        train_cfg = train_cfg.with_settings(eval_dataset=[])  # too few queries to hold any out
    train_command(train_cfg)
    return {"prm": train_cfg.output_dir}


def stage_search(cfg: PipelineConfig, run_cfgs: list[RunConfig], prm: str) -> dict:
    """``codetool run`` of every (seed, method, evaluation set), one policy (and PRM) loaded for all."""
    from codetool.assemble import make_policy, make_scorer

    policy = make_policy(cfg.policy, max_batch_size=cfg.policy_max_batch_size, remote_model=cfg.remote_model,
                         client=cfg.policy_client)
    scorer = make_scorer(prm, client=cfg.prm_client) if any(r.prm not in ("none", "rollout") for r in run_cfgs) else None
    # One evaluation set at a time (every seed and method on it): their prompts start alike, so the
    # policy's prompt cache (models/prompt_cache.py) serves each query's prompts to all of them.
    order = sorted(range(len(run_cfgs)), key=lambda i: (run_cfgs[i].benchmark, run_cfgs[i].group, i))
    files: dict[int, str] = {}
    for i in order:
        run_cfg = run_cfgs[i]
        files[i] = str(execute_run(run_cfg, policy=policy, scorer=scorer if run_cfg.prm == prm else None,
                                   show_summary=False))
    cache = getattr(policy, "prompt_cache", None)
    if cache is not None and cache.hit_tokens + cache.miss_tokens:
        logger.info("policy prompt cache: %d of %d prompt tokens reused (%.0f%%), %.0f MiB held",
                    cache.hit_tokens, cache.hit_tokens + cache.miss_tokens,
                    100 * cache.hit_tokens / (cache.hit_tokens + cache.miss_tokens), cache.nbytes / 2**20)
    return {"trajectories": [files[i] for i in range(len(run_cfgs))]}


def _prm_heldout(cfg: PipelineConfig, prm: str) -> str:
    """``codetool eval-prm`` of the trained PRM on the trees' held-out split (``prm_eval/metrics.json``);
    "" when there is none (a given checkpoint, no PRM method, or no held-out rows)."""
    from codetool.commands.eval_prm import EvalPRMConfig, eval_prm_command

    held_out = cfg.root / "trees" / "prm_dataset" / "validation.jsonl"
    if cfg.prm_checkpoint or not any(m.latent == "prm" for m in cfg.methods) or not Path(prm).is_dir() \
            or not held_out.is_file() or not held_out.read_text().strip():
        return ""
    out = cfg.root / "prm_eval"
    try:
        eval_prm_command(EvalPRMConfig(prm=prm, dataset=[str(held_out)], split="all", output_dir=str(out)))
    except CodetoolError as e:  # the report says the PRM was not measured; the method's results still stand
        logger.warning("eval-prm on the held-out trees failed: %s", e)
        return ""
    return str(out / "metrics.json")


def stage_eval(cfg: PipelineConfig, run_cfgs: list[RunConfig], prm: str) -> dict:
    """``codetool eval`` of the first seed's runs (the others as seed runs), with the PRM's held-out
    pairwise accuracy (``eval-prm``) when the pipeline trained one."""
    from codetool.commands.eval import EvalConfig, eval_command

    first = [r.output for r in run_cfgs if r.search.seed == cfg.seeds[0]]
    others = [r.output for r in run_cfgs if r.search.seed != cfg.seeds[0]]
    from codetool.eval.comparability import RUN_SECTIONS, flatten

    settings = flatten({k: to_dict(getattr(cfg, k)) for k in RUN_SECTIONS if hasattr(cfg, k)})
    settings["__source__"] = f"pipeline {cfg.name}"  # the comparability block checks these
    eval_cfg = EvalConfig(trajectories=first, seed_runs=others, out=str(cfg.root), judge=cfg.judge,
                          compare=[m.name for m in cfg.methods], reference=cfg.reference,
                          prm_metrics=_prm_heldout(cfg, prm), run_settings=settings)
    if eval_command(eval_cfg):  # failed judge requests: error records in the report, not a failed stage
        logger.warning("some judge requests failed (see report.md's warnings); `--force eval` asks them again, "
                       "the cached verdicts cost nothing")
    return {"report": str(cfg.root / "report.md")}


def pipeline_command(cfg: PipelineConfig) -> int:
    """``codetool pipeline``: see the module docstring."""
    start = time.perf_counter()
    status = run_pipeline(cfg)
    logger.info("pipeline %s: %s in %.1f min; report: %s", cfg.name,
                ", ".join(f"{k} {v}" for k, v in status.items()), (time.perf_counter() - start) / 60,
                cfg.root / "report.md")
    return 0
