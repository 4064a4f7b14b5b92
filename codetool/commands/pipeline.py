"""``codetool pipeline``: the whole CodeTool method, end to end, resumable stage by stage.

    codetool pipeline --config configs/pipeline/quickstart.yaml        # what `make demo` runs
    codetool pipeline --config configs/pipeline/quickstart.yaml --force search

Stages, each writing under ``runs/<name>/``:

1. ``trees``: DFS action trees on the training queries and the PRM dataset (``codetool.tree``);
2. ``train``: the PRM trained on that dataset (``codetool train-prm``), or a given checkpoint;
3. ``search``: the stepwise search on every evaluation set for every method (e.g. one sample
   per step, spot only, spot + latent with the trained PRM);
4. ``eval``: SoPR, path rates, SCEP, tokens, cost and the report (``report.md``, ``report.json``,
   plots) in ``runs/<name>/``: judge-free metrics as mean ± spread over ``seeds`` (the first seed's
   runs are judged) and the PRM's held-out pairwise accuracy (``eval-prm``, ``prm_eval/``). With
   ``policy_rl`` (a train-policy recipe) it then trains and evaluates the policy before/after
   (``policy_rl/``); with an evaluation set on the synthetic world it writes the testbed's summary
   (``testbed.md``, ``testbed.json``: exact held-out success per method with intervals, paired
   differences, the PRM on both-ran pairs; :mod:`codetool.eval.testbed`, docs/TESTBED.md).

A stage whose record (``<stage>/stage.json``: the hash of its settings and of the stages it reads)
matches is skipped; one that crashed resumes; one whose settings changed is redone, and so are the
stages after it. ``--force STAGE`` reruns one. The settings and what each stage is handed are
:mod:`codetool.jobs.pipeline`'s; the parts are built by :mod:`codetool.assemble`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codetool import CodetoolError
from codetool.commands.build_trees import build_trees_command
from codetool.commands.run import execute_run
from codetool.jobs.pipeline import (
    PipelineConfig,
    comparability_settings,
    held_out_rows,
    open_root,
    run_configs,
    runs_stage,
    stage_hashes,
    train_config,
    tree_config,
)
from codetool.jobs.queries import RunConfig, log_prompt_cache
from codetool.jobs.stages import Stage
from codetool.models.memory import release_host_memory
from codetool.resume import OutputBusy
from codetool.tree.config import TreeConfig

if TYPE_CHECKING:
    from codetool.prm.config import PRMConfig

logger = logging.getLogger(__name__)


def run_pipeline(cfg: PipelineConfig) -> dict[str, Any]:
    """Run the stages of ``cfg`` in order; returns ``{stage: "ran" | "skipped"}``."""
    root = open_root(cfg)
    tree_cfg, train_cfg = tree_config(cfg), train_config(cfg)
    prm = cfg.prm_checkpoint or train_cfg.output_dir
    run_cfgs = run_configs(cfg, prm)
    plan = stage_hashes(cfg)
    status: dict[str, Any] = {}
    changed = False  # once a stage reruns, every later stage reruns too

    def stage(name: str, work: Callable[[], dict | None]) -> None:
        nonlocal changed
        if not runs_stage(cfg, name):
            status[name] = "not run"
        elif _ran(Stage(root, name, plan[name]), cfg, work, force=name in cfg.force or changed):
            changed, status[name] = True, "ran"
            release_host_memory(collect=True)  # the stage's models are gone: the next one starts lean
        else:
            status[name] = "skipped"

    # The stages in order (STAGES), each the command it runs, called with its own config.
    stage("trees", lambda: stage_trees(tree_cfg))
    stage("train", lambda: stage_train(train_cfg))
    stage("search", lambda: stage_search(cfg, run_cfgs, prm))
    stage("eval", lambda: stage_eval(cfg, run_cfgs, prm))
    return status


def _ran(stage: Stage, cfg: PipelineConfig, work: Callable[[], dict | None], force: bool) -> bool:
    """``stage.run(work)``; an output another process is writing is refused naming the options the
    pipeline has (its outputs are under ``--runs_dir``/``--name``; it has no ``--output``)."""
    try:
        return stage.run(work, force=force)
    except OutputBusy as e:
        raise CodetoolError(f"another run is writing {e.output} (it holds {e.lock}): another pipeline on run "
                            f"'{cfg.name}' under {cfg.runs_dir}? Wait for it to finish, or give this one another "
                            "--name (or --runs_dir).") from None


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

    policy = make_policy(cfg.policy_spec)
    prm_spec = next((r.prm_spec for r in run_cfgs if r.prm == prm), None)  # parsed by the run configs
    scorer = make_scorer(prm_spec, client=cfg.prm_client) if prm_spec is not None else None
    # One evaluation set at a time (every seed and method on it): their prompts start alike, so the
    # policy's prompt cache (models/prompt_cache.py) serves each query's prompts to all of them.
    files: dict[int, str] = {}
    for i in sorted(range(len(run_cfgs)), key=lambda i: (run_cfgs[i].benchmark, run_cfgs[i].group, i)):
        files[i] = str(execute_run(run_cfgs[i], policy=policy, scorer=scorer if run_cfgs[i].prm == prm else None,
                                   show_summary=False))
    log_prompt_cache(policy)
    return {"trajectories": [files[i] for i in range(len(run_cfgs))]}


def _prm_heldout(cfg: PipelineConfig, prm: str) -> str:
    """``codetool eval-prm`` of the trained PRM on the trees' held-out split (``prm_eval/metrics.json``);
    "" when there is none (no PRM method, or no held-out rows). A given ``prm_checkpoint`` is measured
    on this run's held-out trees too (its own training data may overlap them: the report names it)."""
    from codetool.commands.eval_prm import EvalPRMConfig, eval_prm_command

    held_out = held_out_rows(cfg, prm)
    if held_out is None:
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
    eval_cfg = EvalConfig(trajectories=first, seed_runs=others, out=str(cfg.root), judge=cfg.judge,
                          compare=[m.name for m in cfg.methods], reference=cfg.reference,
                          prm_metrics=_prm_heldout(cfg, prm), run_settings=comparability_settings(cfg))
    if eval_command(eval_cfg):  # failed judge requests: error records in the report, not a failed stage
        logger.warning("some judge requests failed (see report.md's warnings); `--force eval` asks them again, "
                       "the cached verdicts cost nothing")
    out = {"report": str(cfg.root / "report.md")}
    if cfg.policy_rl:
        out["policy_rl"] = stage_policy_rl(cfg, prm)
    if any(ev.benchmark == "world" for ev in cfg.evals):
        out["testbed"] = str(testbed_summary(cfg, run_cfgs))
    return out


