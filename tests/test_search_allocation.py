"""The rule of compute-optimal allocation: difficulty levels, budget shares and sizes (hand-computed)."""

from __future__ import annotations

import pytest

from codetool.config import ConfigError, from_dict
from codetool.search.allocation import budget_shares, difficulty_levels
from codetool.search.config import SearchConfig


def test_levels_are_midrank_quantiles_over_the_run():
    assert difficulty_levels([0.1, 0.5, 0.9], 5) == [0, 2, 4]
    assert difficulty_levels([0.9, 0.1, 0.5], 5) == [4, 0, 2]  # by value, not by position
    assert difficulty_levels([0.3, 0.3, 0.3], 5) == [2, 2, 2]  # equal estimates share a level
    assert difficulty_levels([i / 10 for i in range(10)], 5) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert difficulty_levels([0.2, 0.7], 1) == [0, 0]


def test_harder_queries_get_more_of_the_total():
    levels = difficulty_levels([0.9, 0.1, 0.5, 0.1], 5)  # hard, easy, medium, easy (midranks 3.5, 1, 2.5, 1)
    assert levels == [4, 1, 3, 1]
    shares = budget_shares(levels, [1.0, 1.5, 2.0, 2.5, 3.0], total=850)  # weights 3 + 1.5 + 2.5 + 1.5 = 8.5
    assert shares == pytest.approx([300.0, 150.0, 250.0, 150.0])
    assert sum(shares) == pytest.approx(850)
    assert shares[0] > shares[2] > shares[1] == shares[3]
    assert budget_shares([0, 4], [1, 1, 1, 1, 3], total=-5) == [0.0, 0.0]  # nothing left to share


@pytest.mark.parametrize("settings, match", [
    ({"strategy": "compute_optimal"}, "search.budget"),
    ({"strategy": "beam", "budget": 100}, "search.budget"),
    ({"strategy": "compute_optimal", "budget": 0}, "search.budget"),
    ({"strategy": "compute_optimal", "budget": 100, "level_weights": [1, 2]}, "one entry per difficulty level"),
    ({"strategy": "compute_optimal", "budget": 100, "level_weights": [3, 2, 1, 1, 1]}, "non-decreasing"),
    ({"strategy": "compute_optimal", "budget": 100, "level_strategies": ["mcts"] * 5}, "mcts"),
    ({"strategy": "compute_optimal", "budget": 100, "level_strategies": ["lookahead"] * 5, "w_latent": 0.0},
     "w_latent"),
])
def test_allocation_settings_are_checked(settings, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(SearchConfig, settings)


def test_compute_optimal_settings_load_from_a_recipe():
    cfg = from_dict(SearchConfig, {"strategy": "compute_optimal", "budget": 300, "difficulty": "prm",
                                   "level_strategies": "greedy,beam", "level_weights": "1,4", "vote": "prm_weighted"})
    assert (cfg.level_strategies, cfg.level_weights, cfg.vote) == (["greedy", "beam"], [1.0, 4.0], "prm_weighted")
