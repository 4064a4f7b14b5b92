"""Step rewards -> per-token advantages: process credit that is fair to length (issue 38).

Two estimators, both over groups of ``num_generations`` consecutive episodes of one query:

**``anchored``** (the default): outcome-anchored step credit.

1. Each reward function gives the episode one value: an outcome reward (``grounded``, ``judged``)
   its value on the last step, a per-step reward (``on_the_spot``, ``prm``, ``tool_cost``) the
   ``aggregate`` of its step values (``mean`` by default: a length-neutral value; ``min`` is the
   min-form credit of "Stop Summation", Cheng et al. 2025, arXiv 2504.15275; ``sum`` would pay
   per step again). The episode's return is the weighted sum, and its advantage is GRPO's:
   ``A_i = (R_i - mean_group R) / (std_group R + eps)`` (DeepSeekMath §4.1.2, TRL's defaults).
2. That credit is spread over the episode's steps by their quality: the per-step rewards' weighted
   sum ``q_{i,s}``, standardised over the group's steps (``z``), gives the weights
   ``w_{i,s} = n_i * softmax_s(sign(A_i) * z_{i,s} / temperature)`` (mean 1 over the episode), so a
   successful episode's credit lands mostly on its better steps and a failed one's blame on its
   worse steps; a token of step ``s`` gets ``A_i * w_{i,s}``.

So the group decides how much credit each episode earns and the step rewards decide where it
lands: two equally good episodes (equal outcome, equal step rewards) get equal advantages on every
step whatever their lengths and whatever else is in the group, a group of identical episodes gets
0 everywhere, and with the outcome reward alone this is GRPO's sequence-level advantage. The
advantage of step ``s`` never takes the other sign from its episode's: a bad step of a successful
episode gets less credit, not blame (a PRM cannot overturn the group's verdict).

**``deepseekmath``** (the earlier default, ``advantage: process`` before issue 38): DeepSeekMath's
process supervision (Shao et al. 2024, §4.1.3): every step reward of the group normalised by the
mean and std of all the group's step rewards, a token's advantage the sum of the normalised rewards
of its own and every later step. It favours length in a way that depends on the group: each
further step adds ``-mean/std`` of the group's step rewards (two episodes with PRM 0.8 on every
step and the same outcome, 2 and 4 steps long, get first-token advantages +0.677 and -0.677; add
four one-step failures and it flips), and identical episodes get non-zero advantages.

Both decompose additively over the reward functions (:func:`process_advantages` with
``components=True``), which gives each reward's share of the advantage's variance
(:func:`advantage_shares`; the report shows the PRM's). The standard deviation is the unbiased one,
as TRL's ``nanstd``, plus ``eps`` (1e-4, TRL's).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

ESTIMATORS = ("anchored", "deepseekmath")
OUTCOME_REWARDS = ("grounded", "judged")


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


def _check_groups(n: int, group_size: int) -> None:
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} episodes do not split into groups of {group_size}.")


def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and unbiased std (0 for fewer than two values, and mean 0 for none)."""
    t = torch.tensor(values, dtype=torch.float64)
    mean = float(t.mean()) if t.numel() else 0.0
    std = float(t.std(unbiased=True)) if t.numel() > 1 else 0.0
    return mean, std


def normalise_groups(rows: list[list[float | None]], group_size: int, eps: float = 1e-4) -> list[list[float | None]]:
    """Each step reward minus its group's mean, over its group's std + ``eps`` (groups of
    ``group_size`` consecutive episodes; ``None`` stays ``None``).

    Raises:
        ValueError: ``len(rows)`` is not a multiple of ``group_size``.
    """
    _check_groups(len(rows), group_size)
    out: list[list[float | None]] = []
    for g in range(0, len(rows), group_size):
        group = rows[g:g + group_size]
        mean, std = _stats([v for row in group for v in row if v is not None])
        for row in group:
            out.append([None if v is None else (v - mean) / (std + eps) for v in row])
    return out


def token_advantages(normalised: list[list[float | None]], spans: list[list[tuple[int, int]]], width: int) -> torch.Tensor:
    """(episodes, width) advantages: a token of step s gets the sum of the normalised rewards of
    steps s, s+1, ... of its episode (DeepSeekMath); tokens between steps (environment ids, masked
    out of the loss) get the next step's value, tokens after the last step 0.

    Args:
        normalised (`list[list]`): per episode, the normalised step rewards (``None``: no reward).
        spans (`list[list[tuple[int, int]]]`): per episode, ``[start, end)`` of each step's ids.
        width (`int`): the padded completion width.
    """
    rows = []
    for row in normalised:
        later, cumulative = 0.0, []
        for value in reversed(row):
            later += 0.0 if value is None else value
            cumulative.append(later)
        rows.append(cumulative[::-1])
    return place(rows, spans, width)


