"""GRPO end to end on a tiny model (offline): the command, the shared-prompt forward, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

from codetool import CodetoolError
from codetool.cli import main
from codetool.config import load_config
from codetool.policy.config import TrainPolicyConfig
from codetool.prm.checkpoints import COMPLETE

REPO = Path(__file__).resolve().parents[1]


class LengthPRM:
    """A PRM stand-in whose score depends on the step's code (so two different episodes of a group
    get different rewards, and the anchored advantage is not 0): a CRC, not a character sum mod 97
    (two of the tiny model's replies, 'result = give_up(od' and 'give_up(lfstrputZod', tie there)."""

    def score(self, items):
        return [zlib.crc32(it.candidate.encode()) % 1000 / 1000.0 for it in items]


def tiny_config(model_dir, out, shared_data, **over) -> dict:
    base = {"policy": str(model_dir), "output_dir": str(out), "data_dir": str(shared_data),
            "prompts": [{"benchmark": "toolbench", "queries": "ToolBench/data_example/instruction/G1_query.json",
                         "limit": 2}],
            "evals": [], "never_train_on": [], "max_steps": 1, "learning_rate": 5e-3, "num_generations": 2,
            "per_device_train_batch_size": 2, "save_steps": 1, "seeds": [0],
            "rollout": {"max_steps": 2, "max_new_tokens": 12, "constrain": "line"},
            "executor": {"isolation": "fallback", "timeout_s": 10}, "prm": "none", "lora_layers": 1}
    base.update(over)
    return base


def test_shared_prompt_forward_equals_trls(tiny_model_dir, shared_data, tmp_path):
    from trl import GRPOTrainer

    from codetool.policy.data import make_tasks, training_queries
    from codetool.policy.train import build_trainer
    from codetool.policy.trainer import shared_prompt_logps
    from codetool.tools.backends import make_tool_backend

    cfg = load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data))
    tasks = make_tasks(training_queries(cfg), {"toolbench": make_tool_backend("simulator")}, cfg)
    trainer = build_trainer(cfg.run_config(cfg.rewards, 0, str(tmp_path / "r")), tasks)
    model = trainer.model.train()
    torch.manual_seed(0)
    prompts = [torch.randint(5, 500, (9,)), torch.randint(5, 500, (12,))]
    rows, masks = [], []
    for prompt, copies in zip(prompts, (3, 2)):
        for c in range(copies):
            completion = torch.randint(5, 500, (7,))
            keep = torch.tensor([1] * (4 + c) + [0] * (3 - c))
            pad = 12 - len(prompt)
            rows.append(torch.cat([torch.zeros(pad, dtype=torch.long), prompt, completion * keep]))
            masks.append(torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(len(prompt), dtype=torch.long), keep]))
    ids, mask = torch.stack(rows), torch.stack(masks)
    ref, ref_h, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, mask, 7, compute_entropy=True)
    got, got_h, _ = shared_prompt_logps(trainer, model, ids, mask, 7, True)
    real = mask[:, 12:].bool()
    assert (ref - got)[real].abs().max() < 1e-5 and (ref_h - got_h)[real].abs().max() < 1e-5
    params = [p for p in model.parameters() if p.requires_grad]
    g_ref = torch.autograd.grad(ref[real].sum(), params)
    g_got = torch.autograd.grad(got[real].sum(), params)
    assert max((a - b).abs().max().item() for a, b in zip(g_ref, g_got)) < 1e-5


def test_constrained_steps_get_the_log_probabilities_they_were_sampled_with(tiny_model_dir, shared_data, tmp_path):
    from codetool.policy.constrained import constrained_logps
    from codetool.policy.data import make_tasks, training_queries
    from codetool.policy.train import build_trainer
    from codetool.policy.trainer import shared_prompt_logps
    from codetool.tools.backends import make_tool_backend

    cfg = load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data))
    tasks = make_tasks(training_queries(cfg), {"toolbench": make_tool_backend("simulator")}, cfg)
    trainer = build_trainer(cfg.run_config(cfg.rewards, 0, str(tmp_path / "r")), tasks)
    model = trainer.model.train()
    torch.manual_seed(1)
    prompt = torch.randint(5, 500, (8,))
    ids = torch.stack([torch.cat([prompt, torch.randint(5, 500, (5,))]) for _ in range(3)])
    mask = torch.ones_like(ids)
    vocab = model.get_output_embeddings().weight.shape[0]
    some = torch.zeros(vocab, dtype=torch.bool)
    some[ids[:, 8:].flatten()] = True  # every completion token allowed, and little else
    some[:40] = True
    forced = torch.zeros(vocab, dtype=torch.bool)
    forced[ids[0, 9]] = True  # the only token allowed there: probability 1 under the constraint
    trainer.constraint_masks.table = [some, forced]
    masks = torch.tensor([[0, 1, -1, 0, 0], [-1, -1, -1, -1, -1], [0, 0, 0, 0, 0]])
    shared, shared_h, _ = shared_prompt_logps(trainer, model, ids, mask, 5, True, masks)
    plain, plain_h, _ = constrained_logps(trainer, model, ids, mask, 5, masks, 2, True)
    assert (shared - plain).abs().max() < 1e-5 and (shared_h - plain_h).abs().max() < 1e-5
    logits = model(input_ids=ids, attention_mask=mask).logits[:, 7:12].float() / trainer.temperature
    free = torch.log_softmax(logits, -1).gather(-1, ids[:, 8:, None]).squeeze(-1)
    by_hand = torch.log_softmax(logits.masked_fill(~some, float("-inf")), -1).gather(-1, ids[:, 8:, None]).squeeze(-1)
    assert (shared[0, 1]).abs() < 1e-6  # the forced token
    assert (shared[1] - free[1]).abs().max() < 1e-5  # a free row is TRL's
    assert (shared[2] - by_hand[2]).abs().max() < 1e-5 and (shared[2] > free[2] + 1e-3).all()
    # in the loss, the batch's mask rows reach the forward
    trainer._constraint_ids = masks
    got, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 5)
    trainer._constraint_ids = None
    assert (got - shared).abs().max() < 1e-5


