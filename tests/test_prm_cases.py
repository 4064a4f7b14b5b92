"""Every field case of ../shared/cases/prm.jsonl that touches the PRM is pinned by a named test."""

from __future__ import annotations

import importlib
import json

# case id -> "test module::test function"
PRM_CASE_TESTS = {
    "label-dtype": "test_prm_data::test_label_dtype_case_exactly_one_integer_supervised_token",
    "label-truncated": "test_prm_format::test_label_truncated_case_history_cut_from_left_label_survives",
    "extra-eos": "test_prm_data::test_extra_eos_case_loss_lands_on_the_label_only",
    "shrink-embeddings": "test_prm_modeling::test_shrink_embeddings_case_matrix_never_shrinks",
    "score-range": "test_prm_scorer::test_score_range_case_negative_logits_give_a_softmax_not_a_ratio",
    "all-masked-batch": "test_prm_data::test_all_masked_batch_case_raises_a_clear_error",
    "train-score-mismatch": "test_prm_data::test_training_and_scoring_paths_give_identical_ids",
}
# cases in prm.jsonl that belong to another package's tests
OTHER_PACKAGES = {"tau-definition": "codetool.tree (the tree builder's tau)"}


def test_every_prm_case_has_a_test(shared_cases):
    ids = [json.loads(line)["id"] for line in (shared_cases / "prm.jsonl").read_text().splitlines() if line.strip()]
    missing = [i for i in ids if i not in PRM_CASE_TESTS and i not in OTHER_PACKAGES]
    assert not missing, f"field cases without a test: {missing}"
    for target in PRM_CASE_TESTS.values():
        module, function = target.split("::")
        assert callable(getattr(importlib.import_module(module), function)), target
