"""Step rewards -> per-token advantages: DeepSeekMath's process-supervised GRPO.

DeepSeekMath (Shao et al. 2024, §4.1.3) gives each step of each output in a group a reward,
normalises every reward by the mean and standard deviation of *all* step rewards of the group,
and sets the advantage of a token to the sum of the normalised rewards of the steps that end at
or after it. Here a step's reward is the weighted sum of the reward functions that give that step
a value (``Episode.step_rewards``; an outcome reward counts on the last step), and a step none of
them scores has no reward: it is left out of the group statistics and adds nothing to the sums.
With the outcome reward alone this is GRPO's sequence-level advantage (each episode's outcome
normalised in its group, on every token).

The standard deviation is the unbiased one, as TRL's ``nanstd``, plus ``eps`` (1e-4, TRL's);
a group whose step rewards are all equal gets advantages 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def step_reward_rows(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                     n_steps: Sequence[int]) -> list[list[float | None]]:
    """Per episode, one reward per step: the weighted sum of the defined values (``None`` if none).

    Args:
        step_rewards (`Sequence[dict]`): per episode, reward name -> per-step values.
        weights (`dict[str, float]`): reward name -> weight.
        n_steps (`Sequence[int]`): steps of each episode.
    """
    rows = []
    for rewards, n in zip(step_rewards, n_steps):
        row: list[float | None] = []
        for s in range(n):
            parts = [w * r for name, w in weights.items()
                     if name in rewards and s < len(rewards[name]) and (r := rewards[name][s]) is not None]
            row.append(float(sum(parts)) if parts else None)
        rows.append(row)
    return rows


def normalise_groups(rows: list[list[float | None]], group_size: int, eps: float = 1e-4) -> list[list[float | None]]:
    """Each step reward minus its group's mean, over its group's std + ``eps`` (groups of
    ``group_size`` consecutive episodes; ``None`` stays ``None``).

    Raises:
        ValueError: ``len(rows)`` is not a multiple of ``group_size``.
    """
    if group_size < 1 or len(rows) % group_size:
        raise ValueError(f"{len(rows)} episodes do not split into groups of {group_size}.")
    out: list[list[float | None]] = []
    for g in range(0, len(rows), group_size):
        group = rows[g:g + group_size]
        values = torch.tensor([v for row in group for v in row if v is not None], dtype=torch.float64)
        mean = values.mean() if values.numel() else torch.tensor(0.0, dtype=torch.float64)
        std = values.std(unbiased=True) if values.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        for row in group:
            out.append([None if v is None else float((v - mean) / (std + eps)) for v in row])
    return out


def token_advantages(normalised: list[list[float | None]], spans: list[list[tuple[int, int]]], width: int) -> torch.Tensor:
    """(episodes, width) advantages: a token of step s gets the sum of the normalised rewards of
    steps s, s+1, ... of its episode; tokens between steps (environment ids, masked out of the
    loss) get the next step's value, tokens after the last step 0.

    Args:
        normalised (`list[list]`): per episode, the normalised step rewards (``None``: no reward).
        spans (`list[list[tuple[int, int]]]`): per episode, ``[start, end)`` of each step's ids.
        width (`int`): the padded completion width.
    """
    out = torch.zeros(len(normalised), width, dtype=torch.float32)
    for i, (row, steps) in enumerate(zip(normalised, spans)):
        later = 0.0
        cumulative = []
        for value in reversed(row):
            later += 0.0 if value is None else value
            cumulative.append(later)
        cumulative.reverse()
        previous_end = 0
        for (_, end), value in zip(steps, cumulative):
            out[i, previous_end:end] = value
            previous_end = end
    return out


def process_advantages(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                       spans: list[list[tuple[int, int]]], group_size: int, width: int,
                       eps: float = 1e-4) -> torch.Tensor:
    """:func:`token_advantages` of :func:`normalise_groups` of :func:`step_reward_rows`."""
    rows = step_reward_rows(step_rewards, weights, [len(s) for s in spans])
    return token_advantages(normalise_groups(rows, group_size, eps), spans, width)
