"""Voting over the final answers of several finished trajectories (``search.vote``).

Best-of-N, beam search and DVTS each end with several finished trajectories of one query; by
default the best-scored one answers (``search.aggregate`` of its steps' values,
:mod:`codetool.search.scores`). Voting groups them by their *answer key* first and lets the group
with the most weight answer, as HF search-and-learn's ``pred_maj`` and ``pred_weighted`` (after
Snell et al. 2024, "Scaling LLM test-time compute optimally", §5: best-of-N weighted):

- ``majority``: one vote per trajectory;
- ``prm_weighted``: each trajectory votes with its score (the PRM's step scores aggregated by
  ``search.aggregate``, clipped at 0), so the weights can overturn a majority of poorly scored
  answers.

The winning group answers with its best-scored member (ties: a finished episode, then the earlier
one). Equal tallies go to the group whose best member scores highest, then to the group seen first
(search-and-learn takes the first group: we break the tie by score so that a tied vote falls back
to best-of-N rather than to the sampling order).

**Answer key.** On RestBench-TMDB the answer is the path: the executed call sequence (the names of
the chosen steps' tool calls in order, failed calls included, as the path metrics count them,
:mod:`codetool.eval.restbench`); any trajectory that executed a call votes. Elsewhere the key is
the ``finish`` answer after :func:`normalise_answer`; episodes that gave up, ran out of steps or
failed do not vote. When no trajectory votes, the best-scored one answers.

Limits: normalisation is lexical (case, punctuation, whitespace, articles, number formats); two
answers that say the same in other words stay apart, and a key never sees argument values of the
calls (two paths that called the same APIs with different arguments vote together).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from codetool.config import option
from codetool.config_groups import Group
from codetool.search.records import Trajectory

VOTES = ("none", "majority", "prm_weighted")

# A number: optional sign (only where it cannot be a hyphen inside a word or a date), digits with
# optional thousands separators, optional decimals, and no letter or digit right after (an id such
# as 9d3924c2 stays one word).
_NUMBER = r"(?<![\w.,])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![^\W_])"
_TOKEN = re.compile(rf"{_NUMBER}|[^\W_]+")
_IS_NUMBER = re.compile(r"[-+]?[\d,]+(?:\.\d+)?")
_ARTICLES = frozenset({"a", "an", "the"})


@dataclass
class VoteGroup(Group):
    """How a strategy with several finished trajectories picks its answer (``search.vote``)."""

    vote: str = option("none", "answer of best_of_n, beam, dvts and compute_optimal: none (the best-scored "
                       "trajectory), majority (the most frequent normalised answer; RestBench: executed call "
                       "sequence) or prm_weighted (the answer whose trajectories' PRM scores sum highest, "
                       "search-and-learn's weighted best-of-N)", choices=list(VOTES))


@dataclass(frozen=True)
class Ballot:
    """The outcome of :func:`vote`.

    Args:
        chosen (`int`): index of the trajectory that answers.
        key (`str` or `None`): its answer key (``None`` when nothing voted or ``mode='none'``).
        tally (`dict[str, float]`): weight per answer key, in order of first appearance.
    """

    chosen: int
    key: str | None = None
    tally: dict[str, float] = field(default_factory=dict)

    def record(self, mode: str, max_chars: int = 200) -> dict:
        """What the trajectory's ``strategy`` dict keeps of the vote (keys cut to ``max_chars``)."""
        if mode == "none":
            return {}
        return {"vote": mode, "voted_key": None if self.key is None else self.key[:max_chars],
                "tally": [[k[:max_chars], round(w, 6)] for k, w in self.tally.items()]}


