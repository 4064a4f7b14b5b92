"""Training prompts never include evaluation queries (the quickstart and paper recipes' sets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codetool.config import ConfigError, load_config
from codetool.policy.config import QuerySet, RewardSetting, TrainPolicyConfig
from codetool.policy.data import (
    evaluation_queries,
    load_queries,
    normalised,
    query_key,
    training_queries,
)

REPO = Path(__file__).resolve().parents[1]
PIPELINE_EVALS = [QuerySet("stabletoolbench", group="G1_instruction", subset="codetool", limit=8),
                  QuerySet("restbench-tmdb", subset="codetool", limit=8)]


def test_quickstart_prompts_and_evaluation_sets_are_disjoint(shared_data):
    cfg = load_config(TrainPolicyConfig, REPO / "configs" / "policy" / "quickstart.yaml", {"data_dir": str(shared_data)})
    train = training_queries(cfg)
    held = [q for qs in [*cfg.evals, *PIPELINE_EVALS] for q in load_queries(qs, str(shared_data))]
    assert len(train) >= 15 and held
    assert not {query_key(q) for q in train} & {query_key(q) for q in held}
    assert not {normalised(q.query) for q in train} & {normalised(q.query) for q in held}
    assert {q.benchmark for q in train} == {"toolbench", "restbench"}
    assert set(evaluation_queries(cfg)) == {qs.name for qs in cfg.evals}


def test_the_paper_recipe_trains_on_the_other_half_of_restbench(shared_data):
    cfg = load_config(TrainPolicyConfig, REPO / "configs" / "policy" / "qwen2.5-coder-7b.yaml",
                      {"data_dir": str(shared_data)})
    cfg.prompts = [qs for qs in cfg.prompts if qs.benchmark == "restbench-tmdb"]  # ToolBench's full set is a download
    train = training_queries(cfg)
    held = {normalised(q.query) for q in evaluation_queries(cfg)["restbench-tmdb:tmdb"]}
    assert len(train) == 50 and len(held) == 50 and not {normalised(q.query) for q in train} & held


def test_an_evaluation_query_listed_as_a_prompt_is_dropped(shared_data):
    cfg = load_config(TrainPolicyConfig, None, {
        "data_dir": str(shared_data), "never_train_on": [],
        "prompts": [{"benchmark": "restbench-tmdb", "subset": "codetool", "limit": 6}],
        "evals": [{"benchmark": "restbench-tmdb", "subset": "restgpt", "offset": 2, "limit": 2}]})
    train = training_queries(cfg)
    # the same TMDB queries under the other source's file: caught by their text
    assert len(train) == 4
    assert not {normalised(q.query) for q in train} & {normalised(q.query) for q in
                                                       load_queries(cfg.evals[0], str(shared_data))}


def test_settings_and_weights_are_checked():
    assert RewardSetting(grounded=1.0, on_the_spot=0.5, prm=0.5).name == "outcome+spot+prm"
    with pytest.raises(ConfigError, match="every weight is 0"):
        RewardSetting(grounded=0.0)
    with pytest.raises(ConfigError, match=">= 0"):
        RewardSetting(tool_cost=-1.0)
    with pytest.raises(ConfigError, match="judge.model"):
        load_config(TrainPolicyConfig, None, {"settings": [{"judged": 1.0}]})
    with pytest.raises(ConfigError, match="names must differ"):
        load_config(TrainPolicyConfig, None, {"settings": [{"grounded": 1.0}, {"grounded": 2.0}]})


def test_a_weak_local_judge_is_refused_for_the_judged_reward_unless_asked_for():
    judged = {"settings": [{"judged": 1.0}], "judge": {"model": "default"}}
    with pytest.raises(ConfigError, match="weak judge"):
        load_config(TrainPolicyConfig, None, judged)
    assert load_config(TrainPolicyConfig, None, {**judged, "allow_weak_judge": True}).allow_weak_judge
    # a local judge the user declares strong, and any server, are accepted
    load_config(TrainPolicyConfig, None, {**judged, "judge": {"model": "default", "weak": False}})
    load_config(TrainPolicyConfig, None, {**judged, "judge": {"model": "http://127.0.0.1:9/v1"}})
