"""Process-supervised advantages on hand-built groups (DeepSeekMath's process supervision)."""

from __future__ import annotations

import math

import pytest
import torch

from codetool.policy.advantages import (
    normalise_groups,
    process_advantages,
    step_reward_rows,
    token_advantages,
)

EPS = 1e-4


def test_step_rewards_are_weighted_sums_of_the_defined_values():
    rewards = [{"on_the_spot": [1.0, 0.0], "grounded": [None, 1.0]},
               {"on_the_spot": [0.0, 1.0, 1.0], "grounded": [None, None, 0.0], "prm": [None, None, None]}]
    rows = step_reward_rows(rewards, {"on_the_spot": 0.5, "grounded": 1.0, "prm": 2.0}, [2, 3])
    assert rows == [[0.5, 1.0], [0.0, 0.5, 0.5]]
    assert step_reward_rows([{"grounded": [None, 1.0]}], {"grounded": 1.0}, [2]) == [[None, 1.0]]


def test_a_hand_built_group():
    # group of 2: A's steps 0.5, 1.0; B's 0, 0.5, 0.5 -> mean 0.5, unbiased std sqrt(0.125)
    std = math.sqrt(0.125)
    z = 0.5 / (std + EPS)
    norm = normalise_groups([[0.5, 1.0], [0.0, 0.5, 0.5]], group_size=2)
    assert norm[0] == pytest.approx([0.0, z]) and norm[1] == pytest.approx([-z, 0.0, 0.0])
    adv = token_advantages(norm, [[(0, 3), (5, 7)], [(0, 2), (4, 6), (7, 8)]], width=9)
    # a token's advantage: its own step's normalised reward plus every later step's
    expected_a = [z, z, z, z, z, z, z, 0.0, 0.0]        # step 0: 0 + z, step 1: z; tokens 3-4 lie between
    expected_b = [-z, -z, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert adv[0].tolist() == pytest.approx(expected_a, abs=1e-6)
    assert adv[1].tolist() == pytest.approx(expected_b, abs=1e-6)


def test_later_steps_add_up_and_unscored_steps_are_left_out():
    # one group of two: A [1, None, 0], B [0, 1] -> values 1, 0, 0, 1: mean 0.5, std sqrt(1/3)
    z = 0.5 / (math.sqrt(1 / 3) + EPS)
    norm = normalise_groups([[1.0, None, 0.0], [0.0, 1.0]], group_size=2)
    assert norm[0][1] is None
    adv = token_advantages(norm, [[(0, 1), (1, 2), (2, 3)], [(0, 1), (1, 2)]], width=3)
    assert adv[0].tolist() == pytest.approx([z - z, -z, -z], abs=1e-6)  # step 0: z + 0 - z; step 1: 0 - z
    assert adv[1].tolist() == pytest.approx([-z + z, z, 0.0], abs=1e-6)


def test_outcome_alone_is_grpos_sequence_advantage():
    outcomes = [1.0, 0.0, 0.0, 1.0]
    rewards = [{"grounded": [None] * (k + 1) + [o]} for k, o in enumerate(outcomes)]
    spans = [[(3 * s, 3 * s + 2) for s in range(k + 2)] for k in range(4)]
    adv = process_advantages(rewards, {"grounded": 1.0}, spans, group_size=4, width=16)
    values = torch.tensor(outcomes)
    grpo = (values - values.mean()) / (values.std() + EPS)  # TRL: group mean, unbiased std + 1e-4
    for i, row in enumerate(spans):
        end = row[-1][1]
        assert adv[i, :end].tolist() == pytest.approx([grpo[i].item()] * end, abs=1e-6)
        assert adv[i, end:].abs().sum() == 0


def test_equal_rewards_give_zero_advantages_and_groups_must_be_whole():
    assert normalise_groups([[1.0, 1.0], [1.0]], group_size=2) == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError):
        normalise_groups([[1.0], [0.0], [1.0]], group_size=2)
