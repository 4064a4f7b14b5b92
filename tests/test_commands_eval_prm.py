"""``codetool eval-prm`` (codetool.commands.eval_prm): its refusals; a trained PRM's report is
tested in test_prm_train.py."""

from __future__ import annotations

import pytest

from codetool import CodetoolError
from codetool.commands.eval_prm import EvalPRMConfig, eval_prm_command


def test_eval_prm_errors(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"query": "q", "label": 1, "query_id": "a"}\n')
    with pytest.raises(CodetoolError, match="--eval_fraction"):
        eval_prm_command(EvalPRMConfig(prm="http://127.0.0.1:9", dataset=[str(data)]))
    with pytest.raises(CodetoolError, match="no held-out rows"):
        eval_prm_command(EvalPRMConfig(prm="http://127.0.0.1:9", dataset=[str(data)], eval_fraction=0.0,
                                       split_seed=0))
    with pytest.raises(CodetoolError, match="needs a PRM"):
        eval_prm_command(EvalPRMConfig(prm="none", dataset=[str(data)], split="all"))


def test_batch_size_is_checked():
    with pytest.raises(CodetoolError, match="batch_size must be >= 1"):
        EvalPRMConfig(batch_size=0)
