"""One policy RL run: build the trainer for a reward setting and seed, train (resumably), save the policy.

:func:`build_trainer` loads the policy (LoRA on every layer or on the last ``lora_layers``, or
full), builds the rollout (:mod:`codetool.policy.rollout`), the setting's reward functions and
weights, the token budget, and a :class:`~codetool.policy.trainer.PolicyGRPOTrainer` over a
dataset of task keys. :func:`train_run` trains it from the run's last checkpoint (``resume:
auto``), merges a LoRA adapter, writes the policy folder (``<run>/policy``: weights, tokenizer
with its chat template, ``codetool_policy.json`` and a model card naming the PRM and the reward
weights) that ``codetool run --policy DIR`` loads, and returns the run's summary (reward curve,
steps, tokens, seconds, and ``dropped_episodes``: episodes left out of their GRPO group because a
step could not be executed, a failure of the machine).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from codetool import __version__

from .config import TrainPolicyConfig

if TYPE_CHECKING:
    from codetool.judge.records import Judge
    from codetool.rewards import PRMScorer

logger = logging.getLogger(__name__)

POLICY_INFO = "codetool_policy.json"


def _linear_names(model) -> list[str]:
    names = {name.split(".")[-1] for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and "lm_head" not in name}
    return sorted(names)


def peft_config(cfg: TrainPolicyConfig, model):
    """The LoRA config of ``cfg`` (``None`` for full fine-tuning)."""
    if cfg.finetune != "lora":
        return None
    targets, layers = None, None
    if cfg.lora_layers:
        total = int(model.config.num_hidden_layers)
        layers = list(range(max(total - cfg.lora_layers, 0), total))
        if cfg.lora_target_modules == ["all-linear"]:
            targets = _linear_names(model)  # PEFT takes a layer list only with named modules
    return cfg.lora_config(targets=targets, layers=layers)


def build_trainer(cfg: TrainPolicyConfig, tasks: dict, *, scorer: PRMScorer | None = None, judge: Judge | None = None,
                  prm_name: str = "none"):
    """A ready-to-train ``PolicyGRPOTrainer`` for a run config (``cfg.run_config(...)``).

    Args:
        tasks (`dict[str, SearchTask]`): task key -> training task.
        scorer (`PRMScorer`, *optional*): the frozen PRM (needed when the setting weights ``prm``).
        judge (`Judge`, *optional*): needed when the setting weights ``judged``.
        prm_name (`str`, *optional*): what the model card calls the PRM.
    """
    from datasets import Dataset

    from codetool.assemble import executor_factory
    from codetool.models.loading import load_model

    from .rewards import build_rewards
    from .rollout import EpisodeRunner, LocalGenerator, VLLMGenerator, make_rollout_func
    from .trainer import PolicyGRPOTrainer, TokenBudget

    dtype = cfg.policy_dtype if cfg.policy_dtype != "auto" else (
        "bfloat16" if torch.cuda.is_available() and cfg.finetune == "lora" else "float32")
    model, tokenizer = load_model(cfg.policy, dtype=dtype, device="cpu", for_training=True)
    tokenizer.padding_side = "left"  # GRPO's prompts are left-padded
    setting = cfg.rewards
    funcs, weights = build_rewards(setting.weights, aggregate=cfg.aggregate, scorer=scorer, judge=judge,
                                   allow_weak_judge=cfg.allow_weak_judge, step=cfg.rollout)
    cfg.reward_weights = weights
    runner = EpisodeRunner(tokenizer, cfg.rollout, executor_factory(cfg.executor), seed=cfg.seed,
                           max_positions=getattr(model.config, "max_position_embeddings", None),
                           lockstep=cfg.use_vllm and cfg.world_size > 1, workers=cfg.rollout_workers)
    budget = TokenBudget(cfg.token_budget)
    local: dict = {}

    def generator_for(trainer):
        if trainer.use_vllm:
            return VLLMGenerator(trainer, runner.stop)
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if "gen" not in local:
            local["gen"] = LocalGenerator(unwrapped, tokenizer, temperature=cfg.temperature, top_p=cfg.top_p)
        local["gen"].begin(unwrapped)
        return local["gen"]

    keys = sorted(tasks)

    def on_episodes(episodes) -> None:
        # the trainer's budget, not `budget`: a resume replaces it by the checkpoint's (its count restored)
        assert trainer.token_budget is not None  # callbacks=[budget]: a TokenBudget is among them
        trainer.token_budget.add(episodes)
        trainer.note_episodes(episodes)  # their constraints, replayed for the log-probs (codetool.policy.constrained)

    trainer: PolicyGRPOTrainer = PolicyGRPOTrainer(
        model=model, reward_funcs=funcs, args=cfg, train_dataset=Dataset.from_list([{"prompt": k} for k in keys]),
        processing_class=tokenizer, peft_config=peft_config(cfg, model), callbacks=[budget],
        rollout_func=make_rollout_func(runner, tasks, generator_for, on_episodes=on_episodes),
        advantage=cfg.advantage, step_weights=dict(zip([f.name for f in funcs], weights)),
        share_prompt=cfg.share_prompt, runner=runner, aggregate=cfg.aggregate,
        outcomes=tuple(f.name for f in funcs if f.outcome), credit_temperature=cfg.credit_temperature,
        aggregates={f.name: f.always for f in funcs if f.always})
    trainer.codetool_info = {"policy": cfg.policy, "prm": prm_name, "setting": setting.name,
                             "reward_weights": setting.weights, "aggregate": cfg.aggregate,
                             "advantage": cfg.advantage, "loss_type": cfg.loss_type, "seed": cfg.seed,
                             "token_budget": cfg.token_budget,
                             "prompts": len(keys), "finetune": cfg.finetune, "codetool_version": __version__}
    trainer.reward_objects = funcs
    return trainer


def reward_curve(log_history: list[dict]) -> list[dict]:
    """Per logged step: ``step``, ``reward`` and each ``rewards/<name>/mean`` (the training curve)."""
    out = []
    for entry in log_history:
        if "reward" not in entry:
            continue
        point = {"step": entry.get("step"), "reward": entry["reward"]}
        point.update({k.split("/")[1]: v for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean")})
        point.update({k: v for k, v in entry.items() if k.startswith("outcomes/")})
        point["generated_tokens"] = entry.get("episodes/generated_tokens")
        out.append(point)
    return out


def _resume_path(cfg: TrainPolicyConfig) -> str | None:
    """The checkpoint to resume from: ``auto`` the newest *whole* one (a save cut short by a kill
    is removed, not resumed: ``codetool.prm.checkpoints``), a folder as given once it is whole."""
    from codetool.prm.checkpoints import resume_checkpoint

    return resume_checkpoint(cfg.resume_from_checkpoint or cfg.resume, cfg.output_dir)


def train_run(cfg: TrainPolicyConfig, tasks: dict, *, scorer: PRMScorer | None = None, judge: Judge | None = None,
              prm_name: str = "none") -> dict:
    """Train one run and write ``<output_dir>/policy`` and ``run.json``; returns the summary."""
    trainer = build_trainer(cfg, tasks, scorer=scorer, judge=judge, prm_name=prm_name)
    resume = _resume_path(cfg)
    if resume:
        logger.info("resuming %s from %s", cfg.rewards.name, resume)
    start = time.time()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.time() - start
    timing = {"generation_s": trainer.runner.stats.generation_s, "execution_s": trainer.runner.stats.execution_s,
              "reward_s": {f.name: f.seconds for f in trainer.reward_objects}}
    summary = {**trainer.codetool_info, "steps": trainer.state.global_step, "seconds": round(seconds, 1),
               "generated_tokens": trainer.token_budget.generated, "curve": reward_curve(trainer.state.log_history),
               "outcomes": dict(trainer.outcome_counts), "timing": timing,
               "advantage_shares": {name: sum(v) / len(v) for name, v in trainer.shares.items() if v},
               "dropped_episodes": trainer.dropped_episodes,
               "inexact_steps": trainer.runner.stats.inexact_steps}
    policy_dir = Path(cfg.output_dir) / "policy"
    save_policy(trainer, policy_dir, summary)
    summary["policy_dir"] = str(policy_dir)
    Path(cfg.output_dir, "run.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def save_policy(trainer, folder: Path, summary: dict) -> Path:
    """Merge a LoRA adapter and write a loadable policy folder with its model card."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if trainer.args.should_save:
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        trainer.processing_class.save_pretrained(folder)
        info = {k: v for k, v in summary.items() if k not in ("curve",)}
        (folder / POLICY_INFO).write_text(json.dumps(info, indent=2, default=str))
        (folder / "README.md").write_text(model_card(summary))
    trainer.merged_model = model
    return folder