def normalise_answer(text: str | None) -> str:
    """An answer in the form votes compare: Unicode NFKC, case-folded; punctuation and symbols
    dropped; whitespace collapsed; the articles a/an/the dropped unless nothing else is left (SQuAD's answer
    normalisation);
    numbers canonical: thousands separators and a leading ``+`` removed, leading zeros of the
    integer part and trailing zeros of the decimals dropped (``"1,000.50"`` -> ``"1000.5"``,
    ``"+07"`` -> ``"7"``, ``"-0.0"`` -> ``"0"``).

    Example: ``normalise_answer("The total is $1,200.00!") == "total is 1200"``.
    """
    if not text:
        return ""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    words = [_number(t) if _IS_NUMBER.fullmatch(t) else t for t in _TOKEN.findall(text)]
    return " ".join([w for w in words if w not in _ARTICLES] or words)  # "A" alone stays an answer


def _number(token: str) -> str:
    sign = "-" if token.startswith("-") else ""
    whole, _, decimals = token.lstrip("+-").replace(",", "").partition(".")
    decimals = decimals.rstrip("0")
    digits = str(int(whole)) + (f".{decimals}" if decimals else "")
    return "0" if digits == "0" else sign + digits


def answer_key(traj: Trajectory) -> str | None:
    """What ``traj`` votes for (see the module docstring), or ``None`` when it does not vote."""
    if traj.finish_type == "error":
        return None
    if traj.benchmark.startswith("restbench"):
        calls = [str(c.name) for c in traj.executed_calls()]
        return " -> ".join(calls) if calls else None
    if traj.finish_type != "finish":
        return None
    return normalise_answer(traj.final_answer) or None


def finished_record(traj: Trajectory, score: float) -> dict:
    """What a strategy's record keeps of one of its finished trajectories: its answer, how it ended,
    the tool calls of its chosen steps (as the steps record them: name, status, arguments and
    response previews) and its score; enough to vote again with another mode or to score any pick
    afterwards, grounded answers included (as search-and-learn keeps every completion with its
    scores), without the steps."""
    return {"answer": traj.final_answer, "finish_type": traj.finish_type,
            "calls": [c.to_dict() for c in traj.executed_calls()],
            "score": round(score, 6) if math.isfinite(score) else None}


def best_scored(trajs: Sequence[Trajectory], scores: Sequence[float]) -> int:
    """Index of the best-scored trajectory (ties: a finished episode, then the earlier one)."""
    return max(range(len(trajs)), key=lambda j: (scores[j], trajs[j].finish_type == "finish", -j))


def vote(trajs: Sequence[Trajectory], scores: Sequence[float], mode: str) -> Ballot:
    """Pick the answering trajectory of a query by ``mode`` (``none``, ``majority``, ``prm_weighted``).

    Args:
        trajs (`Sequence[Trajectory]`): the finished trajectories of one query.
        scores (`Sequence[float]`): (len(trajs),) their scores (:func:`codetool.search.scores.aggregate`
            of their steps' values; ``-inf`` for a failed episode).
        mode (`str`): one of :data:`VOTES`.
    Returns:
        The :class:`Ballot`.
    Raises:
        ValueError: no trajectory, a length mismatch or an unknown ``mode``.
    """
    if not trajs or len(trajs) != len(scores):
        raise ValueError(f"vote needs one score per trajectory, got {len(trajs)} trajectories and {len(scores)} scores.")
    if mode not in VOTES:
        raise ValueError(f"vote mode must be one of {VOTES}, got {mode!r}.")
    if mode == "none":
        return Ballot(best_scored(trajs, scores))
    tally: dict[str, float] = {}
    members: dict[str, list[int]] = {}
    for j, traj in enumerate(trajs):
        key = answer_key(traj)
        if key is None:
            continue
        weight = 1.0 if mode == "majority" else (max(scores[j], 0.0) if math.isfinite(scores[j]) else 0.0)
        tally[key] = tally.get(key, 0.0) + weight
        members.setdefault(key, []).append(j)
    if not tally:
        return Ballot(best_scored(trajs, scores))

    def best_of(key: str) -> int:
        return max(members[key], key=lambda j: (scores[j], trajs[j].finish_type == "finish", -j))

    order = list(tally)
    winner = max(order, key=lambda k: (round(tally[k], 9), scores[best_of(k)], -order.index(k)))
    return Ballot(best_of(winner), winner, tally)
