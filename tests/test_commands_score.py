"""``codetool score`` (codetool.commands.score): its refusals; scoring with a trained PRM is tested
in test_prm_train.py."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.commands.score import ScoreConfig, score_command


def test_refusals_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(CodetoolError, match="input file not found: .*missing.jsonl"):
        score_command(ScoreConfig(input=str(tmp_path / "missing.jsonl"), prm="none"))
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps({"query": "q", "label": 1}) + "\n{not json\n")
    with pytest.raises(CodetoolError, match="1 lines are not JSON objects \\(lines 2\\)"):
        score_command(ScoreConfig(input=str(torn), prm="none"))
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"query": "q", "label": 1}) + "\n")
    with pytest.raises(CodetoolError, match="needs a PRM"):
        score_command(ScoreConfig(input=str(good), prm="none"))
    assert not (tmp_path / "good.scored.jsonl").exists()


def test_batch_size_is_checked():
    with pytest.raises(CodetoolError, match="batch_size must be >= 1"):
        ScoreConfig(batch_size=0)