def stage_policy_rl(cfg: PipelineConfig, prm: str) -> str:
    """``codetool train-policy`` with the recipe ``cfg.policy_rl`` on this pipeline's policy and PRM
    (its outputs resume: a finished run is read back), writing ``<root>/policy_rl/``."""
    from codetool.commands.train_policy import TrainPolicyConfig, train_policy_command
    from codetool.config import load_config

    out = cfg.root / "policy_rl"
    policy_cfg = load_config(TrainPolicyConfig, cfg.policy_rl, {"policy": cfg.policy, "prm": prm,
                                                                 "output_dir": str(out)})
    train_policy_command(policy_cfg)
    return str(out)


def testbed_summary(cfg: PipelineConfig, run_cfgs: list[RunConfig]) -> Path:
    """:func:`codetool.eval.testbed.summarize` of the world evaluation sets; returns ``testbed.md``."""
    from codetool.eval.testbed import summarize

    s = cfg.search
    world = [r for r in run_cfgs if r.benchmark == "world"]
    return summarize(cfg.root, name=cfg.name, methods=[m.name for m in cfg.methods],
                     trajectories=[r.output for r in world],
                     evaluated=evaluated_sets(world),
                     policy_rl=bool(cfg.policy_rl),
                     search=f"k per method {[m.k for m in cfg.methods]}, at most {s.max_steps} steps of "
                            f"{s.max_new_tokens} tokens, temperature {s.temperature}, constrain {s.constrain}, "
                            f"seeds {cfg.seeds}, policy {cfg.policy}")


def evaluated_sets(run_cfgs: list[RunConfig]) -> str:
    """The world query sets the methods ran on, in words (the summary names them: a held-out
    template split and unseen queries of the train templates are different claims)."""
    names = {"heldout": "held-out templates (never demonstrated, in no tree)",
             "train": "the train templates (not these queries, unless the trees or the warm start used them)"}
    sets = []
    for group, offset, limit in dict.fromkeys((r.group, r.offset, r.limit) for r in run_cfgs):
        span = f"queries {offset}-{offset + limit - 1}" if limit else f"queries from {offset} on"
        sets.append(f"world {group} {span}, of {names.get(group, group)}")
    return "; ".join(sets)


def pipeline_command(cfg: PipelineConfig) -> int:
    """``codetool pipeline``: see the module docstring."""
    start = time.perf_counter()
    status = run_pipeline(cfg)
    report = cfg.root / "report.md"
    logger.info("pipeline %s: %s in %.1f min%s", cfg.name, ", ".join(f"{k} {v}" for k, v in status.items()),
                (time.perf_counter() - start) / 60, f"; report: {report}" if report.is_file() else "; no report yet "
                "(the eval stage writes it)")
    return 0