def place(step_values: list[list[float]], spans: list[list[tuple[int, int]]], width: int) -> torch.Tensor:
    """(episodes, width): every token of step ``s`` (and the environment ids before it) gets
    ``step_values[i][s]``; tokens after the last step 0."""
    out = torch.zeros(len(step_values), width, dtype=torch.float32)
    for i, (values, steps) in enumerate(zip(step_values, spans)):
        previous_end = 0
        for (_, end), value in zip(steps, values):
            out[i, previous_end:end] = value
            previous_end = end
    return out


def episode_value(values: Sequence[float | None], *, outcome: bool, aggregate: str = "mean") -> float:
    """One reward's value of an episode: an outcome reward's last value, else the ``aggregate``
    (``mean``, ``min``, ``last``, ``sum``) of the defined step values; 0 when none is defined."""
    defined = [float(v) for v in values if v is not None]
    if outcome:
        return float(values[-1]) if values and values[-1] is not None else 0.0
    if not defined:
        return 0.0
    if aggregate not in ("mean", "min", "last", "sum"):
        raise ValueError(f"aggregate must be min, mean, last or sum, got {aggregate!r}.")
    return {"mean": sum(defined) / len(defined), "min": min(defined), "last": defined[-1], "sum": sum(defined)}[aggregate]


def credit_weights(z: Sequence[float | None], sign: float, temperature: float) -> list[float]:
    """``n * softmax(sign * z / temperature)`` over an episode's ``n`` steps (``None``: 0), mean 1."""
    if not z:
        return []
    t = torch.tensor([0.0 if v is None else float(v) for v in z], dtype=torch.float64)
    return (len(z) * torch.softmax(sign * t / temperature, dim=0)).tolist()


def scored(rewards: dict[str, list[float | None]], weights: dict[str, float]) -> bool:
    """Whether any weighted reward gave the episode a value (a dropped episode has ``None`` everywhere)."""
    return any(v is not None for name in weights for v in rewards.get(name, []))


def anchored_components(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                        spans: list[list[tuple[int, int]]], group_size: int, width: int, *, eps: float = 1e-4,
                        aggregate: str = "mean", aggregates: dict[str, str] | None = None,
                        outcomes: Collection[str] = OUTCOME_REWARDS, temperature: float = 1.0,
                        spread: bool = True) -> dict[str, torch.Tensor]:
    """Per reward name, its (episodes, width) part of the ``anchored`` advantage (module docstring);
    the parts add up to the advantage. ``aggregates`` overrides ``aggregate`` per reward (the LIT
    tool cost is summed). An episode no weighted reward scored (``Episode.dropped``: every value
    ``None``) is left out of its group's statistics and gets 0. ``spread=False`` puts each
    episode's advantage on all its steps alike (:func:`sequence_components`)."""
    n = len(spans)
    _check_groups(n, group_size)
    steps = [len(s) for s in spans]
    modes = {name: (aggregates or {}).get(name, aggregate) for name in weights}
    per_step = {name: w for name, w in weights.items() if name not in outcomes}
    z = normalise_groups(step_reward_rows(step_rewards, per_step, steps), group_size, eps) if per_step and spread \
        else [[None] * k for k in steps]
    parts: dict[str, list[list[float]]] = {name: [[0.0] * steps[i] for i in range(n)] for name in weights}
    for g in range(0, n, group_size):
        # an episode no reward scored (dropped: a step the machine could not run) is out of its group, advantage 0
        members = [i for i in range(g, g + group_size) if scored(step_rewards[i], weights)]
        values = {name: [episode_value(step_rewards[i].get(name, []) if steps[i] else [], outcome=name in outcomes,
                                       aggregate=modes[name]) for i in members] for name in weights}
        totals = [sum(w * values[name][k] for name, w in weights.items()) for k in range(len(members))]
        mean_total, std = _stats(totals)
        means = {name: _stats(values[name])[0] for name in weights}
        for k, i in enumerate(members):
            episode = {name: w * (values[name][k] - means[name]) / (std + eps) for name, w in weights.items()}
            above = totals[k] - mean_total  # its sign decides where the credit (or the blame) lands
            credit = credit_weights(z[i], float(above > 1e-12) - float(above < -1e-12), temperature)
            for name, value in episode.items():
                parts[name][i] = [value * c for c in credit]
    return {name: place(rows, spans, width) for name, rows in parts.items()}


def sequence_components(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                        spans: list[list[tuple[int, int]]], group_size: int, width: int, *, eps: float = 1e-4,
                        aggregate: str = "mean", aggregates: dict[str, str] | None = None,
                        outcomes: Collection[str] = OUTCOME_REWARDS) -> dict[str, torch.Tensor]:
    """Per reward name, its part of TRL's sequence-level GRPO advantage of the ``aggregate``d rewards
    (``advantage: sequence``), every token of an episode alike."""
    return anchored_components(step_rewards, weights, spans, group_size, width, eps=eps, aggregate=aggregate,
                               aggregates=aggregates, outcomes=outcomes, spread=False)


