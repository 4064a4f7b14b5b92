"""Stage hashes are a canonical, versioned text of the settings each stage reads (0.2.0).

``codetool pipeline`` skips a stage whose recorded hash equals the hash of its text now
(``codetool.jobs.pipeline.stage_texts``): a first line naming the text's version, then one sorted
``key=value`` line per setting the stage's command reads, then the hashes of the stages it reads.
So a setting the stage reads changes its hash (and the hashes of the stages after it); a setting it
does not read (a key the command refuses as unread, a client's pace, where a file goes) and the
order fields are declared in do not.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from codetool.config import load_config
from codetool.jobs.pipeline import PipelineConfig, stage_hashes, stage_texts
from codetool.jobs.stages import STAGE_TEXT_VERSION, settings_text, text_hash
from codetool.models.remote import RemoteConfig

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "pipeline"


@pytest.fixture(autouse=True)
def _no_reference_checkouts(monkeypatch):
    for var in ("CODETOOL_CODETOOL_DIR", "CODETOOL_STABLETOOLBENCH_DIR"):
        monkeypatch.delenv(var, raising=False)


def quickstart(**overrides) -> PipelineConfig:
    return load_config(PipelineConfig, RECIPES / "quickstart.yaml", overrides)


def test_the_text_is_versioned_sorted_and_one_json_value_per_line():
    text = settings_text({"b": [1, "x"], "a.c": None, "a.b": {"z": 1, "y": 2.5}}, {"trees": "0123abcd4567"})
    assert text == (f"{STAGE_TEXT_VERSION}\na.b={{\"y\": 2.5, \"z\": 1}}\na.c=null\nb=[1, \"x\"]\n"
                    "upstream.trees=0123abcd4567\n")
    assert STAGE_TEXT_VERSION == "codetool-stage-v2"
    assert text_hash(text) == text_hash(text) and len(text_hash(text)) == 12
    assert settings_text({"b": 1, "a": 2}) == settings_text({"a": 2, "b": 1})


def test_the_order_fields_are_declared_in_does_not_matter():
    from codetool.config_groups import flat_settings

    @dataclasses.dataclass
    class One:
        a: int = 1
        b: str = "x"

    @dataclasses.dataclass
    class Two:
        b: str = "x"
        a: int = 1

    assert settings_text(flat_settings(One())) == settings_text(flat_settings(Two()))


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_every_shipped_recipe_has_a_text_per_stage_naming_what_it_reads(recipe):
    texts = stage_texts(load_config(PipelineConfig, RECIPES / f"{recipe}.yaml"))
    assert set(texts) == {"trees", "train", "search", "eval"}
    for stage, text in texts.items():
        assert text.startswith(f"{STAGE_TEXT_VERSION}\n"), stage
        lines = text.splitlines()[1:]
        assert lines == sorted(lines) and all("=" in line for line in lines), stage
    assert "max_depth=" in texts["trees"] and "search.temperature=" in texts["trees"]
    assert "search.w_latent=" not in texts["trees"]  # refused under trees.search: build-trees never reads it
    assert "upstream.trees=" in texts["train"] or texts["train"].splitlines()[1].startswith("prm_checkpoint=")
    assert "upstream.search=" in texts["eval"]
    for text in texts.values():  # where files go and how fast clients go are not what a stage writes
        keys = [line.partition("=")[0].rpartition("/")[2].split(".") for line in text.splitlines()[1:]]
        assert not any(k[-1] in ("output", "output_dir", "dataset_dir", "dataset", "prm") for k in keys)
        assert not any({"policy_client", "prm_client", "client"} & set(k) for k in keys)


def test_a_read_setting_changes_its_stage_and_every_stage_after_it():
    base = stage_hashes(quickstart())
    cases = {"trees.max_depth": ("3", {"trees", "train", "search", "eval"}),
             "train.learning_rate": ("0.001", {"train", "search", "eval"}),
             "train.format.max_length": ("512", {"train", "search", "eval"}),
             "train.never_train_on": ("[]", {"train", "search", "eval"}),  # which rows the PRM trains on
             "search.temperature": ("0.5", {"search", "eval"}),
             "judge.rounds": ("2", {"eval"}),
             "reference": ("spot-only", {"eval"})}
    for key, (value, changed) in cases.items():
        now = stage_hashes(quickstart(**{key: value}))
        assert {s for s in base if now[s] != base[s]} == changed, key


def test_a_method_or_an_evaluation_set_changes_the_search_and_the_eval():
    cfg = quickstart()
    base = stage_hashes(cfg)
    for changed_cfg in (dataclasses.replace(cfg, methods=[dataclasses.replace(cfg.methods[0], k=3), *cfg.methods[1:]]),
                        dataclasses.replace(cfg, evals=[dataclasses.replace(cfg.evals[0], limit=4), *cfg.evals[1:]])):
        now = stage_hashes(changed_cfg)
        assert (now["trees"], now["train"]) == (base["trees"], base["train"])
        assert now["search"] != base["search"] and now["eval"] != base["eval"]


def test_a_setting_no_stage_reads_changes_no_hash(tmp_path):
    cfg = quickstart()
    base = stage_hashes(cfg)
    slow = RemoteConfig(timeout_s=999.0, retries=1, max_in_flight=2)
    unread = [
        dataclasses.replace(cfg, policy_client=slow, prm_client=slow,
                            judge=dataclasses.replace(cfg.judge, client=slow)),  # pace, not content
        dataclasses.replace(cfg, runs_dir=str(tmp_path)),  # where the stages write
        dataclasses.replace(cfg, trees=dataclasses.replace(cfg.trees, max_memory_mb=512)),  # how fast, not what
        # which queries get trees, not how a tree is built: the export drops held-out trees anyway (issue 38)
        dataclasses.replace(cfg, trees=dataclasses.replace(cfg.trees, never_train_on=[])),
    ]
    for other in unread:
        assert stage_hashes(other) == base
    # a search key build-trees does not read cannot even be set behind the loader's back (issue 42):
    # the trees' search composes the candidate, sampling and schedule groups only
    assert not hasattr(cfg.trees.search, "w_latent") and not hasattr(cfg.trees.search, "strategy")


def test_a_given_checkpoint_replaces_the_training_settings():
    trained, given = stage_texts(quickstart()), stage_texts(quickstart(prm_checkpoint="ckpt/prm"))
    assert given["train"] == f'{STAGE_TEXT_VERSION}\nprm_checkpoint="ckpt/prm"\n'
    assert given["trees"] == trained["trees"] and given["search"] != trained["search"]
