"""Before/after evaluation of a policy: the stepwise search itself on held-out queries.

Every policy (the base one and each trained one) runs the same ``eval_search`` settings, seeded
with the training seed, on the same evaluation sets; trajectories are written as JSONL
(``<set>.<label>.seed<k>.jsonl``, resumable: a complete file is read back, not rerun) and scored
with the judge-free metrics of the pipeline's summary (``codetool.eval.summary.judge_free``:
chosen-step SCEP as ours counts it (``scep_code_steps``: chosen steps with code whose run in the
search succeeded; the evaluation search writes no reference re-runs), listed-tool calls per episode, finish rate, grounded success, on
the synthetic world the answer-key success (``codetool.world``: the known value, exactly), and on
RestBench-TMDB the correct-path rate and path score) plus the policy tokens generated per query.
:func:`summarise` gives each metric's mean and spread over seeds (half the range for two seeds,
as the pipeline's summary).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import numpy as np

from codetool.assemble import make_search
from codetool.eval.metrics import run_metrics
from codetool.eval.summary import judge_free, spread
from codetool.jsonl import read_jsonl, write_jsonl
from codetool.resume import unit_key
from codetool.search.config import SearchConfig
from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)

METRICS = (("answer", "answer-key success % (world)", True), ("grounded", "grounded success %", True), ("scep", "chosen-step SCEP % (code steps)", True),
           ("finish", "finish %", True), ("tool_calls", "listed-tool calls / episode", False),
           ("correct_path", "TMDB correct path % (0/1)", True), ("path_score", "TMDB path score % (frac.)", True),
           ("tokens", "policy tokens / query", False))


def slug(text: str) -> str:
    """A file-name-safe form of a set or setting name."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_") or "x"


def run_eval(policy, tasks: dict[str, list], search: SearchConfig, make_executor, *, label: str, seed: int,
             out_dir: str | Path) -> dict[str, list[Trajectory]]:
    """Trajectories of ``policy`` on each evaluation set (read back when already complete).

    Args:
        policy (`LLMBackend`): the policy to evaluate.
        tasks (`dict[str, list[SearchTask]]`): set name -> tasks.
        search (`SearchConfig`): the evaluation search (its ``seed`` is replaced by ``seed``).
        label (`str`): ``before`` or the reward setting's name (file names, trajectories' method).
    """
    cfg = dataclasses.replace(search, seed=seed, method=label)
    out: dict[str, list[Trajectory]] = {}
    todo: dict[str, list] = {}
    for name, set_tasks in tasks.items():
        path = _path(out_dir, name, label, seed)
        rows = list(read_jsonl(path)) if path.is_file() else []
        if rows and len(rows) == len(set_tasks):
            out[name] = [Trajectory.from_dict(r) for r in rows]
        else:
            todo[name] = set_tasks
    keys = [unit_key(t.benchmark, t.group, t.query_id) for ts in todo.values() for t in ts]
    if todo and len(set(keys)) == len(keys):  # every set in one search: their episodes share forward passes
        cfg = dataclasses.replace(cfg, concurrency=max(cfg.concurrency or 1, len(keys)))
        done = {unit_key(t.benchmark, t.group, t.query_id): t
                for t in make_search(policy, cfg, make_executor).run([t for ts in todo.values() for t in ts])}
        runs = {name: [done[unit_key(t.benchmark, t.group, t.query_id)] for t in ts] for name, ts in todo.items()}
    else:
        runs = {name: make_search(policy, cfg, make_executor).run(ts) for name, ts in todo.items()}
    for name, trajs in runs.items():
        write_jsonl(_path(out_dir, name, label, seed), [t.to_dict() for t in trajs])
        out[name] = trajs
        logger.info("evaluated %s on %s (seed %d): %s", label, name, seed,
                    ", ".join(f"{k} {v:.2f}" for k, v in metrics(trajs).items() if v is not None))
    return {name: out[name] for name in tasks}


def _path(out_dir: str | Path, name: str, label: str, seed: int) -> Path:
    return Path(out_dir) / f"{slug(name)}.{slug(label)}.seed{seed}.jsonl"


def metrics(trajs: list[Trajectory]) -> dict[str, float | None]:
    """The judge-free metrics of one set (see the module docstring)."""
    from codetool.world.answers import episode_success

    out = judge_free(trajs)
    outcomes = [o for t in trajs if (o := episode_success(t.extra, t.finish_type, t.final_answer)) is not None]
    out["answer"] = sum(outcomes) / len(outcomes) if outcomes else None
    out["scep"] = run_metrics(trajs).scep_code_steps
    out["tokens"] = float(np.mean([t.generated_tokens for t in trajs])) if trajs else None
    return out


def summarise(per_seed: dict[int, dict[str, list[Trajectory]]]) -> dict[str, dict[str, dict | None]]:
    """``{set: {metric: {"mean", "spread", "values"} or None}}`` over the seeds of one policy label."""
    out: dict[str, dict[str, dict | None]] = {}
    sets = sorted({name for runs in per_seed.values() for name in runs})
    for name in sets:
        rows = [metrics(runs[name]) for runs in per_seed.values() if name in runs]
        cell: dict[str, dict | None] = {}
        for key, _, _ in METRICS:
            values = [v for r in rows if (v := r.get(key)) is not None]
            cell[key] = {"mean": float(np.mean(values)), "spread": spread(values), "values": values} if values else None
        out[name] = cell
    return out