def test_one_grpo_step_end_to_end_writes_a_loadable_policy(tiny_model_dir, shared_data, tmp_path, monkeypatch):
    import codetool.commands.train_policy as command

    monkeypatch.setattr(command, "make_scorer", lambda *args, **kwargs: LengthPRM())
    out = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, out, shared_data, prm="given-in-test",
                      settings=[{"name": "outcome+spot+prm", "grounded": 1.0, "on_the_spot": 0.5, "prm": 1.0}])
    (tmp_path / "recipe.json").write_text(json.dumps(cfg))
    status = main(["train-policy", "--config", str(tmp_path / "recipe.json")])
    assert status == 0
    run = json.loads((out / "outcome+spot+prm" / "seed0" / "run.json").read_text())
    assert run["steps"] == 1 and run["generated_tokens"] > 0 and run["reward_weights"]["prm"] == 1.0
    assert run["curve"] and set(run["curve"][0]) >= {"step", "reward", "prm", "on_the_spot", "grounded"}
    assert run["advantage"] == "anchored" and run["loss_type"] == "grpo"
    assert set(run["advantage_shares"]) == {"grounded", "on_the_spot", "prm"}
    policy = out / "policy"
    card = (policy / "README.md").read_text()
    assert "PRM: given-in-test" in card and "prm 1" in card
    assert (out / "report.md").is_file() and (out / "reward_curves.png").is_file()
    assert (out / "outcome_histogram.png").is_file()
    assert (out / "outcome+spot+prm" / "seed0" / "outcomes.jsonl").is_file()
    # the policy loads as `codetool run --policy DIR` loads it, and its weights moved
    from transformers import AutoModelForCausalLM

    from codetool.assemble import make_policy
    from codetool.models.spec import ModelSpec

    backend = make_policy(ModelSpec.parse(str(policy)))  # as `--policy DIR` enters
    [completions] = backend.generate(["hi"], max_new_tokens=3)
    assert completions[0].completion_tokens >= 1
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = backend.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_the_small_testbed_rl_recipe_runs_end_to_end_with_its_exact_before_after(tiny_model_dir, tmp_path):
    """configs/policy/testbed-small.yaml's shape (world prompts, both settings, before/after on queries
    96+ of the train templates) on the tiny model, one GRPO step each: the report and results.json
    carry the exact success of every policy and each setting minus before, paired by query."""
    recipe = REPO / "configs" / "policy" / "testbed-small.yaml"
    out = tmp_path / "rl"
    status = main(["train-policy", "--config", str(recipe), "--policy", str(tiny_model_dir), "--output_dir", str(out),
                   "--max_steps", "1", "--token_budget", "0", "--num_generations", "2",
                   "--per_device_train_batch_size", "2", "--lora_layers", "1",
                   "--prompts", '[{benchmark: world, group: train, limit: 2}]',
                   "--evals", '[{benchmark: world, group: train, offset: 96, limit: 2}]',
                   "--rollout.max_steps", "2", "--rollout.max_new_tokens", "12", "--eval_search.max_steps", "2",
                   "--eval_search.max_new_tokens", "12", "--executor.isolation", "fallback"])
    assert status == 0
    prompts = json.loads((out / "prompts.json").read_text())
    assert prompts["eval"] == {"world:train": ["train-0096", "train-0097"]}
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"answer", "answer+spot"} and results["advantage"] == "anchored"
    assert all(run["0"]["steps"] == 1 and run["0"]["generated_tokens"] > 0 for run in results["runs"].values())
    section = results["answer_before_after"]["world:train"]
    assert {r["method"]: r["queries"] for r in section["methods"]} == {"before": 2, "answer": 2, "answer+spot": 2}
    assert sorted((p["a"], p["b"], p["n"]) for p in section["paired"]) == [
        ("answer", "before", 2), ("answer+spot", "before", 2)]
    assert all(p["low"] <= p["mean"] <= p["high"] for p in section["paired"])
    report = (out / "report.md").read_text()
    assert "## Exact success before/after: world:train" in report and "| answer+spot - before |" in report


