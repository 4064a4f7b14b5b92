"""The testbed's warm-started policy: the embedded model fine-tuned on world demonstrations.

A 135M model rarely solves a multi-step tool query, so trees carry no success signal and the
PRM can only learn whether a step runs. The testbed (docs/TESTBED.md) therefore starts from a
policy that succeeds on a share of *held-out* world queries: the embedded SmolLM2-135M-Instruct,
fine-tuned briefly with TRL's ``SFTTrainer`` on demonstrations of the world's *train* templates.

A demonstration is one query solved by its scripted calls (:mod:`codetool.world.queries`), run
for real: each step's code runs in the executor on the query's tools (through
:class:`~codetool.world.WorldBackend`), and the observation is what the search would show
(:func:`codetool.search.prompt.format_observation`). It is written in the search's exact step
format: the prompt is :func:`~codetool.search.prompt.policy_messages` rendered with the model's
chat template, the reply opens inside the code fence (``code_prefix``) and is one constrained
line (``constrain: line`` with literal arguments): ``result = tool(kw="x", n=3)`` then
``print(result)``, or ``finish("<answer>")``. One row is one whole episode; the loss falls on the
replies only (``assistant_masks``), each tokenized alone, as the policy generates it. A share of
the demonstrations (``recover_share``) first makes a wrong call (a misspelled id, a wrong
argument name) whose error the next step recovers from; the wrong step itself is never a target.

:func:`build_testbed_policy` trains (LoRA merged into the weights, or full), saves the model
under ``checkpoints/testbed/`` with a manifest written last (as ``codetool setup`` caches the
default model), and is deterministic given ``seed`` and the machine's torch. ``testbed`` as a
model name resolves to it (:func:`codetool.models.loading.resolve_model`).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.config_groups import with_defaults
from codetool.tools.config import ToolDocGroup

logger = logging.getLogger(__name__)


@with_defaults(tool_doc="brief")  # as the testbed's search shows them
class WarmStartDocs(ToolDocGroup):
    """The tool-doc group of the warm start's demonstrations."""


@dataclass
class WarmStartConfig(WarmStartDocs):
    """How the testbed policy is built (``codetool setup --testbed``; the ``warmstart.*`` options)."""

    base: str = option("default", "the model to fine-tune (default: the embedded SmolLM2-135M-Instruct)")
    seed: int = option(0, "seed of the demonstrations' queries, the recoveries and the training")
    per_template: int = option(8, "demonstrations per train template (12 templates)")
    recover_share: float = option(0.25, "share of demonstrations that first make a wrong call and recover")
    finetune: str = option("full", "full fine-tuning or a LoRA merged into the weights", choices=["full", "lora"])
    lora_r: int = option(32, "LoRA rank (finetune lora)")
    train_layers: int = option(12, "train the last N decoder layers only (the backward pass stops there: cheaper on a "
                               "CPU); 0: every layer and the embeddings")
    epochs: float = option(2.0, "passes over the demonstrations")
    learning_rate: float = option(2e-4, "peak learning rate (cosine, 5% warmup)")
    batch_size: int = option(4, "episodes per optimisation step")
    torch_threads: int = option(0, "CPU threads of torch (0: its default)")
    max_observation_chars: int = option(400, "output shown per step, as the testbed's search shows it")

    def __post_init__(self):
        super().__post_init__()
        if self.per_template < 1 or self.epochs <= 0 or self.learning_rate <= 0 or self.batch_size < 1 \
                or self.train_layers < 0:
            raise ConfigError(f"warmstart: need per_template >= 1, epochs > 0, learning_rate > 0, batch_size >= 1, "
                              f"train_layers >= 0; got {self.per_template}, {self.epochs}, {self.learning_rate}, "
                              f"{self.batch_size}, {self.train_layers}.")
        if not 0.0 <= self.recover_share <= 1.0:
            raise ConfigError(f"warmstart.recover_share must lie in [0, 1], got {self.recover_share}.")


def call_code(name: str, arguments: dict, *, assign: bool = True) -> str:
    """One constrained step: ``result = name(kw="text", n=3)`` and ``print(result)``."""
    parts = []
    for key, value in arguments.items():
        if isinstance(value, str):
            parts.append(f'{key}="{value}"')
        else:
            parts.append(f"{key}={int(value) if float(value).is_integer() else value}")
    call = f"{name}({', '.join(parts)})"
    return f"result = {call}\nprint(result)" if assign else call


def _wrong_call(name: str, arguments: dict, rng: random.Random) -> tuple[str, dict] | None:
    """A plausible mistake on this call: a mistyped id, or an argument name that does not exist."""
    ids = [k for k, v in arguments.items() if isinstance(v, str) and k.endswith("_id") and len(v) > 3]
    if ids and rng.random() < 0.6:
        key = rng.choice(ids)
        digits = list(arguments[key])
        i = rng.randrange(1, len(digits) - 1)
        digits[i], digits[i + 1] = digits[i + 1], digits[i]
        if "".join(digits) != arguments[key]:
            return name, {**arguments, key: "".join(digits)}
    if arguments:
        key = rng.choice(sorted(arguments))
        wrong = {"name": "city", "email": "user", "date": "day", "city_id": "city", "days": "n"}.get(key, key + "_value")
        return name, {(wrong if k == key else k): v for k, v in arguments.items()}
    return None


