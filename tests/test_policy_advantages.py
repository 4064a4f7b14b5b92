"""Advantages on hand-built groups: outcome-anchored step credit (the default, issue 38) and
DeepSeekMath's process supervision (``deepseekmath``, the earlier default)."""

from __future__ import annotations

import math

import pytest
import torch

from codetool.policy.advantages import (
    advantage_shares,
    normalise_groups,
    process_advantages,
    step_mask,
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


@pytest.mark.parametrize("estimator", ["anchored", "deepseekmath"])
def test_outcome_alone_is_grpos_sequence_advantage(estimator):
    outcomes = [1.0, 0.0, 0.0, 1.0]
    rewards = [{"grounded": [None] * (k + 1) + [o]} for k, o in enumerate(outcomes)]
    spans = [[(3 * s, 3 * s + 2) for s in range(k + 2)] for k in range(4)]
    adv = process_advantages(rewards, {"grounded": 1.0}, spans, group_size=4, width=16, estimator=estimator)
    values = torch.tensor(outcomes)
    grpo = (values - values.mean()) / (values.std() + EPS)  # TRL: group mean, unbiased std + 1e-4
    for i, row in enumerate(spans):
        end = row[-1][1]
        assert adv[i, :end].tolist() == pytest.approx([grpo[i].item()] * end, abs=1e-6)
        assert adv[i, end:].abs().sum() == 0


# ------------------------------------------------------------------ fair to length (issue 38)
W = {"grounded": 1.0, "prm": 0.5}


def ep(prm: list[float], outcome: float) -> dict:
    """An episode's step rewards: the PRM on every step, the outcome on the last."""
    return {"prm": list(prm), "grounded": [None] * (len(prm) - 1) + [outcome]}


def spans_of(*lengths: int) -> list[list[tuple[int, int]]]:
    """Each step 2 generated ids, then 1 environment id."""
    return [[(3 * s, 3 * s + 2) for s in range(n)] for n in lengths]


def first_tokens(adv, spans):
    return [adv[i, steps[0][0]].item() for i, steps in enumerate(spans)]


def test_two_equally_good_episodes_of_different_length_get_equal_credit_in_any_group():
    short, long = ep([0.8, 0.8], 1.0), ep([0.8] * 4, 1.0)
    # alone: equal returns (1 + 0.5 x 0.8), so both 0 (DeepSeekMath's: +-0.65, the shorter one ahead)
    spans = spans_of(2, 4)
    assert process_advantages([short, long], W, spans, 2, 12).abs().max() == 0
    old = first_tokens(process_advantages([short, long], W, spans, 2, 12, estimator="deepseekmath"), spans)
    assert old[0] == pytest.approx(-old[1]) and old[0] > 0.6
    # with four one-step failures (PRM 0, outcome 0), PRM weight 1: returns 1.8, 1.8, 0 x 4
    weights, fail = {"grounded": 1.0, "prm": 1.0}, ep([0.0], 0.0)
    spans = spans_of(2, 4, 1, 1, 1, 1)
    std = math.sqrt((2 * 1.2 ** 2 + 4 * 0.6 ** 2) / 5)  # mean 0.6; unbiased std 0.929516
    good, bad = 1.2 / (std + EPS), -0.6 / (std + EPS)
    adv = process_advantages([short, long, fail, fail, fail, fail], weights, spans, 6, 12)
    for i, steps in enumerate(spans):  # every step of both good episodes gets the same credit
        for start, end in steps:
            assert adv[i, start:end].tolist() == pytest.approx([good if i < 2 else bad] * (end - start), abs=1e-5)
    assert good == pytest.approx(1.29086, abs=1e-4)
    old = first_tokens(process_advantages([short, long, fail, fail, fail, fail], weights, spans, 6, 12,
                                          estimator="deepseekmath"), spans)
    assert old[1] > old[0]  # DeepSeekMath's: now the longer one is ahead


def test_identical_episodes_get_zero_advantage_everywhere():
    same = ep([0.2, 0.9, 0.5], 1.0)
    spans = spans_of(3, 3, 3)
    assert process_advantages([same] * 3, W, spans, 3, 9).abs().max() == 0
    assert process_advantages([same] * 3, W, spans, 3, 9, estimator="deepseekmath").abs().max() > 0.5


def test_credit_lands_on_the_better_steps_and_blame_on_the_worse():
    # E1: PRM 0.2 then 1.0, succeeded; E2: PRM 0.6, 0.6, failed; weights 1/1
    weights = {"grounded": 1.0, "prm": 1.0}
    spans = spans_of(2, 2)
    adv = process_advantages([ep([0.2, 1.0], 1.0), ep([0.6, 0.6], 0.0)], weights, spans, 2, 6)
    a = 0.5 / (math.sqrt(0.5) + EPS)  # returns 1.6 and 0.6: mean 1.1, std sqrt(0.5)
    z = 0.4 / (math.sqrt(0.32 / 3) + EPS)  # step rewards 0.2, 1.0, 0.6, 0.6: mean 0.6, std sqrt(0.32/3)
    low = 2 * math.exp(-z) / (math.exp(-z) + math.exp(z))
    assert adv[0, 0].item() == pytest.approx(a * low, rel=1e-5)
    assert adv[0, 3].item() == pytest.approx(a * (2 - low), rel=1e-5)
    assert adv[1, 0].item() == pytest.approx(-a, rel=1e-5) and adv[1, 3].item() == pytest.approx(-a, rel=1e-5)
    # a failed episode's blame goes to its worse step: E2' PRM 0.9 then 0.1, failed, beside E1
    adv = process_advantages([ep([0.2, 1.0], 1.0), ep([0.9, 0.1], 0.0)], weights, spans, 2, 6)
    assert adv[1, 3].item() < adv[1, 0].item() < 0  # the step the PRM rated 0.1 carries more blame
    assert adv[0].sum() > 0 and (adv[0, :5] > 0).all()  # never blame inside a successful episode


def test_each_rewards_share_of_the_advantage_variance():
    weights = {"grounded": 1.0, "prm": 0.5}
    spans = spans_of(2, 1, 2, 1)
    # an empty PRM input: every step scored alike, so the PRM carries nothing
    flat = [ep([0.5, 0.5], 1.0), ep([0.5], 0.0), ep([0.5, 0.5], 0.0), ep([0.5], 1.0)]
    for estimator in ("anchored", "deepseekmath"):
        total, parts = process_advantages(flat, weights, spans, 4, 6, estimator=estimator, components=True)
        assert torch.allclose(sum(parts.values()), total, atol=1e-6)
        shares = advantage_shares(total, parts, step_mask(spans, 6))
        assert shares["prm"] == pytest.approx(0.0, abs=1e-9) and shares["grounded"] == pytest.approx(1.0)
    # the PRM alone decides: all outcomes equal
    total, parts = process_advantages([ep([0.9, 0.9], 1.0), ep([0.1], 1.0), ep([0.5, 0.7], 1.0), ep([0.3], 1.0)],
                                      weights, spans, 4, 6, components=True)
    assert advantage_shares(total, parts, step_mask(spans, 6)) == pytest.approx({"grounded": 0.0, "prm": 1.0})
    assert advantage_shares(torch.zeros(1, 2), {"prm": torch.zeros(1, 2)}, torch.ones(1, 2)) == {"prm": 0.0}


def test_equal_rewards_give_zero_advantages_and_groups_must_be_whole():
    assert normalise_groups([[1.0, 1.0], [1.0]], group_size=2) == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError):
        normalise_groups([[1.0], [0.0], [1.0]], group_size=2)


def test_a_dropped_episode_is_out_of_its_group_and_gets_zero():
    # a step the machine could not run: every reward None (codetool.policy.rewards); the others as alone
    dropped = {"prm": [None, None], "grounded": [None, None]}
    spans = spans_of(1, 1, 2)
    with_it = process_advantages([ep([0.8], 1.0), ep([0.2], 0.0), dropped], W, spans, 3, 6)
    alone = process_advantages([ep([0.8], 1.0), ep([0.2], 0.0)], W, spans[:2], 2, 6)
    assert torch.allclose(with_it[:2], alone) and with_it[2].abs().sum() == 0
    # the tool cost is summed over the episode whatever the aggregate (as its reward is)
    cost = [{"tool_cost": [-1.0, -1.0], "grounded": [None, 1.0]}, {"tool_cost": [-2.0], "grounded": [1.0]}]
    summed = process_advantages(cost, {"tool_cost": 1.0, "grounded": 1.0}, spans_of(2, 1), 2, 6,
                                aggregates={"tool_cost": "sum"})
    assert summed.abs().sum() == 0  # both cost 2 in all: equal returns
