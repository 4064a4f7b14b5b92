"""Benchmark: one policy RL step split into generation, execution, PRM scoring and optimisation (issue 31).

    .venv/bin/python benchmarks/bench_policy_rl.py [--steps 3] [--queries toolbench|restbench]
        [--episodes 4] [--max-steps 3] [--prm PATH] [--threads 0]

Setup: the embedded default model (SmolLM2-135M-Instruct) as the policy, LoRA r=16 on its last 8
layers, fp32 on CPU; GRPO groups of ``--episodes`` episodes of one query per step, up to
``--max-steps`` code steps of at most 32 tokens each (constrained decoding ``line``), real
executor, tool simulator (ToolBench's example queries) or the TMDB mock (RestBench-TMDB, ~1,600
prompt tokens); rewards outcome + on-the-spot + PRM with process supervision. The PRM is
``--prm`` (a train-prm folder), else ``runs/quickstart/train/prm`` when it exists, else the
default model with fresh label rows (untrained: the same compute, meaningless scores).

Per GRPO step (wall clock, from the trainer's own step): ``generation`` and ``execution`` of the
rollout (``EpisodeRunner.stats``), ``prm scoring`` (the PRM reward function), ``other rewards``,
and ``optimisation`` (the rest: TRL's log-prob forward, loss, backward, optimiser step). Then the
PRM side by side on the last step's episodes: every step of an episode scored in one call
(``LocalPRMScorer``; its steps share the query and tools, and each step's history holds the
earlier steps: ``trie`` computes each shared run once through the KV cache, ``packed`` shares the
query and tools in one forward with a block mask) against one call per step (one forward per
step), with the largest score difference. The training run uses the scorer's ``auto`` mode. Last, one
forward+backward of that batch's rows: TRL's per-row forward against the group's shared prompt
run once (``PolicyGRPOTrainer``'s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _result import emit  # benchmarks/_result.py
from transformers import TrainerCallback

REPO = Path(__file__).resolve().parents[1]


def scorer_for(spec: str | None):
    from codetool.prm.folder import new_prm
    from codetool.prm.format import PRMFormat
    from codetool.prm.scorer import LocalPRMScorer

    pipeline = REPO / "runs" / "quickstart" / "train" / "prm"
    path = spec or (str(pipeline) if (pipeline / "prm_config.json").is_file() else None)
    if path:
        return LocalPRMScorer.from_checkpoint(path, device="cpu", dtype="float32"), path
    fmt = PRMFormat(max_length=2048, max_suffix_length=256)
    model, tok = new_prm("default", fmt, dtype="float32", device="cpu")
    return LocalPRMScorer(model, tok, fmt), "untrained default model (fresh label rows)"


class StepClock(TrainerCallback):
    """Wall seconds of each optimisation step (rollout included: TRL generates inside the step)."""

    def __init__(self):
        self.seconds, self._t = [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._t)


def shared_prompt_timing(trainer, episodes, repeats: int) -> dict[str, float]:
    """Seconds of one forward+backward of ``episodes``' rows: TRL's per-row forward against the
    shared-prompt one (``codetool.policy.trainer.shared_prompt_logps``), best of ``repeats``."""
    from trl import GRPOTrainer
    from trl.trainer.utils import pad

    from codetool.policy.trainer import shared_prompt_logps

    tok = trainer.processing_class
    prompts = pad([torch.tensor(e.prompt_ids) for e in episodes], padding_value=tok.pad_token_id, padding_side="left")
    pmask = pad([torch.ones(len(e.prompt_ids), dtype=torch.long) for e in episodes], padding_value=0,
                padding_side="left")
    comps = pad([torch.tensor(e.completion_ids or [0]) for e in episodes], padding_value=tok.pad_token_id,
                padding_side="right")
    cmask = pad([torch.ones(len(e.completion_ids or [0]), dtype=torch.long) for e in episodes], padding_value=0,
                padding_side="right")
    ids, mask, width = torch.cat([prompts, comps], 1), torch.cat([pmask, cmask], 1), comps.shape[1]
    model = trainer.model.train()
    out = {}
    for name, fn in (("trl_s", lambda: GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, mask, width)),
                     ("shared_s", lambda: shared_prompt_logps(trainer, model, ids, mask, width, False))):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            logps = fn()[0]
            (logps * cmask).sum().backward()
            best = min(best, time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        out[name] = best
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--queries", choices=("toolbench", "restbench"), default="toolbench")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--prm", default=None)
    parser.add_argument("--repeats", type=int, default=2, help="repeats of the side-by-side PRM timing")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import contextlib
    import tempfile

    from codetool.assemble import tool_backend
    from codetool.config import load_config
    from codetool.policy.config import TrainPolicyConfig
    from codetool.policy.data import backend_kind, make_tasks, training_queries
    from codetool.policy.train import build_trainer

    prompts = ([{"benchmark": "toolbench", "queries": "ToolBench/data_example/instruction"}] if args.queries == "toolbench"
               else [{"benchmark": "restbench-tmdb", "subset": "codetool", "offset": 8, "limit": 8}])
    tmp = tempfile.mkdtemp(prefix="bench-policy-rl-")
    cfg = load_config(TrainPolicyConfig, None, {
        "output_dir": tmp, "prompts": prompts, "evals": [], "max_steps": args.steps, "num_generations": args.episodes,
        "per_device_train_batch_size": args.episodes, "lora_layers": 8, "save_steps": 10**6, "learning_rate": 5e-4,
        "settings": [{"name": "outcome+spot+prm", "grounded": 1.0, "on_the_spot": 0.5, "prm": 0.5}],
        "rollout": {"max_steps": args.max_steps, "max_new_tokens": 32, "max_observation_chars": 300,
                    "constrain": "line"}, "executor": {"timeout_s": 10}})
    scorer, prm_name = scorer_for(args.prm)
    with contextlib.ExitStack() as stack:
        bench = "restbench-tmdb" if args.queries == "restbench" else "toolbench"
        backend = stack.enter_context(tool_backend(backend_kind(cfg, bench), benchmark=bench))
        tasks = make_tasks(training_queries(cfg), {bench: backend}, cfg)
        trainer = build_trainer(cfg.run_config(cfg.run_settings[0], 0, tmp), tasks, scorer=scorer, prm_name=prm_name)
        clock = StepClock()
        trainer.add_callback(clock)
        batches: list = []
        rollout = trainer.rollout_func

        def recorded(prompts_, trainer_):
            out = rollout(prompts_, trainer_)
            batches.append(out["episode"])
            return out

        trainer.rollout_func = recorded
        marks: list[dict] = []
        stats = trainer.runner.stats
        rewards = {f.name: f for f in trainer.reward_objects}

        class Marks(TrainerCallback):
            def on_step_end(self, *a, **k):
                marks.append({"generation": stats.generation_s, "execution": stats.execution_s,
                              "prm": rewards["prm"].seconds,
                              "rewards": sum(f.seconds for n, f in rewards.items() if n != "prm")})

        trainer.add_callback(Marks())
        trainer.train()
    rows, previous = [], {"generation": 0.0, "execution": 0.0, "prm": 0.0, "rewards": 0.0}
    for total, mark in zip(clock.seconds, marks):
        part = {k: mark[k] - previous[k] for k in previous}
        part["optimisation"] = total - sum(part.values())
        part["total"] = total
        rows.append(part)
        previous = mark
    print(f"policy RL step ({args.queries}, {args.episodes} episodes x <= {args.max_steps} steps; PRM: {prm_name})")
    print(f"{'step':>4} {'generation':>11} {'execution':>10} {'prm scoring':>12} {'other rewards':>14} "
          f"{'optimisation':>13} {'total':>8}")
    for i, r in enumerate(rows, 1):
        print(f"{i:>4} {r['generation']:>10.1f}s {r['execution']:>9.2f}s {r['prm']:>11.2f}s {r['rewards']:>13.3f}s "
              f"{r['optimisation']:>12.1f}s {r['total']:>7.1f}s")
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    # the PRM side by side on the last step's episodes
    reward = trainer.reward_objects[[f.name for f in trainer.reward_objects].index("prm")]
    episodes = [e for e in batches[-1] if any(s.candidate.code for s in e.steps)]
    items = [[it for it in reward.items(e) if it is not None] for e in episodes]
    modes = [m for m in ("trie", "packed") if getattr(scorer, "share_prefix", None) is not None]
    shared_t: dict[str, list[float]] = {m: [] for m in modes}
    single_t, diff = [], 0.0
    for _ in range(args.repeats):
        for mode in modes:  # every step of an episode in one call, with each way of sharing its prefixes
            scorer.share_prefix = mode
            t0 = time.perf_counter()
            together = [scorer.score(its) for its in items]
            shared_t[mode].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        alone = [[scorer.score([it])[0] for it in its] for its in items]
        single_t.append(time.perf_counter() - t0)
        diff = max([diff] + [abs(a - b) for x, y in zip(together, alone) for a, b in zip(x, y)])
    steps = sum(len(its) for its in items)
    ratios = {m: min(single_t) / min(t) for m, t in shared_t.items()}
    print(f"\nPRM on {len(items)} episodes ({steps} steps): one call per step {min(single_t):.2f} s; one call per "
          "episode " + ", ".join(f"{m} {min(shared_t[m]):.2f} s ({ratios[m]:.2f}x)" for m in modes)
          + f" (largest score difference {diff:.1e})")
    best = max(ratios, key=ratios.get)
    forward = shared_prompt_timing(trainer, batches[-1], args.repeats)
    print(f"training forward+backward of that batch: TRL's {forward['trl_s']:.2f} s, the group's prompt once "
          f"{forward['shared_s']:.2f} s ({forward['trl_s'] / forward['shared_s']:.2f}x)")
    emit(benchmark="policy_rl", queries=args.queries, episodes=args.episodes, steps=len(rows),
         generation_s=round(median["generation"], 2), execution_s=round(median["execution"], 3),
         prm_scoring_s=round(median["prm"], 3), optimisation_s=round(median["optimisation"], 2),
         step_s=round(median["total"], 2), prm_per_step_s=round(min(single_t), 3),
         **{f"prm_episode_{m}_s": round(min(t), 3) for m, t in shared_t.items()},
         prm_shared_prefix_ratio=round(ratios[best], 2), prm_shared_mode=best, prm_max_diff=diff, prm=prm_name,
         forward_trl_s=round(forward["trl_s"], 2), forward_shared_prompt_s=round(forward["shared_s"], 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