def test_stabletoolbench_prompts_are_refused(tiny_model_dir, shared_data, tmp_path):
    from codetool.config import ConfigError

    with pytest.raises(ConfigError, match="test sets"):
        load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data, prompts=[
            {"benchmark": "stabletoolbench", "group": "G1_instruction"}]))
    with pytest.raises(ConfigError, match="use_vllm samples rollouts without the constraint"):
        load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data, use_vllm=True))
    with pytest.raises(ConfigError, match="rollout.k is not read by train-policy"):
        load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data,
                                                         rollout={"k": 2}))


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(tiny_model_dir, shared_data, tmp_path):
    out = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, out, shared_data, max_steps=4, save_steps=1, save_total_limit=None)
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "codetool.cli", "train-policy", "--config", str(recipe)]
    run_dir = out / "outcome" / "seed0"
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        # the marker is the save's last file (the folder appears first: CI killed a save half done)
        marker = run_dir / "checkpoint-2" / COMPLETE
        while not marker.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert marker.is_file(), "no whole checkpoint before the kill"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (run_dir / "run.json").exists()
    state = json.loads((run_dir / "checkpoint-2" / "trainer_state.json").read_text())
    counted = [c for c in state["stateful_callbacks"].values()][0]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["steps"] == 4
    steps = [p["step"] for p in run["curve"]]
    assert steps[-1] == 4 and 1 not in steps or steps.count(1) == 1  # resumed, not restarted
    assert run["generated_tokens"] >= counted["attributes"]["generated"] > 0


def test_a_save_cut_short_is_removed_and_the_run_resumes_from_the_whole_one_before(tmp_path):
    """A kill during the save of checkpoint-2 leaves its folder without the completion marker:
    ``resume auto`` takes checkpoint-1 (before: transformers' newest folder, which cannot load)."""
    from types import SimpleNamespace

    from codetool.policy.train import _resume_path
    from codetool.prm.checkpoints import mark_complete

    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w")
    mark_complete(tmp_path / "checkpoint-1", 1)
    cfg = SimpleNamespace(resume="auto", resume_from_checkpoint=None, output_dir=str(tmp_path))
    assert _resume_path(cfg) == str(tmp_path / "checkpoint-1")
    assert not (tmp_path / "checkpoint-2").exists()
    with pytest.raises(CodetoolError, match="not a whole checkpoint"):
        (tmp_path / "checkpoint-3").mkdir()
        _resume_path(SimpleNamespace(resume="auto", resume_from_checkpoint=str(tmp_path / "checkpoint-3"),
                                     output_dir=str(tmp_path)))
    assert _resume_path(SimpleNamespace(resume="none", resume_from_checkpoint=None, output_dir=str(tmp_path))) is None


class Killed(Exception):
    """What ``kill_at`` raises."""


def kill_at(step: int):
    """A callback that raises at the end of step ``step``, before the step is saved: a run killed
    between two saves."""
    from transformers import TrainerCallback

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise Killed(f"killed at step {step}")

    return Kill()


def test_a_resumed_run_keeps_its_token_count(tiny_model_dir, shared_data, tmp_path):
    """The token budget counts what the whole run generated, across a kill and a resume (issue 39:
    the resumed run counted from zero, so its budget never stopped it where an uninterrupted one
    stopped)."""
    from codetool.policy.data import make_tasks, training_queries
    from codetool.policy.train import _resume_path, build_trainer
    from codetool.tools.backends import make_tool_backend

    cfg = load_config(TrainPolicyConfig, None, tiny_config(tiny_model_dir, tmp_path, shared_data, max_steps=2,
                                                           save_steps=1, save_total_limit=None))
    tasks = make_tasks(training_queries(cfg), {"toolbench": make_tool_backend("simulator")}, cfg)

    def trainer_for(name: str):
        return build_trainer(cfg.run_config(cfg.rewards, 0, str(tmp_path / name)), tasks)

    whole = trainer_for("whole")
    whole.train()
    assert whole.state.global_step == 2 and whole.token_budget.generated > 0

    cut = trainer_for("cut")
    cut.add_callback(kill_at(2))
    with pytest.raises(Killed):
        cut.train()
    assert (tmp_path / "cut" / "checkpoint-1").is_dir() and not (tmp_path / "cut" / "checkpoint-2").exists()
    saved = json.loads((tmp_path / "cut" / "checkpoint-1" / "trainer_state.json").read_text())
    at_save = saved["stateful_callbacks"]["TokenBudget"]["attributes"]["generated"]
    assert 0 < at_save < whole.token_budget.generated

    # (the run's TrainingArguments are made before the trainer's: making them resets accelerate's state)
    resume = _resume_path(cfg.run_config(cfg.rewards, 0, str(tmp_path / "cut")))
    assert resume is not None and resume.endswith("checkpoint-1")
    resumed = trainer_for("cut")
    resumed.train(resume_from_checkpoint=resume)
    assert resumed.state.global_step == 2
    # the count went on from the checkpoint's; step 2 drew what the uninterrupted run drew
    assert resumed.token_budget.generated == whole.token_budget.generated
