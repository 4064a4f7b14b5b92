"""``PolicyGRPOTrainer``: TRL's ``GRPOTrainer`` with process supervision and a shared-prompt forward.

The rollouts (``rollout_func``), the reward functions (``reward_funcs`` + ``reward_weights``),
the sequence-level advantage, the loss, checkpoints, resume, DDP/DeepSpeed and vLLM generation
are TRL's. The subclass adds two things TRL cannot do from the outside, each a method override:

- ``_generate_and_score_completions``: with ``advantage: anchored`` (the default) or
  ``deepseekmath`` it replaces TRL's (batch,) advantages by (batch, tokens) ones from the step
  rewards (:mod:`codetool.policy.advantages`; TRL's loss takes either shape), logs each reward's
  share of the advantage's variance (``advantages/share_<name>``), the per-step outcome histogram
  (``outcomes/<category>`` shares, and one JSON line per rollout in ``outcomes.jsonl``), the share
  of episodes dropped from their group (``episodes/dropped``: a step the machine could not run;
  their rewards are ``None``, :mod:`codetool.policy.rewards`) and the rollout's timings;
- ``_get_per_token_logps_and_entropies``: the episodes of a group share their prompt (system
  prompt, tools, query: most of the row), so it runs each distinct prompt once and the group's
  completions on its KV cache, gradients flowing through the cache; the log-probabilities and
  entropies are TRL's (its fused LM head, at GRPO's temperature) to float rounding (tested).
  Off with activation checkpointing (no cache there), several processes (DDP expects one
  forward per backward) or multimodal inputs. Steps sampled under ``rollout.constrain`` get the
  log-probabilities of the constrained distribution they were sampled from, in the loss and in
  TRL's old and reference log-probabilities alike (:mod:`codetool.policy.constrained`).

:class:`TokenBudget` stops a run once its rollouts generated ``token_budget`` policy tokens (the
compute matching of the reward-setting comparison) and is restored on resume: the rollouts count
into the callback the trainer holds (``PolicyGRPOTrainer.token_budget``), the restored one after a
resume, so a resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from trl import GRPOTrainer

from .advantages import (
    ESTIMATORS,
    OUTCOME_REWARDS,
    advantage_shares,
    process_advantages,
    sequence_components,
    step_mask,
)
from .constrained import ConstraintMasks, constrained_logps, mask_ids, masked_logps
from .episode import CATEGORIES, step_category

logger = logging.getLogger(__name__)


class TokenBudget(TrainerCallback, ExportableState):
    """Stop training once the rollouts generated ``budget`` policy tokens (0: never).

    Args:
        budget (`int`, *optional*, defaults to 0): policy-generated tokens (environment tokens excluded).
    """

    def __init__(self, budget: int = 0):
        self.budget = int(budget)
        self.generated = 0

    def add(self, episodes) -> None:
        """Count the tokens the policy generated in ``episodes``."""
        self.generated += sum(e.generated_tokens for e in episodes)

    def on_step_end(self, args, state, control, **kwargs):
        if self.budget and self.generated >= self.budget:
            logger.info("token budget reached: %d of %d generated tokens after %d steps", self.generated,
                        self.budget, state.global_step)
            control.should_training_stop = True
        return control

    def state(self) -> dict:
        return {"args": {"budget": self.budget}, "attributes": {"generated": self.generated}}


class PolicyGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` for code-tool episodes (see the module docstring).

    Args:
        advantage (`str`, *optional*, defaults to ``"sequence"``): ``sequence`` (TRL's), ``anchored`` or
            ``deepseekmath`` (:mod:`codetool.policy.advantages`).
        step_weights (`dict[str, float]`, *optional*): reward name -> weight.
        aggregate (`str`), outcomes (`tuple[str, ...]`), credit_temperature (`float`): as
            :func:`~codetool.policy.advantages.process_advantages` takes them.
        share_prompt (`bool`, *optional*, defaults to `True`): the shared-prompt forward.
        runner (`EpisodeRunner`, *optional*): its stats are logged (generation/execution seconds).
        Other arguments: as ``GRPOTrainer`` (``rollout_func`` runs the episodes).
    """

    _tag_names = ["trl", "grpo", "codetool", "policy-rl"]

    def __init__(self, *args, advantage: str = "sequence", step_weights: dict[str, float] | None = None,
                 share_prompt: bool = True, runner=None, aggregate: str = "mean", outcomes=OUTCOME_REWARDS,
                 aggregates: dict[str, str] | None = None, credit_temperature: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.advantage, self.step_weights = advantage, dict(step_weights or {})
        self.aggregate, self.outcomes, self.credit_temperature = aggregate, tuple(outcomes), credit_temperature
        self.aggregates = dict(aggregates or {})  # per reward, an aggregate of its own (tool cost: sum)
        self.shares: dict[str, list[float]] = {}  # per reward, its share of the advantage variance per batch
        vocab = self.accelerator.unwrap_model(self.model).get_output_embeddings().weight.shape[0]
        self.constraint_masks = ConstraintMasks(self.processing_class, vocab)
        self._constraint_rows: list | None = None  # the rollout's rows while TRL scores them
        self._constraint_ids: torch.Tensor | None = None  # the rows of the batch in the loss
        self.share_prompt, self.runner = share_prompt, runner
        self.outcome_counts: Counter = Counter()
        self.dropped_episodes = 0  # left out of their group: a step the machine could not run
        self._seen = {"generation_s": 0.0, "execution_s": 0.0, "inexact_steps": 0}

    # ----------------------------------------------------------------- constrained steps
    def note_episodes(self, episodes) -> None:
        """Called by the rollout with its episodes: the masks their constrained steps were sampled
        under (:mod:`codetool.policy.constrained`), used by every log-probability of this batch."""
        rows = self.constraint_masks.rows(episodes)
        self._constraint_rows = rows if any(rows) else None

    def _save_checkpoint(self, model, trial, *args, **kwargs):
        """The Trainer's checkpoint, then its completion marker once every process has saved
        (``codetool.prm.checkpoints``): a run killed during a save resumes from the one before."""
        from codetool.prm.checkpoints import mark_complete

        super()._save_checkpoint(model, trial, *args, **kwargs)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}",
                          self.state.global_step)

    def _compute_loss(self, model, inputs):
        self._constraint_ids = inputs.get("constraint_mask_ids")
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._constraint_ids = None

    def _masks_for(self, rows: int, width: int) -> torch.Tensor | None:
        """(rows, width) mask indices of the rows being scored (``None``: no constrained position)."""
        if self._constraint_ids is not None:
            ids = self._constraint_ids[:, :width]
        elif self._constraint_rows is not None and len(self._constraint_rows) == rows:
            ids = mask_ids(self._constraint_rows, width)
        else:
            return None
        return ids if bool((ids >= 0).any()) else None
    @property
    def token_budget(self) -> TokenBudget | None:
        """The :class:`TokenBudget` among the callbacks, the one to count into: on resume
        (``restore_callback_states_from_checkpoint``) ``Trainer`` replaces the one it was given by
        a new one holding the checkpoint's count, so a reference kept from before would count from
        zero and no longer stop the run (issue 39)."""
        return next((cb for cb in self.callback_handler.callbacks if isinstance(cb, TokenBudget)), None)

    # ----------------------------------------------------------------- advantages and logs
    def _generate_and_score_completions(self, inputs):
        try:
            out = super()._generate_and_score_completions(inputs)
            if self._constraint_rows is not None:
                out["constraint_mask_ids"] = mask_ids(self._constraint_rows, out["completion_ids"].shape[1]).to(
                    out["completion_ids"].device)
        finally:
            self._constraint_rows = None
        episodes = [x["episode"] for x in inputs]
        mode = "train" if self.model.training else "eval"
        self._log_episodes(episodes, mode)
        width = out["completion_ids"].shape[1]
        advantages, shares = self._process(episodes, width)
        if self.advantage in ESTIMATORS:
            out["advantages"] = advantages.to(out["advantages"].device)
        for name, share in shares.items():  # how much of the advantage each reward carries (the report's PRM share)
            self._metrics[mode][f"advantages/share_{name}"].append(share)
            if mode == "train":
                self.shares.setdefault(name, []).append(share)
        return out

    def _process(self, episodes, width: int) -> tuple[torch.Tensor, dict[str, float]]:
        """This process's rows of the batch's per-token advantages (``advantage`` ``anchored`` or
        ``deepseekmath``; for ``sequence``, TRL's on every token) and each reward's share of their
        variance over the whole batch (:func:`codetool.policy.advantages.advantage_shares`)."""
        from accelerate.utils import gather_object

        local = [(e.step_rewards, [s.span for s in e.steps]) for e in episodes]
        every = gather_object(local) if self.accelerator.num_processes > 1 else local
        group = self.num_generations if self.model.training else self.num_generations_eval
        start = self.accelerator.process_index * len(episodes)
        widest = max([width] + [spans[-1][1] for _, spans in every if spans])
        spans = [s for _, s in every]
        if self.advantage in ESTIMATORS:
            total, parts = process_advantages([r for r, _ in every], self.step_weights, spans, group, widest,
                                              estimator=self.advantage, aggregate=self.aggregate,
                                              aggregates=self.aggregates, outcomes=self.outcomes,
                                              temperature=self.credit_temperature, components=True)
        else:  # sequence: TRL's advantage of the aggregated rewards, every token alike
            total, parts = sequence_components([r for r, _ in every], self.step_weights, spans, group, widest,
                                               aggregate=self.aggregate, aggregates=self.aggregates,
                                               outcomes=self.outcomes)
        shares = advantage_shares(total, parts, step_mask(spans, widest))
        return total[start:start + len(episodes), :width], shares

    def _log_episodes(self, episodes, mode: str) -> None:
        counts = Counter(step_category(s, e.tool_names()) for e in episodes for s in e.steps)
        self.outcome_counts.update(counts)
        steps = max(sum(counts.values()), 1)
        for name in CATEGORIES:
            self._metrics[mode][f"outcomes/{name}"].append(counts.get(name, 0) / steps)
        self._metrics[mode]["episodes/steps"].append(sum(len(e.steps) for e in episodes) / max(len(episodes), 1))
        self._metrics[mode]["episodes/finish"].append(
            sum(e.finish_type == "finish" for e in episodes) / max(len(episodes), 1))
        self._metrics[mode]["episodes/generated_tokens"].append(float(sum(e.generated_tokens for e in episodes)))
        dropped = sum(e.dropped for e in episodes)
        self.dropped_episodes += dropped if mode == "train" else 0
        self._metrics[mode]["episodes/dropped"].append(dropped / max(len(episodes), 1))
        if self.runner is not None:
            stats = self.runner.stats
            for key in self._seen:
                value = getattr(stats, key)
                self._metrics[mode][f"rollout/{key}"].append(float(value - self._seen[key]))
                self._seen[key] = value
        if self.args.should_save and mode == "train":
            record = {"step": self.state.global_step, "time": round(time.time(), 3), "outcomes": dict(counts),
                      "episodes": len(episodes), "dropped": dropped}
            path = Path(self.args.output_dir) / "outcomes.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    # ----------------------------------------------------------------- shared-prompt forward
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        checkpointing = bool(getattr(self.args, "gradient_checkpointing", False)
                             or getattr(self.args, "activation_checkpointing", False))
        masks = self._masks_for(input_ids.shape[0], logits_to_keep)
        if (not self.share_prompt or compute_aux_loss or checkpointing or self.accelerator.num_processes > 1
                or any(v is not None for v in multimodal.values())):  # DDP: one forward per backward
            if masks is not None and not compute_aux_loss and all(v is None for v in multimodal.values()):
                return constrained_logps(self, model, input_ids, attention_mask, logits_to_keep, masks, batch_size,
                                         compute_entropy)
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal)
        return shared_prompt_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy, masks)