def model_card(summary: dict) -> str:
    """The policy's model card: base model, PRM, reward weights, advantage, data, steps."""
    weights = ", ".join(f"{k} {v:g}" for k, v in summary["reward_weights"].items())
    curve = summary.get("curve") or []
    first, last = (curve[0]["reward"], curve[-1]["reward"]) if curve else (None, None)
    lines = ["---", f"base_model: {summary['policy']}", "library_name: transformers",
             "tags: [codetool, trl, grpo, tool-use, process-reward]", "---", "",
             f"# codetool policy: {summary['setting']}", "",
             f"GRPO ({summary['advantage']} advantages) of `{summary['policy']}` on code-tool episodes with "
             "codetool's executor and tool environment (`codetool train-policy`).", "",
             f"- PRM: {summary['prm']}",
             f"- reward weights: {weights} (per-step rewards aggregated by {summary['aggregate']} for sequence "
             "advantages)",
             f"- fine-tuning: {summary['finetune']}; seed {summary['seed']}; {summary['steps']} steps; "
             f"{summary['generated_tokens']} generated policy tokens (budget {summary['token_budget'] or 'none'})",
             f"- training prompts: {summary['prompts']} queries (ToolBench training distribution / RestBench-TMDB, "
             "never the evaluation sets)",
             f"- training reward: {first} at the first logged step, {last} at the last" if curve else "- no steps logged",
             "", "Load it with `codetool run --policy <this folder>`.", ""]
    return "\n".join(lines)
