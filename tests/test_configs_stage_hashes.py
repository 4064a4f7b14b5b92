"""The shipped pipeline recipes keep their stage hashes (issue 29: a refactor that moves settings
between modules must not make a user's finished stages run again).

A pipeline skips a stage whose recorded hash equals the one its settings give now
(``codetool.commands.pipeline.stage_hashes``). The values below were recorded before the commands wing
moved; a change that alters one on purpose (a new setting that changes what a stage writes)
updates the value here and says so in its note.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from codetool.commands.pipeline import PipelineConfig, stage_hashes
from codetool.config import load_config

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "pipeline"

# Re-pinned by issue 43: SearchConfig gained the settings of voting and compute-optimal allocation
# (search.vote, budget, difficulty, level_strategies, level_weights), which every stage hash covers.
PINNED = {
    "quickstart": {"trees": "cf12752c6909", "train": "ad7fab7161b9", "search": "96993a9dd62b",
                   "eval": "dff543711071"},
    "paper-qwen2.5-7b": {"trees": "9be8137a5c8d", "train": "a7bcf2390e50", "search": "9d4730ce595e",
                         "eval": "63ffb30b9445"},
    "codetool-improved-qwen2.5-7b": {"trees": "f993de4a5dcf", "train": "f0f9727ea1b3", "search": "ee1c0eda7b65",
                                     "eval": "e1cae0ee0128"},
}


@pytest.mark.parametrize("recipe", sorted(PINNED))
def test_recipe_stage_hashes_are_unchanged(recipe, monkeypatch):
    for var in ("CODETOOL_CODETOOL_DIR", "CODETOOL_STABLETOOLBENCH_DIR"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config(PipelineConfig, RECIPES / f"{recipe}.yaml")
    assert stage_hashes(cfg) == PINNED[recipe]
