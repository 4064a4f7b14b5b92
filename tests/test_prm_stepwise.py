"""TRL's stepwise-supervision layout: our export round-trips, train-prm and eval-prm read it, bad rows
fail in one line before a model loads."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.jsonl import write_jsonl
from codetool.prm.format import item_from_row
from codetool.prm.rows import from_stepwise, read_rows
from codetool.prm.stepwise import to_stepwise
from codetool.prm.synthetic import synthetic_rows

MATH_SHEPHERD_LIKE = {"prompt": "What is 2 + 3 * 4?", "completions": ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."],
                      "labels": [True, True, False]}


def _fields(row: dict) -> tuple:
    return (item_from_row(row), int(row["label"]), row.get("query_id"), row.get("source"), row.get("latent_reward"))


def test_our_export_round_trips(tmp_path):
    rows = synthetic_rows(3, steps=3, candidates=2, extra_tools=1)
    rows[4]["history"][0]["output"] = None  # an output the policy was not shown (observation_history last)
    rows[5]["candidate_plan"] = "Look up the forecast first."
    path = tmp_path / "stepwise.jsonl"
    write_jsonl(path, to_stepwise(rows))
    back = read_rows([str(path)])
    assert [_fields(r) for r in back] == [_fields(r) for r in rows]


def test_a_trl_row_is_one_example_per_step():
    examples = from_stepwise(MATH_SHEPHERD_LIKE)
    assert [e["candidate"] for e in examples] == MATH_SHEPHERD_LIKE["completions"]
    assert [e["label"] for e in examples] == [1, 1, 0]
    assert [[h["code"] for h in e["history"]] for e in examples] == [[], ["3 * 4 = 12."], ["3 * 4 = 12.", "2 + 12 = 14."]]
    assert all(e["query"] == MATH_SHEPHERD_LIKE["prompt"] and e["tools"] == "" for e in examples)
    assert examples[2]["history"][0]["output"] is None  # plain text steps have no output to show


def test_layouts_mix_in_one_file(tmp_path):
    rows = synthetic_rows(1, steps=1, candidates=2, extra_tools=0)
    path = tmp_path / "mixed.jsonl"
    write_jsonl(path, [*rows, MATH_SHEPHERD_LIKE])
    assert [r["label"] for r in read_rows([str(path)])] == [rows[0]["label"], rows[1]["label"], 1, 1, 0]


@pytest.mark.parametrize("row,message", [
    ({**MATH_SHEPHERD_LIKE, "labels": [True]}, "'labels' must hold one label per step \\(3 completions\\)"),
    ({**MATH_SHEPHERD_LIKE, "labels": [True, None, False]}, "step labels must be true/false .*got None"),
    ({**MATH_SHEPHERD_LIKE, "completions": []}, "'completions' must be a non-empty list"),
    ({**MATH_SHEPHERD_LIKE, "prompt": 3}, "a stepwise row needs a text 'prompt'"),
    ({**MATH_SHEPHERD_LIKE, "candidate_index": 7}, "'candidate_index' must be a step index below 3"),
])
def test_a_bad_stepwise_row_is_one_line(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [MATH_SHEPHERD_LIKE, row])
    with pytest.raises(CodetoolError, match=f"bad.jsonl:2: {message}") as info:
        read_rows([str(path)])
    assert "\n" not in str(info.value)


def test_train_prm_rejects_a_bad_row_before_the_model_loads(tmp_path, monkeypatch):
    from codetool.config import load_config
    from codetool.prm import trainer

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the rows were checked")

    monkeypatch.setattr(trainer, "build_model", no_model)
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [{**MATH_SHEPHERD_LIKE, "labels": [1, 1]}])
    cfg = load_config(trainer.PRMConfig, None, {"dataset": [str(path)], "output_dir": str(tmp_path / "o")})
    with pytest.raises(CodetoolError, match="bad.jsonl:1: 'labels' must hold one label per step"):
        trainer.build_trainer(cfg)


def test_train_and_eval_prm_read_the_stepwise_export(tiny_model_dir, tmp_path):
    """train-prm on our stepwise export trains on the same rows as on the plain file; eval-prm reads it."""
    from codetool.commands.eval_prm import EvalPRMConfig, eval_prm_command
    from codetool.commands.train_prm import train_command
    from codetool.config import load_config
    from codetool.prm.config import PRMConfig

    rows = synthetic_rows(8, steps=1, candidates=2, extra_tools=0)
    path = tmp_path / "stepwise.jsonl"
    write_jsonl(path, to_stepwise(rows))
    cfg = load_config(PRMConfig, None, {"model": str(tiny_model_dir), "dataset": [str(path)],
                                          "output_dir": str(tmp_path / "prm"), "max_steps": 2, "eval_steps": 0,
                                          "save_steps": 2, "resume": "none", "format.max_length": 256,
                                          "format.max_suffix_length": 96, "eval_fraction": 0.25})
    assert train_command(cfg) == 0
    report = tmp_path / "report"
    assert eval_prm_command(EvalPRMConfig(prm=cfg.output_dir, dataset=[str(path)], output_dir=str(report),
                                          device="cpu", bootstrap_samples=10)) == 0
    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics["rows"] == 4 and metrics["pairs"] == 2  # the held-out 2 queries x 2 candidates