def demonstrations(queries: list, *, max_observation_chars: int, recover_share: float, seed: int,
                   tool_doc: str = "brief") -> list[dict]:
    """Each world query (``WorldQuery``) solved step by step in the executor.

    Returns:
        One dict per query: ``query``, ``tools`` (rendered), ``steps`` (``{"code", "observation",
        "target"}``; ``target`` False for a deliberate mistake) and ``answer``.
    Raises:
        CodetoolError: a scripted step failed (a bug of the world, never of a model).
    """
    from codetool.executor import Executor, ExecutorConfig
    from codetool.search.prompt import format_observation
    from codetool.tools.environment import ToolEnvironment
    from codetool.world import WorldBackend, to_benchmark_query

    rng = random.Random(f"warmstart:{seed}")
    backend, out = WorldBackend(), []
    for q in queries:
        env = ToolEnvironment.from_query(to_benchmark_query(q), backend, max_response_chars=20000,
                                         render_style=tool_doc)
        plan = [(call_code(n, a), True) for n, a in q.calls]
        if rng.random() < recover_share:
            k = rng.randrange(len(q.calls))
            name, arguments = q.calls[k]
            wrong = _wrong_call(name, arguments, rng)
            if wrong is not None:
                plan.insert(k, (call_code(*wrong), False))
        steps = []
        with Executor(ExecutorConfig(timeout_s=20), tools=env.functions()) as ex:
            for code, target in plan:
                result = ex.run(code)
                if target and not result.ok:
                    raise CodetoolError(f"world demonstration {q.query_id}: step {code!r} failed "
                                        f"({result.error_message}).")
                if not target and result.ok:  # the mistake happened to be valid: no mistake to recover from
                    continue
                steps.append({"code": code, "target": target,
                              "observation": format_observation(result, max_chars=max_observation_chars)})
        steps.append({"code": f'finish("{q.answer}")', "target": True, "observation": ""})
        out.append({"query_id": q.query_id, "query": q.query, "tools": env.render(), "steps": steps})
    return out


def tokenize_demo(tokenizer, demo: dict) -> dict:
    """``input_ids`` and ``assistant_masks`` of one demonstration: each prompt segment as the
    search renders it, each reply tokenized alone (as generated), the loss on target replies only."""
    from codetool.search.prompt import CODE_PREFIX, policy_messages

    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    history: list[dict] = []
    for step in demo["steps"]:
        messages = policy_messages(demo["query"], demo["tools"], history) + [
            {"role": "assistant", "content": CODE_PREFIX}]
        prompt = tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
        if not prompt.startswith(rendered):
            raise CodetoolError("the chat template does not render a step's prompt as an extension of the last "
                                "one; the warm start needs a template that does (SmolLM2's does).")
        piece = tokenizer(prompt[len(rendered):], add_special_tokens=False)["input_ids"]
        reply = f"{step['code']}\n```"
        reply_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
        ids += piece + reply_ids
        mask += [0] * len(piece) + [int(step["target"])] * len(reply_ids)
        rendered = prompt + reply
        history.append({"code": step["code"], "text": CODE_PREFIX + reply, "observation": step["observation"]})
    return {"input_ids": ids, "assistant_masks": mask}


def reply_loss(model, input_ids, attention_mask, labels):
    """Mean cross-entropy of the reply tokens, with logits computed only where a reply token is
    predicted (the lm_head over a 49k vocabulary at every position is a fifth of a CPU step and most
    of its memory). Returns ``(loss, tokens)``.

    Args:
        input_ids, attention_mask, labels: ``(batch, length)``; ``labels`` -100 off the replies.
    """
    import torch.nn.functional as F

    nxt = labels[:, 1:]
    keep = (nxt != -100).any(dim=0).nonzero().squeeze(1)  # positions that predict a reply token in some row
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
    gold = nxt[:, keep]
    tokens = int((gold != -100).sum())
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), gold.reshape(-1), ignore_index=-100,
                           reduction="sum") / max(tokens, 1)
    return loss, tokens


