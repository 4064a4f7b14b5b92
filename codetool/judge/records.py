"""The judge's records and interface: a verdict on one answer, a preference between two.

Every judge satisfies the :class:`Judge` Protocol: two batch methods, ``judge_answers(requests) ->
list[Verdict]`` and ``compare_many(requests) -> list[Preference]``, and ``describe()``, so the
pass-rate and win-rate bookkeeping of :mod:`codetool.eval.stabletoolbench` never knows which judge
it talks to (:class:`JudgeMixin` adds the one-item conveniences and the report entry):

- :class:`~codetool.judge.llm.LLMJudge` over any ``codetool.models`` backend (an
  OpenAI-compatible endpoint or a local transformers model);
- :class:`ScriptedJudge` for tests and replays of recorded verdicts.

The settings are :class:`codetool.judge.config.JudgeConfig`; ``codetool.assemble.make_judge``
builds the judge they describe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from codetool import CodetoolError
from codetool.secrets import redact

LABELS = ("Solved", "Unsure", "Unsolved")
LABEL_SCORES = {"Solved": 1.0, "Unsure": 0.5, "Unsolved": 0.0}
WINNERS = ("a", "b", "tie")


@dataclass
class Verdict:
    """The label of one final answer in one round.

    Args:
        label (`str`): ``Solved``, ``Unsure`` or ``Unsolved`` (scores 1 / 0.5 / 0).
        reason (`str`): the judge's one-sentence reason, or the rule that decided.
        source (`str`): ``rule`` (decided without a judge call), ``answer`` (judged on the final
            answer) or ``trajectory`` (an Unsure answer re-judged with the whole trajectory).
        cached (`bool`): whether the verdict came from the on-disk cache.
        parse_failed (`bool`): the judge's reply could not be read after all retries (the label
            is then ``Unsolved``, which never inflates a pass rate).
        error (`str`, *optional*): the judge request failed after its retries (an error record:
            the label is ``Unsolved``, nothing is cached, a rerun asks again).
    """

    label: str
    reason: str = ""
    source: str = "answer"
    cached: bool = False
    parse_failed: bool = False
    error: str | None = None

    @property
    def score(self) -> float:
        return LABEL_SCORES[self.label]


@dataclass
class Preference:
    """Which of two answers won one comparison: ``winner`` is ``a``, ``b`` or ``tie``.

    ``source`` is ``rule`` when no judge call was needed (one answer solved, or identical answers);
    ``cached``, ``parse_failed`` and ``error`` as in :class:`Verdict` (a failed parse or request is
    a tie).
    """

    winner: str
    reason: str = ""
    source: str = "judge"
    cached: bool = False
    parse_failed: bool = False
    error: str | None = None


@dataclass
class AnswerRequest:
    """One final answer to label; ``trajectory`` (rendered text) asks for the detailed check."""

    query: str
    answer: str
    trajectory: str | None = None
    round: int = 0
    reason: bool = True  # ask for a reason (StableToolBench's preference run checks answers without one)


@dataclass
class CompareRequest:
    """Two final answers to the same query, shown as A and B.

    ``details_a`` / ``details_b`` (the whole answers as JSON, as
    :func:`codetool.eval.stabletoolbench.answer_json` writes them) ask for StableToolBench's
    comparison of whole answers; ``allow_tie`` False leaves the judge A or B only.
    """

    query: str
    answer_a: str
    answer_b: str
    round: int = 0
    details_a: str | None = None
    details_b: str | None = None
    allow_tie: bool = True


@runtime_checkable
class Judge(Protocol):
    """The judge seam: what evaluation, the trees, policy RL and the necessity labels call.

    Implementations: :class:`~codetool.judge.llm.LLMJudge`, :class:`ScriptedJudge` (the table
    ``codetool.assemble.JUDGES``). Both batch methods answer in request order, one result per
    request; a request that fails is an error record (``Verdict.error``), never an exception.

    Attributes:
        name (`str`): shown in reports, e.g. ``openai:gpt-4o-mini`` or ``local:default``.
        weak (`bool`): a small local model whose verdicts are a smoke test, not a measurement.
    """

    name: str
    weak: bool

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        """One :class:`Verdict` per request (``trajectory`` set: the detailed check)."""
        ...

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        """One :class:`Preference` (``a``, ``b`` or ``tie``) per request."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a report says about the judge: at least ``name``, ``kind``, ``weak`` and ``note``."""
        ...


class JudgeMixin:
    """The shared part of our judges, for a class that defines ``judge_answers`` and
    ``compare_many``: the report entry (``describe``) and the one-item conveniences. A judge need
    not use it; the seam is the :class:`Judge` Protocol."""

    name = "judge"
    kind = "custom"
    weak = False
    progress: Any = None  # a ProgressFactory a command may set (codetool.progress); LLMJudge ticks it per batch

    def judge_answer(self: Judge, query: str, answer: str, *, trajectory: str | None = None,
                     round: int = 0) -> Verdict:
        """Label one answer (see :meth:`Judge.judge_answers`)."""
        return self.judge_answers([AnswerRequest(query, answer, trajectory, round)])[0]

    def compare(self: Judge, query: str, answer_a: str, answer_b: str, *, round: int = 0) -> Preference:
        """Compare two answers (see :meth:`Judge.compare_many`)."""
        return self.compare_many([CompareRequest(query, answer_a, answer_b, round)])[0]

    def describe(self) -> dict[str, Any]:
        """What a report says about the judge."""
        note = ("a small local model: its verdicts are a smoke test, not comparable to published numbers"
                if self.weak else "")
        return {"name": redact(self.name), "kind": self.kind, "weak": self.weak, "note": note}


class ScriptedJudge(JudgeMixin):
    """A judge that answers from a script (tests, replays of recorded verdicts).

    Args:
        label (`str` or `Callable[[AnswerRequest], str | Verdict]`, *optional*, defaults to
            `"Solved"`): the label of every answer, or a function of the request.
        winner (`str` or `Callable[[CompareRequest], str | Preference]`, *optional*, defaults to
            `"tie"`): ``a``, ``b`` or ``tie``, or a function of the request.
        name (`str`, *optional*, defaults to `"scripted"`): the name shown in reports.

    Every request is recorded in ``answer_calls`` / ``compare_calls``.
    """

    kind = "scripted"

    def __init__(self, label: str | Callable = "Solved", winner: str | Callable = "tie", *,
                 name: str = "scripted", weak: bool = False):
        self.label, self.winner, self.name, self.weak = label, winner, name, weak
        self.answer_calls: list[AnswerRequest] = []
        self.compare_calls: list[CompareRequest] = []

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        out = []
        for req in requests:
            self.answer_calls.append(req)
            got = self.label(req) if callable(self.label) else self.label
            verdict = got if isinstance(got, Verdict) else Verdict(str(got), "scripted")
            if verdict.label not in LABELS:
                raise CodetoolError(f"ScriptedJudge: label must be one of {LABELS}, got {verdict.label!r}.")
            if req.trajectory is not None and verdict.source == "answer":
                verdict.source = "trajectory"
            out.append(verdict)
        return out

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        out = []
        for req in requests:
            self.compare_calls.append(req)
            got = self.winner(req) if callable(self.winner) else self.winner
            pref = got if isinstance(got, Preference) else Preference(str(got), "scripted")
            if pref.winner not in WINNERS:
                raise CodetoolError(f"ScriptedJudge: winner must be one of {WINNERS}, got {pref.winner!r}.")
            out.append(pref)
        return out
