"""``codetool train-policy``: GRPO of the policy on code-tool episodes, rewarded by the PRM (issue 31).

    codetool train-policy --config configs/policy/quickstart.yaml
    codetool run --benchmark restbench-tmdb --limit 5 --policy runs/policy-quickstart/policy

In order: pick the PRM (given, the pipeline's, or a small one trained here:
``codetool.policy.prm``); load the training prompts and the held-out evaluation sets, disjoint
(``codetool.policy.data``); start the tool backends; evaluate the base policy with the evaluation
search once per seed; train every reward setting once per seed (each run resumes from its last
checkpoint, and a finished run is read back from its ``run.json``), saving each trained policy
and evaluating it with the same search; write ``report.md``, ``results.json`` (with, for world
query sets, ``answer_before_after``: exact success per policy and each setting minus before,
paired by query, with bootstrap intervals) and the PNGs, and
link ``<output_dir>/policy`` to the last setting's first-seed policy. The method is
``codetool.policy``; this module only puts it in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from pathlib import Path

from codetool.assemble import (
    executor_factory,
    make_policy,
    make_scorer,
    tool_backend,
    tool_backend_options,
)
from codetool.policy.config import TrainPolicyConfig

logger = logging.getLogger(__name__)

__all__ = ["TrainPolicyConfig", "train_policy_command"]


def train_policy_command(cfg: TrainPolicyConfig) -> int:
    """Run ``codetool train-policy`` (see the module docstring); exit status 0."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    from codetool.assemble import make_judge
    from codetool.eval.testbed import answer_scores, before_after
    from codetool.models.memory import release_host_memory
    from codetool.policy.data import backend_kind, evaluation_queries, make_tasks, training_queries
    from codetool.policy.evaluate import run_eval, slug, summarise
    from codetool.policy.prm import resolve_prm
    from codetool.policy.report import scale_note, write_report
    from codetool.policy.train import train_run

    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    start = time.time()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prm_spec, prm_note = resolve_prm(cfg)
    scorer = make_scorer(prm_spec, cfg.prm_device, share_prefix=cfg.prm_share_prefix)
    judge = make_judge(cfg.judge, str(out / "judge_cache.jsonl")) if any(s.judged for s in cfg.run_settings) else None
    train_queries = training_queries(cfg)
    eval_queries = evaluation_queries(cfg) if cfg.evaluate else {}
    benchmarks = {t.benchmark if t.benchmark != "restbench" else "restbench-tmdb"
                  for t in [*train_queries, *(q for qs in eval_queries.values() for q in qs)]}
    tool_backend_options(cfg.tools_backend, cfg.tool_server_url, cfg.tool_cache_dir)  # a bad backend fails now
    make_executor = executor_factory(cfg.executor)
    evals: dict[str, dict[int, dict]] = {}
    runs: dict[str, dict[str, dict]] = {}
    with contextlib.ExitStack() as stack:
        backends = {b: stack.enter_context(tool_backend(backend_kind(cfg, b), benchmark=b, data_dir=cfg.data_dir,
                                                        server_url=cfg.tool_server_url, cache_dir=cfg.tool_cache_dir))
                    for b in sorted(benchmarks)}
        tasks = make_tasks(train_queries, backends, cfg)
        eval_tasks = {name: list(make_tasks(qs, backends, cfg).values()) for name, qs in eval_queries.items()}
        (out / "prompts.json").write_text(json.dumps({"train": sorted(tasks), "test_queries_dropped": train_queries.dropped,
                                                      "eval": {name: [t.query_id for t in ts]
                                                               for name, ts in eval_tasks.items()}}, indent=2))
        logger.info("%d training prompts; evaluation sets: %s; PRM: %s", len(tasks),
                    ", ".join(f"{n} ({len(t)})" for n, t in eval_tasks.items()) or "none", prm_note)
        if eval_tasks:
            base = make_policy(cfg.policy_spec)
            evals["before"] = {seed: run_eval(base, eval_tasks, cfg.eval_search, make_executor, label="before",
                                              seed=seed, out_dir=out / "eval") for seed in cfg.seeds}
            del base
            release_host_memory(collect=True)
        for setting in cfg.run_settings:
            for seed in cfg.seeds:
                run_dir = out / slug(setting.name) / f"seed{seed}"
                done = run_dir / "run.json"
                if done.is_file() and (run_dir / "policy" / "config.json").is_file():
                    summary = json.loads(done.read_text())
                    logger.info("%s seed %d: already trained (%s)", setting.name, seed, done)
                else:
                    logger.info("training %s, seed %d", setting.name, seed)
                    summary = train_run(cfg.run_config(setting, seed, str(run_dir)), tasks, scorer=scorer,
                                        judge=judge, prm_name=prm_note)
                    release_host_memory(collect=True)
                runs.setdefault(setting.name, {})[str(seed)] = summary
                if eval_tasks:
                    policy = make_policy(cfg.policy_spec.at(summary["policy_dir"]))
                    evals.setdefault(setting.name, {})[seed] = run_eval(
                        policy, eval_tasks, cfg.eval_search, make_executor, label=setting.name, seed=seed,
                        out_dir=out / "eval")
                    del policy
                    release_host_memory(collect=True)
    primary = Path(runs[cfg.run_settings[-1].name][str(cfg.seeds[0])]["policy_dir"])
    link = out / "policy"
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(primary.resolve().relative_to(out.resolve()))
    results = {
        "name": out.name, "policy": cfg.policy, "prm": prm_note, "advantage": cfg.advantage,
        "aggregate": cfg.aggregate, "token_budget": cfg.token_budget, "seeds": cfg.seeds, "loss_type": cfg.loss_type,
        "test_queries_dropped": train_queries.dropped, "test_sets": cfg.test_sets,
        "weights": {s.name: s.weights for s in cfg.run_settings}, "runs": runs,
        "eval": {label: summarise(per_seed) for label, per_seed in evals.items()},
        "answer_before_after": {name: before_after(scores) for name in eval_tasks if (scores := answer_scores(
            {label: {seed: sets[name] for seed, sets in per_seed.items()} for label, per_seed in evals.items()}))},
        "eval_sets": list(eval_tasks), "eval_sizes": {n: len(t) for n, t in eval_tasks.items()},
        "eval_search": f"k={cfg.eval_search.k}, at most {cfg.eval_search.max_steps} steps of "
                       f"{cfg.eval_search.max_new_tokens} tokens, temperature {cfg.eval_search.temperature}, "
                       f"constrain {cfg.eval_search.constrain}",
        "spread": "half the range over 2 seeds" if len(cfg.seeds) == 2 else "sample std over seeds",
        "scale": scale_note(cfg, len(tasks), eval_tasks),
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg(), "platform": platform.platform()},
        "seconds": round(time.time() - start, 1), "primary_policy": str(primary)}
    report = write_report(out, results)
    _print_summary(results, report, link)
    return 0


def _print_summary(results: dict, report: Path, link: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"train-policy: {results['name']} ({results['seconds']:.0f} s)")
    table.add_column("setting")
    table.add_column("first -> last training reward (seed mean)")
    table.add_column("generated tokens / run")
    for setting, seeds in results["runs"].items():
        firsts = [s["curve"][0]["reward"] for s in seeds.values() if s.get("curve")]
        lasts = [s["curve"][-1]["reward"] for s in seeds.values() if s.get("curve")]
        tokens = [s["generated_tokens"] for s in seeds.values()]
        table.add_row(setting, f"{sum(firsts) / max(len(firsts), 1):.3f} -> {sum(lasts) / max(len(lasts), 1):.3f}",
                      f"{sum(tokens) / max(len(tokens), 1):.0f}")
    console = Console()
    console.print(table)
    console.print(f"report: {report}; policy: {link} (codetool run --policy {link})")
