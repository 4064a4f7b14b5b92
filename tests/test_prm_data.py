"""PRM datasets (codetool.prm.data): one supervised token per row, splits, the collator."""

from __future__ import annotations

import logging

import pytest
import torch

from codetool import CodetoolError
from codetool.prm.data import (
    IGNORE_INDEX,
    PRMCollator,
    sibling_key,
    split_rows,
    tokenize_rows,
)
from codetool.prm.format import PRMFormat, PromptEncoder, item_from_row
from codetool.prm.synthetic import synthetic_rows


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    from codetool.prm.folder import new_prm

    _, tok = new_prm(str(tiny_model_dir), PRMFormat(), dtype="float32", device="cpu")
    return PromptEncoder(tok, PRMFormat(max_length=512, max_suffix_length=128))


def test_label_dtype_case_exactly_one_integer_supervised_token(encoder):
    """Field case label-dtype: labels stay integers, -100 never counts as positive, and each row
    supervises exactly one token, the label, at its end (no EOS: field case extra-eos)."""
    rows = synthetic_rows(3, steps=2, candidates=3, extra_tools=0)
    tokenized, stats = tokenize_rows(rows, encoder)
    assert stats.rows == len(rows) == len(tokenized)
    eos = encoder.tokenizer.eos_token_id
    for row, out in zip(rows, tokenized):
        labels = torch.tensor(out["labels"])
        assert labels.dtype == torch.int64
        assert int((labels != IGNORE_INDEX).sum()) == 1
        assert labels[-1].item() == encoder.label_ids[0 if row["label"] == 1 else 1]
        assert out["input_ids"][-1] == labels[-1].item() and eos not in out["labels"]
    batch = PRMCollator(encoder.label_ids, pad_id=0)(tokenized)
    assert batch["target"].dtype == torch.long
    assert batch["target"].tolist() == [1 - r["label"] for r in rows]


def test_extra_eos_case_loss_lands_on_the_label_only(encoder):
    """Field case extra-eos: TRL prompt/completion rows would append EOS after the label and
    supervise it; our rows end with the label token, the only supervised position."""
    rows = synthetic_rows(1, steps=1, candidates=2, extra_tools=0)
    tokenized, _ = tokenize_rows(rows, encoder)
    eos = encoder.tokenizer.eos_token_id
    for out in tokenized:
        supervised = [i for i, x in enumerate(out["labels"]) if x != IGNORE_INDEX]
        assert supervised == [len(out["input_ids"]) - 1]
        assert out["input_ids"][-1] in encoder.label_ids and out["input_ids"][-1] != eos
    batch = PRMCollator(encoder.label_ids, pad_id=eos)(tokenized)
    assert batch["input_ids"].shape[1] == max(len(t["input_ids"]) for t in tokenized) - 1  # label not an input


def test_a_pair_that_is_one_input_under_two_labels_is_left_out(encoder, caplog):
    # rows of a dataset built before same_step pairs were dropped: the same call sampled twice
    base = {"query_id": "q1", "query": "How many miles is 840 km?", "tools": "def convert_units(...): ...",
            "history": [], "candidate": 'result = convert_units(value=840, from_unit="km", to_unit="mi")',
            "candidate_output": "Output:\n{'value': 521.95}", "ok": True}
    twins = [{**base, "label": 1, "pair": "q1:1>2"}, {**base, "label": 0, "pair": "q1:1>2"}]
    other = [{**base, "candidate": base["candidate"].replace("840", "84"), "label": 1, "pair": "q1:3>4"},
             {**base, "candidate": base["candidate"].replace("840", "480"), "label": 0, "pair": "q1:3>4"}]
    with caplog.at_level("WARNING"):
        tokenized, stats = tokenize_rows(twins + other, encoder)
    assert stats.same_input == 2 and len(tokenized) == 2 and [t["label"] for t in tokenized] == [1, 0]
    assert "1 of 2 labelled pairs left out" in caplog.text
    assert tokenize_rows(other, encoder)[1].same_input == 0
    # cousin twins: one input is "more promising" in one pair and "less promising" in another (the
    # children of two samples of one step); both pairs go, a pair without that input stays
    third = {**base, "candidate": base["candidate"].replace("840", "48")}
    cousins = [{**base, "label": 1, "pair": "q1:1-1>1-2"}, {**third, "label": 0, "pair": "q1:1-1>1-2"},
               {**base, "candidate": base["candidate"].replace("840", "8400"), "label": 1, "pair": "q1:2-2>2-1"},
               {**base, "label": 0, "pair": "q1:2-2>2-1"}]
    other = [{**r, "pair": "q1:5>6"} for r in other]
    tokenized, stats = tokenize_rows(cousins + other, encoder)
    assert stats.same_input == 4 and len(tokenized) == 2


