"""Step rewards of CodeTool (Lu et al., ACL 2025) and tool costs of LIT.

- **On-the-spot reward** ``R_spot``: 1 if the candidate step executed without error, else 0.
  A tool call that came back as an error payload (HTTP 500, a timeout, an ``{"error": ...}``
  message) counts as a failure by default, even when the code caught the exception.
- **Latent reward** ``R_latent = alpha^(1 - LR) * beta^(tau / L)`` where LR is the share of
  successful leaves below the step and tau the mean number of steps from it to its leaves
  (DESIGN.md §4; defaults alpha 0.9, beta 0.95, L 20). It comes from a :class:`PRMScorer`
  (the trained PRM) or from rollouts (Monte Carlo estimate, see ``codetool.search``).
- **Tool cost** (LIT): P + D + C per API from a YAML table, plus a dynamic cost of the code.

Only the formulas and the scorer interface live here; the PRM itself is ``codetool.prm``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class PRMItem:
    """One candidate step to score, in the fields of a PRM example (DESIGN.md §3).

    Args:
        query (`str`): the user query.
        tools (`str`): the rendered tool functions shown to the policy.
        history (`list[dict]`): earlier chosen steps, each ``{"code": str, "output": str}``.
        candidate (`str`): the candidate step's code.
        candidate_output (`str`): what executing the candidate printed or raised.
    """

    query: str
    tools: str
    history: list[dict] = field(default_factory=list)
    candidate: str = ""
    candidate_output: str = ""


@runtime_checkable
class PRMScorer(Protocol):
    """Anything that maps candidate steps to latent rewards.

    ``score(items) -> list[float]``: one score in [0, 1] per item, the probability that the step
    is "more promising". Items of one search step share their prefix (query, tools, history), and
    a good implementation computes that prefix once.
    """

    def score(self, items: list[PRMItem]) -> list[float]: ...


class ConstantScorer:
    """A scorer that gives every candidate the same latent reward (tests, "spot only" runs)."""

    def __init__(self, value: float = 0.5):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"ConstantScorer value must lie in [0, 1], got {value}.")
        self.value = value

    def score(self, items: list[PRMItem]) -> list[float]:
        return [self.value] * len(items)


def latent_reward(lr: float, tau: float, *, alpha: float = 0.9, beta: float = 0.95,
                  max_len: float = 20.0) -> float:
    """``alpha^(1 - LR) * beta^(tau / L)``: the CodeTool latent reward (paper, Eq. for R_latent).

    Args:
        lr (`float`): leaf success ratio in [0, 1] (share of successful leaves below the step).
        tau (`float`): steps from the node to its leaves (mean by default, see ``codetool.tree``).
        alpha (`float`, *optional*, defaults to 0.9): penalty base for failing leaves.
        beta (`float`, *optional*, defaults to 0.95): penalty base for long paths.
        max_len (`float`, *optional*, defaults to 20): L, the path-length normaliser.
    Returns:
        A float in (0, 1]; 1 only for LR = 1 and tau = 0.
    Raises:
        ValueError: if ``lr`` is outside [0, 1], ``tau`` is negative or ``max_len`` is not positive.
    """
    if not 0.0 <= lr <= 1.0:
        raise ValueError(f"LR must lie in [0, 1], got {lr}.")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}.")
    if max_len <= 0:
        raise ValueError(f"L (max_len) must be > 0, got {max_len}.")
    return alpha ** (1.0 - lr) * beta ** (tau / max_len)


def on_the_spot(result, *, tool_error_is_failure: bool = True) -> float:
    """``R_spot``: 1.0 if the step ran cleanly, else 0.0.

    Args:
        result (`codetool.executor.ExecutionResult`): the executed candidate.
        tool_error_is_failure (`bool`, *optional*, defaults to `True`): whether a tool call that
            returned an error payload makes the step a failure even if the code caught it.
    """
    if not result.ok:
        return 0.0
    if tool_error_is_failure and any(call.status != "ok" for call in result.tool_calls):
        return 0.0
    return 1.0