def deepseekmath_components(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                            spans: list[list[tuple[int, int]]], group_size: int, width: int, *,
                            eps: float = 1e-4) -> dict[str, torch.Tensor]:
    """Per reward name, its part of the ``deepseekmath`` advantage: each reward's weighted step values
    minus their mean over the group's scored steps, over the std of the steps' total rewards, summed
    over later steps (the parts add up to :func:`token_advantages` of :func:`normalise_groups`)."""
    n = len(spans)
    _check_groups(n, group_size)
    steps = [len(s) for s in spans]
    totals = step_reward_rows(step_rewards, weights, steps)
    out = {}
    for name, w in weights.items():
        own = step_reward_rows(step_rewards, {name: w}, steps)
        rows: list[list[float | None]] = []
        for g in range(0, n, group_size):
            scored = [(own[i][s] or 0.0) for i in range(g, g + group_size) for s in range(steps[i])
                      if totals[i][s] is not None]
            mean = sum(scored) / len(scored) if scored else 0.0
            _, std = _stats([v for i in range(g, g + group_size) for v in totals[i] if v is not None])
            rows += [[None if totals[i][s] is None else ((own[i][s] or 0.0) - mean) / (std + eps)
                      for s in range(steps[i])] for i in range(g, g + group_size)]
        out[name] = token_advantages(rows, spans, width)
    return out


def process_advantages(step_rewards: Sequence[dict[str, list[float | None]]], weights: dict[str, float],
                       spans: list[list[tuple[int, int]]], group_size: int, width: int, eps: float = 1e-4, *,
                       estimator: str = "anchored", aggregate: str = "mean", aggregates: dict[str, str] | None = None,
                       outcomes: Collection[str] = OUTCOME_REWARDS, temperature: float = 1.0,
                       components: bool = False):
    """(episodes, width) per-token advantages of a batch of groups (see the module docstring).

    Args:
        step_rewards (`Sequence[dict]`): per episode, reward name -> per-step values (``None``: no value).
        weights (`dict[str, float]`): reward name -> weight.
        spans (`list[list[tuple[int, int]]]`): per episode, ``[start, end)`` of each step's ids.
        group_size (`int`): episodes per group (consecutive).
        width (`int`): the padded completion width.
        estimator (`str`, *optional*, defaults to ``"anchored"``): ``anchored`` or ``deepseekmath``.
        aggregate (`str`, *optional*, defaults to ``"mean"``): ``anchored``: a per-step reward's episode value.
        aggregates (`dict[str, str]`, *optional*): per reward, an aggregate that overrides ``aggregate``.
        outcomes (`Collection[str]`): the outcome rewards (their last-step value is the episode's).
        temperature (`float`, *optional*, defaults to 1.0): ``anchored``: how sharply credit follows step quality.
        components (`bool`, *optional*): also return each reward's part (they add up to the advantage).
    Returns:
        The advantages, or ``(advantages, {name: part})`` with ``components``.
    Raises:
        ValueError: an unknown estimator, or episodes that do not split into groups.
    """
    if estimator == "anchored":
        parts = anchored_components(step_rewards, weights, spans, group_size, width, eps=eps, aggregate=aggregate,
                                    aggregates=aggregates, outcomes=outcomes, temperature=temperature)
    elif estimator == "deepseekmath":
        parts = deepseekmath_components(step_rewards, weights, spans, group_size, width, eps=eps)
    else:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}.")
    total = sum(parts.values()) if parts else torch.zeros(len(spans), width)
    return (total, parts) if components else total


def advantage_shares(total: torch.Tensor, parts: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """Each reward's share of the advantage's variance over the generated tokens (``mask`` 1):
    ``sum(part * total) / sum(total^2)``, the covariance share, which adds up to 1 over the rewards
    (0 for every reward when all advantages are 0). A reward that is the same for every episode of
    each group (an empty PRM input) has share 0."""
    m = mask.to(total.dtype)
    energy = float((total * total * m).sum())
    if energy <= 0:
        return dict.fromkeys(parts, 0.0)
    return {name: float((part * total * m).sum()) / energy for name, part in parts.items()}


def step_mask(spans: list[list[tuple[int, int]]], width: int) -> torch.Tensor:
    """(episodes, width) 1 on each step's generated ids, 0 elsewhere."""
    out = torch.zeros(len(spans), width)
    for i, steps in enumerate(spans):
        for start, end in steps:
            out[i, start:end] = 1
    return out