def test_training_and_scoring_paths_give_identical_ids(encoder):
    """Field case train-score-mismatch: the dataset row minus its label equals what the scorer
    feeds the model for the same example, token for token."""
    rows = synthetic_rows(2, steps=2, candidates=2, extra_tools=1)
    tokenized, _ = tokenize_rows(rows, encoder)
    for row, out in zip(rows, tokenized):
        scoring = encoder.encode(item_from_row(row))
        assert out["input_ids"][:-1] == scoring.prefix_ids + scoring.suffix_ids


def test_collator_shapes_and_positions(encoder):
    tokenized, _ = tokenize_rows(synthetic_rows(2, steps=1, candidates=2, extra_tools=0), encoder)
    batch = PRMCollator(encoder.label_ids, pad_id=7)(tokenized)
    lengths = [len(t["input_ids"]) - 1 for t in tokenized]
    assert batch["input_ids"].shape == (len(tokenized), max(lengths))
    assert batch["last_index"].tolist() == [n - 1 for n in lengths]
    for i, t in enumerate(tokenized):
        assert batch["input_ids"][i, : lengths[i]].tolist() == t["input_ids"][:-1]
        assert (batch["input_ids"][i, lengths[i]:] == 7).all()
    assert batch["group"].tolist() == [t["group"] for t in tokenized]


def test_all_masked_batch_case_raises_a_clear_error(encoder):
    """Field case all-masked-batch: a row with no supervised token (or a mask cast to bool) is an
    error naming the fix, never a silent 0.0 or NaN loss."""
    collate = PRMCollator(encoder.label_ids, pad_id=0)
    masked = {"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX] * 3, "group": 0}
    with pytest.raises(CodetoolError, match="exactly one"):
        collate([masked, masked])
    as_bool = {"input_ids": [5, 6, encoder.label_ids[0]], "labels": [True, True, True], "group": 0}
    with pytest.raises(CodetoolError, match="exactly one"):
        collate([as_bool])
    with pytest.raises(CodetoolError, match="empty batch"):
        collate([])


def test_truncated_rows_are_kept_and_counted(encoder, caplog):
    small = PromptEncoder(encoder.tokenizer, PRMFormat(max_length=200, max_suffix_length=64))
    rows = synthetic_rows(2, steps=3, candidates=2, extra_tools=2)
    with caplog.at_level(logging.WARNING, logger="codetool.prm.data"):
        tokenized, stats = tokenize_rows(rows, small)
    assert len(tokenized) == len(rows) and stats.truncated > 0
    assert all(len(t["input_ids"]) <= 200 for t in tokenized)
    assert f"{stats.truncated} of {stats.rows} PRM rows were cut" in caplog.text


def test_split_by_query_id_is_stable_and_disjoint():
    rows = synthetic_rows(40, steps=2, candidates=2)
    train, held = split_rows(rows, 0.25, seed=3)
    assert len(train) + len(held) == len(rows)
    assert {r["query_id"] for r in train}.isdisjoint({r["query_id"] for r in held})
    assert 0 < len({r["query_id"] for r in held}) < 40
    assert split_rows(rows, 0.25, seed=3)[1] == held
    assert len({r["query_id"] for r in held}) == 10  # round(40 * 0.25), codetool.split


def test_siblings_share_a_key():
    rows = synthetic_rows(1, steps=2, candidates=3)
    keys = [sibling_key(r) for r in rows]
    assert keys[0] == keys[1] == keys[2] and keys[3] == keys[4] == keys[5] and keys[0] != keys[3]
