"""One candidate step for the search and the RL rollout (issue 38): for the same sampled text and
tools, both record the same candidate, observation and PRM item, and the PRM reads the same token
ids under both PRM interfaces (``ours`` and the public PRM's ``reference``).

The executor and the tool simulator are real; a scripted policy stands in for the model (the
search's backend gets the text, the rollout's generator the same text as token ids).
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from codetool.assemble import make_task
from codetool.executor import Executor, ExecutorConfig
from codetool.models.completion import Completion
from codetool.policy.rewards import PRMReward
from codetool.policy.rollout import EpisodeRunner
from codetool.prm.format import PRMFormat, PromptEncoder
from codetool.prm.modeling import add_label_tokens
from codetool.search.config import SearchConfig, StepGroup
from codetool.search.episode import Episodes, SearchParts
from codetool.search.expand import Node, expand
from codetool.search.prompt import history_entry
from codetool.tools.backends import make_tool_backend
from codetool.tools.loaders import load_toolbench_queries

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)
# A long output cut head-only (the public code's [0:500]): the rollout used to cut it in the middle.
STEP = dict(max_steps=3, max_new_tokens=64, max_observation_chars=60, observation_cut="head")
REPLIES = ["r = checkhealth_for_squake()\nprint(r)\nprint('x' * 200 + 'TAIL')", "print(r['api'])",
           "finish(str(r['result']))"]


def sampled(step_format: str) -> list[str]:
    """The texts the policy samples: after the opening fence up to the stop ``` (code_only), or a
    plan line and a whole code block (step_text)."""
    if step_format == "code_only":
        return [f"{r}\n" for r in REPLIES]
    return [f"Look it up.\n```python\n{r}\n```" for r in REPLIES]


class TextPolicy:
    """The search's backend: each call returns the next sampled text."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate(self, prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=64, stop=None, seed=None, **kw):
        return [[Completion(self.texts.pop(0), 10, 5, "stop") for _ in range(n)] for _ in prompts]


class IdSteps:
    """The rollout's generator: the same texts as token ids (a stop string kept in the ids)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, list(texts)

    def generate(self, rows, n, *, constraints, stop, max_new_tokens, seed):
        out = []
        for row in rows:
            text = self.texts.pop(0)
            ids = self.tokenizer(text + (stop[0] if stop else ""), add_special_tokens=False,
                                 split_special_tokens=True)["input_ids"]
            out.append([Completion(text, len(row), 5, "stop", ids) for _ in range(n)])
        return out


class Recorder:
    def __init__(self):
        self.items = []

    def score(self, items):
        self.items += items
        return [0.5] * len(items)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def task(shared_data):
    query = load_toolbench_queries(shared_data / "ToolBench" / "data_example" / "instruction" / "G1_query.json")[0]
    return make_task(query, make_tool_backend("simulator"), tool_doc="brief")


def search_steps(task, step_format="code_only"):
    """The search's greedy path through REPLIES: per step, (candidate, observation, PRM item)."""
    cfg = SearchConfig(k=1, latent="none", w_latent=0.0, step_format=step_format,
                       code_prefix=step_format == "code_only", **STEP)
    policy = TextPolicy(sampled(step_format))
    episodes = Episodes(SearchParts(policy, lambda t: Executor(EXEC, tools=t.env.functions())), cfg)
    state, history, out = Executor(EXEC, tools=task.env.functions()), [], []
    try:
        for _ in REPLIES:
            [[e]] = expand(policy, [Node(state, history, task)], 1, cfg)
            out.append((e.candidate, e.observation, episodes.prm_item(task, history, e.candidate, e.observation)))
            state.close()
            state = e.state
            history = history + [history_entry(e.candidate, e.observation)]
    finally:
        state.close()
    return out


def rollout_steps(tokenizer, task, step_format="code_only"):
    cfg = StepGroup(step_format=step_format, code_prefix=step_format == "code_only", **STEP)
    runner = EpisodeRunner(tokenizer, cfg, lambda t: Executor(EXEC, tools=t.env.functions()))
    [ep] = runner.run([task], IdSteps(tokenizer, sampled(step_format)))
    prm = Recorder()
    PRMReward(prm, step=cfg).per_step(ep)
    return ep, prm.items


@pytest.mark.parametrize("step_format", ["code_only", "step_text"])
def test_the_search_and_the_rollout_record_the_same_steps_and_prm_items(tokenizer, task, step_format):
    searched = search_steps(task, step_format)
    ep, items = rollout_steps(tokenizer, task, step_format)
    assert len(ep.steps) == len(searched) == len(items) == 3
    for (cand, obs, item), step, rolled in zip(searched, ep.steps, items):
        assert step.candidate.text == cand.text and step.candidate.code == cand.code
        assert (step.candidate.r_spot, step.candidate.cost) == (cand.r_spot, cand.cost)
        assert step.observation == obs
        assert rolled == item  # every field, the reference interface's included
    assert "TAIL" not in ep.steps[0].observation  # cut head-only, as observation_cut says (the rollout cut
    assert ep.steps[0].observation.startswith("Output:\n{")  # in the middle and kept the tail before)
    assert items[1].step_text and items[1].previous_steps and items[1].parent_result


def _encoder(tokenizer_dir, interface):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    fmt = PRMFormat(interface=interface, max_length=4096)
    if interface == "reference":
        tok.add_tokens(["yes", "no"])
    else:
        add_label_tokens(None, tok, fmt)
    return PromptEncoder(tok, fmt)


@pytest.mark.parametrize("interface", ["ours", "reference"])
def test_the_prm_reads_the_same_token_ids_from_the_search_and_the_rollout(tiny_model_dir, tokenizer, task, interface):
    encoder = _encoder(tiny_model_dir, interface)
    searched = search_steps(task, "step_text")
    _, items = rollout_steps(tokenizer, task, "step_text")
    ids_search = [encoder.encode(item).input_ids for _, _, item in searched]
    ids_rollout = [encoder.encode(item).input_ids for item in items]
    assert ids_search == ids_rollout
    # each step of the episode is scored on its own input (the rollout's reference items used to be
    # the same for every step: no step_text, no history)
    assert len({tuple(ids) for ids in ids_rollout}) == 3