def _reply_trainer():
    from trl import SFTTrainer

    class ReplyTrainer(SFTTrainer):
        """TRL's ``SFTTrainer`` whose loss is :func:`reply_loss` (logits at reply positions only)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, _ = reply_loss(model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"])
            return (loss, None) if return_outputs else loss

    return ReplyTrainer


# Settings of how the policy is computed, not of what it is: a cached policy built with other
# values of these is the same policy.
EXECUTION_ONLY = ("torch_threads",)


def _model_settings(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in EXECUTION_ONLY}


def testbed_dir(root: Path | None = None) -> Path:
    """Where the testbed policy is cached (``<checkpoints>/testbed/world-policy``)."""
    from codetool.models.loading import TESTBED_MODEL_SUBDIR, checkpoints_dir

    return (root if root is not None else checkpoints_dir()) / TESTBED_MODEL_SUBDIR


def build_testbed_policy(cfg: WarmStartConfig, root: Path | None = None, *, force: bool = False) -> Path:
    """Fine-tune ``cfg.base`` on world demonstrations and cache it (module docstring).

    Idempotent: a cached policy whose manifest records the same settings is returned at once
    (settings that change how it is computed, not what, e.g. ``torch_threads``, are left out of
    that comparison: a policy built with 2 threads serves a run that asks for the default).

    Returns:
        `Path`: the folder of the cached policy.
    Raises:
        CodetoolError: the base model is missing (``codetool setup`` first), or a demonstration failed.
    """
    from codetool.models.loading import MANIFEST_NAME

    target = testbed_dir(root)
    settings = asdict(cfg)
    manifest_path = target / MANIFEST_NAME
    if manifest_path.is_file() and not force:
        if _model_settings(json.loads(manifest_path.read_text()).get("settings") or {}) == _model_settings(settings):
            logger.info("testbed policy already cached at %s (use --force to rebuild)", target)
            return target
        logger.info("testbed policy at %s was built with other settings: rebuilding", target)
    base = cfg.base
    if root is not None and base == "default":  # the default model of the checkpoints folder given
        from codetool.models.loading import DEFAULT_MODEL_SUBDIR

        base = str(root / DEFAULT_MODEL_SUBDIR)
    return _train(cfg, target, settings, base)


def _train(cfg: WarmStartConfig, target: Path, settings: dict, base: str) -> Path:
    import torch
    import transformers
    from datasets import Dataset
    from trl import SFTConfig

    from codetool import __version__
    from codetool.models.loading import MANIFEST_NAME, load_model
    from codetool.world import generate, templates

    start = time.perf_counter()
    ReplyTrainer = _reply_trainer()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    transformers.set_seed(cfg.seed)
    queries = generate("train", cfg.per_template * len(templates("train")), seed=cfg.seed)
    demos = demonstrations(queries, max_observation_chars=cfg.max_observation_chars,
                           recover_share=cfg.recover_share, seed=cfg.seed, tool_doc=cfg.tool_doc)
    model, tokenizer = load_model(base, dtype="float32", for_training=True)
    rows = [tokenize_demo(tokenizer, d) for d in demos]
    tokens = sum(len(r["input_ids"]) for r in rows)
    logger.info("warm start: %d demonstrations (%d tokens, %d reply tokens) from %d train templates",
                len(rows), tokens, sum(sum(r["assistant_masks"]) for r in rows), len(templates("train")))
    layers = model.model.layers
    trained = list(range(len(layers) - cfg.train_layers, len(layers))) if cfg.train_layers else None
    if cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"],
                                                 layers_to_transform=trained, task_type="CAUSAL_LM"))
    elif trained is not None:  # the lower layers and the (tied) embeddings stay as they are
        for p in model.parameters():
            p.requires_grad_(False)
        for i in trained:
            layers[i].requires_grad_(True)
        model.model.norm.requires_grad_(True)
    work = target.with_name(target.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    args = SFTConfig(output_dir=str(work / "trainer"), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
                     lr_scheduler_type="cosine", warmup_steps=0.05, per_device_train_batch_size=cfg.batch_size,
                     logging_steps=5, save_strategy="no", report_to="none", seed=cfg.seed, data_seed=cfg.seed,
                     max_length=None, use_cpu=not torch.cuda.is_available(), dataloader_pin_memory=False,
                     bf16=False, gradient_checkpointing=False, gradient_accumulation_steps=1)
    trainer = ReplyTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    result = trainer.train()
    model = trainer.model
    if cfg.finetune == "lora":
        model = model.merge_and_unload()
    model.eval()
    model.save_pretrained(work, safe_serialization=True)
    tokenizer.save_pretrained(work)
    shutil.rmtree(work / "trainer", ignore_errors=True)
    curve = [{"step": e["step"], "loss": round(e["loss"], 4)} for e in trainer.state.log_history if "loss" in e]
    manifest = {"model": "testbed world policy", "base": cfg.base, "settings": settings,
                "demonstrations": len(rows), "tokens": tokens, "train_loss": round(result.training_loss, 4),
                "curve": curve, "codetool": __version__, "transformers": transformers.__version__,
                "torch": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.perf_counter() - start, 1)}
    (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work.rename(target)
    logger.info("testbed policy ready at %s (%.0f s, train loss %.3f)", target, manifest["seconds"],
                manifest["train_loss"])
    return target