def shared_prompt_logps(trainer, model, input_ids, attention_mask, logits_to_keep: int, compute_entropy: bool,
                        masks: torch.Tensor | None = None):
    """``(logps, entropies, None)`` as ``GRPOTrainer._get_per_token_logps_and_entropies`` computes
    them, with each distinct prompt of the batch run once (see the module docstring).

    Args:
        input_ids, attention_mask: (batch, prompt width + ``logits_to_keep``), prompts left-padded.
        masks (`torch.Tensor`, *optional*): (batch, ``logits_to_keep``) indices into
            ``trainer.constraint_masks.table`` (``-1``: free): the log-probabilities are then the
            constrained distribution's (:func:`codetool.policy.constrained.masked_logps`).
    Returns:
        ``logps`` (batch, ``logits_to_keep``) and ``entropies`` (the same, or ``None``).
    """
    from transformers import DynamicCache

    key = cache_keyword(model)
    width = input_ids.shape[1] - logits_to_keep
    prompts: dict[tuple[int, ...], list[int]] = {}
    for i in range(input_ids.shape[0]):
        real = input_ids[i, :width][attention_mask[i, :width].bool()]
        prompts.setdefault(tuple(real.tolist()), []).append(i)
    parts, order = [], []
    config = getattr(model, "config", None) or trainer.accelerator.unwrap_model(model).config
    for prompt, rows in prompts.items():
        n, length = len(rows), len(prompt)
        head = torch.tensor([prompt[:-1]], device=input_ids.device)
        cache = DynamicCache(config=config)
        with trainer.accelerator.autocast():
            if length > 1:
                model(input_ids=head, use_cache=True, logits_to_keep=1, **{key: cache})
            layers = [(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1)) for layer in cache.layers]
            shared = DynamicCache(ddp_cache_data=layers, config=config) if length > 1 else None
            tail = torch.cat([torch.full((n, 1), prompt[-1], device=input_ids.device), input_ids[rows, width:]], dim=1)
            mask = torch.cat([torch.ones(n, length, dtype=attention_mask.dtype, device=attention_mask.device),
                              attention_mask[rows, width:]], dim=1)
            labels = tail.masked_fill(mask[:, length - 1:] == 0, -100)
            labels[:, 0] = -100
            positions = torch.arange(length - 1, length + logits_to_keep, device=input_ids.device).expand(n, -1)
            if masks is None:
                out = model(input_ids=tail, attention_mask=mask, position_ids=positions, labels=labels,
                            fused_lm_head=True, **{key: shared})
                logps, ent = out.log_probs[:, -logits_to_keep:], out.entropy[:, -logits_to_keep:] if compute_entropy else None
            else:  # logits, masked as the steps were sampled
                out = model(input_ids=tail, attention_mask=mask, position_ids=positions, **{key: shared})
                logps, ent = masked_logps(out.logits[:, :-1], tail[:, 1:], masks[rows], trainer.constraint_masks.table,
                                          trainer.temperature, compute_entropy)
        parts.append((logps, ent))
        order.extend(rows)
    index = torch.tensor(order, device=input_ids.device)
    logps = torch.cat([p for p, _ in parts])[torch.argsort(index)]
    entropies = torch.cat([e for _, e in parts])[torch.argsort(index)] if compute_entropy else None
    return logps, entropies, None


def cache_keyword(model) -> str:
    """The name a model's forward takes its KV cache by: ``cache`` (transformers >= 5.24) or
    ``past_key_values`` (earlier 5.x)."""
    import inspect

    base = model
    while hasattr(base, "get_base_model") or hasattr(base, "module"):
        base = base.get_base_model() if hasattr(base, "get_base_model") else base.module
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
