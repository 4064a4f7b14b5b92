"""``format.interface: reference``: the public CodeTool PRM's prompt, answer words, loss, score,
output cuts and sample cap, on a tiny model whose vocabulary has ``yes`` and ``no``."""

from __future__ import annotations

import math

import pytest
import torch

from codetool.jsonl import write_jsonl
from codetool.models.spec import ModelSpec
from codetool.prm.format import PRMFormat, PromptEncoder, item_from_row
from codetool.prm.reference import label_scores
from codetool.rewards import PRMItem
from codetool.search.prompt import reference_prm_fields

TOOLS = "def get_weather_for_weatherapi(city): current weather of a city"


@pytest.fixture(scope="module")
def yes_no_model(tiny_model_dir, tmp_path_factory):
    """The tiny Llama with ``yes`` and ``no`` as single (ordinary) tokens of its vocabulary."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-yes-no")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_tokens(["yes", "no"])
    tok.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _item(step="##Step 2: the weather\n```python\nr = get_weather_for_weatherapi('Paris')\n```\n[Step 2 Finished]\n",
          result="{'temp': 21}"):
    return PRMItem(query="Weather in Paris?", tools=TOOLS, step_text=step,
                   previous_steps="##Step 1: look\n```python\nx = 1\n```\n[Step 1 Finished]", parent_result=result)


def test_the_reference_format_uses_the_words_yes_and_no():
    fmt = PRMFormat(interface="reference")
    assert (fmt.label_tokens, fmt.label_mode) == (["yes", "no"], "existing")
    assert PRMFormat().label_tokens == ["<|prm_pos|>", "<|prm_neg|>"]
    assert PRMFormat.from_saved({"max_length": 2048}).interface == "ours"  # older checkpoints


def test_system_turn_user_turn_and_the_output_cuts(yes_no_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(yes_no_model)
    fmt = PRMFormat(interface="reference", max_length=4096, max_suffix_length=32)
    scoring, training = PromptEncoder(tok, fmt), PromptEncoder(tok, fmt, training=True)
    long = _item(result="r" * 2500 + "TAIL")
    text = tok.decode(scoring.encode(long).input_ids)
    system, user = text.split("<|im_start|>user\n")
    assert system.startswith("<|im_start|>system\n") and TOOLS in system and '"Weather in Paris?"' in system
    assert "x = 1" in system and "r" * 2000 in system and "TAIL" not in system  # cut to 2,000 when scoring
    assert "4." in system and "yes" in system and "no" in system  # four criteria, the answer words
    assert user.startswith("##Step 2: the weather") and text.endswith("<|im_start|>assistant\n")
    assert "TAIL" in tok.decode(training.encode(long).input_ids)  # whole in training
    # no token budget of its own for the candidate (ours: max_suffix_length)
    assert len(scoring.encode(_item(step="word " * 300)).suffix_ids) > 100
    # the candidates of a step share their prefix; the first step has no history block
    assert scoring.encode(_item()).prefix_ids == scoring.encode(_item(step="other")).prefix_ids
    first = PRMItem(query="q", tools=TOOLS, step_text="##Step 1: x\n")
    assert "earlier steps" not in tok.decode(scoring.encode(first).prefix_ids)


def test_scores_are_the_ratio_of_raw_logits():
    logits = torch.tensor([[2.0, 1.0], [-1.0, 3.0]])
    assert label_scores(logits, "reference") == pytest.approx([2 / 3, -0.5])  # it can leave [0, 1]
    assert label_scores(logits, "ours") == pytest.approx([1 / (1 + math.exp(-1)), 1 / (1 + math.exp(4))])


def test_the_search_fills_the_reference_fields():
    history = [{"text": "##Step 1: a\n", "result": "one"}, {"text": "##Step 2: b\n", "result": "two"}]
    fields = reference_prm_fields(history, "##Step 3: c\n")
    assert fields == {"step_text": "##Step 3: c\n[Step 3 Finished]\n", "parent_result": "two",
                      "previous_steps": "##Step 1: a\n[Step 1 Finished]\n/n##Step 2: b\n[Step 2 Finished]\n"}
    assert reference_prm_fields([], "x")["previous_steps"] == ""


def _rows(n=24):
    rows = []
    for i in range(n):
        good = i % 2 == 0
        call = "get_weather_for_weatherapi(city='Paris')" if good else "get_weather_for_weatherapi(town='Paris')"
        rows.append({"query_id": f"q{i // 2}", "query": f"Weather in Paris, case {i // 2}?", "tools": TOOLS,
                     "history": [], "candidate": call, "label": int(good),
                     "step_text": f"##Step 1: call\n```python\nr = {call}\n```\n[Step 1 Finished]\n",
                     "previous_steps": "", "parent_result": ""})
    return rows


def test_training_is_plain_sft_over_the_vocabulary_and_scoring_divides_raw_logits(yes_no_model, tmp_path):
    from codetool.commands.train_prm import train_command
    from codetool.config import load_config
    from codetool.prm.config import PRMConfig
    from codetool.prm.rows import read_rows
    from codetool.prm.scorer import load_scorer
    from codetool.prm.trainer import _datasets, build_model

    data = tmp_path / "rows.jsonl"
    write_jsonl(data, _rows())
    prm_cfg = load_config(PRMConfig, None, {
        "model": str(yes_no_model), "dataset": [str(data)], "output_dir": str(tmp_path / "out"),
        "format.interface": "reference", "format.max_length": 512, "max_steps": 12, "eval_steps": 0,
        "save_steps": 100, "learning_rate": 5e-3, "per_device_train_batch_size": 4, "warmup_steps": 0, "resume": "none",
        "eval_fraction": 0.0, "max_samples": 20})
    model, tok = build_model(prm_cfg)
    assert model.full_vocab and tok.convert_ids_to_tokens(list(model.label_ids)) == ["yes", "no"]
    train_ds, _ = _datasets(prm_cfg, PromptEncoder(tok, prm_cfg.format, training=True), read_rows(prm_cfg.dataset), None)
    assert len(train_ds) == 20  # the first 20 rows (max_samples)
    # the loss is the cross-entropy of the answer word over the whole vocabulary
    row = train_ds[0]
    ids = torch.tensor([row["input_ids"][:-1]])
    with torch.no_grad():
        got = model(ids, torch.tensor([ids.shape[1] - 1]))[0, 1 - row["label"]].item()
        want = torch.log_softmax(model.lm(ids).logits[0, -1].float(), -1)[row["input_ids"][-1]].item()
    assert got == pytest.approx(want, abs=1e-5)
    assert train_command(prm_cfg) == 0
    scorer = load_scorer(ModelSpec.folder(tmp_path / "out", role="prm"), device="cpu")
    item = item_from_row(_rows()[0])
    [score] = scorer.score([item])
    enc = scorer.encoder.encode(item)
    with torch.no_grad():
        logits = scorer.model.lm(torch.tensor([enc.input_ids])).logits[0, -1]
    yes, no = scorer.encoder.label_ids
    assert score == pytest.approx((logits[yes] / (logits[yes] + logits[no])).item(), abs=1e-4)


def test_the_vllm_scorer_refuses_the_reference_interface_in_one_line(tmp_path):
    """vLLM's raw-logit ratio is not tested yet, so ``--prm vllm:`` on a reference PRM is a
    ConfigError before vLLM is imported (or the checkpoint exported)."""
    import json

    from codetool.config import ConfigError
    from codetool.prm.folder import PRM_CONFIG
    from codetool.prm.vllm_backend import VLLMScorer

    (tmp_path / PRM_CONFIG).write_text(json.dumps({"format": {"interface": "reference"}}))
    with pytest.raises(ConfigError, match="format.interface reference") as err:
        VLLMScorer(str(tmp_path))
    assert len(str(err.value).splitlines()) == 1 and f"--prm {tmp_path}" in str(err.value)
