"""StableToolBench solvable pass rate (SoPR) and solvable win rate (SoWR), bookkept as its evaluator.

Pass rate (StableToolBench ``toolbench/tooleval/eval_pass_rate.py`` and the ``check_is_solved`` of
its evaluator), per query and round, under ``judge.protocol: stabletoolbench`` (the default):

- a give-up, an empty final answer, or no answer at all is **Unsolved** without a judge call (an
  episode that ended without ``finish`` but got an answer written after the search,
  ``extra["answer_source"] == "generated"``, is judged like a finished one);
- otherwise the judge labels the query and final answer Solved / Unsure / Unsolved, and an
  **Unsure** answer is judged again from the whole answer with its details (:func:`answer_details`:
  the final answer and the ``answer_details`` chain of steps and tool calls, laid out as the
  evaluator reads them); the second label stands;
- scores are Solved 1, Unsure 0.5, Unsolved 0. The pass rate of round ``r`` is the sum of scores
  over the group's queries divided by their number (a query without a verdict in round ``r``
  scores 0); the reported rate is the mean over rounds and the spread their population standard
  deviation (``numpy.std``). The average over groups (the papers' "Avg." column) is the mean of
  the group rates, round by round.

``judge.protocol: codetool`` is the CodeTool paper's single pass: the query and final answer only,
no second stage (rounds and temperature come from the config: 1 and 0 by default).

Win rate (``eval_preference.py``), candidate vs reference, per query and round: a query missing
from one run is won by the other; each round uses that round's fresh solved status of both
answers; if exactly one is Solved it wins; otherwise the judge compares the two whole answers with
their details and must pick one; identical answers (same final answer and details), two runs that
both gave no answer, and a comparison the judge leaves undecided go to a seeded coin flip. No
round is a tie. A query is won by the run with more round wins (only an even number of rounds can
leave a query tied). Win rate = wins / queries.

Deviations from the upstream scripts, each deliberate and listed in every report's comparability
block: the two answers swap places (A/B) on odd rounds, against position bias; two runs without
any answer get a coin flip without a judge call (there is nothing to compare). None of these
changes the golden example (``StableToolBench/data_example``), which the tests replay exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from codetool import CodetoolError
from codetool.eval.judges import (
    LABEL_SCORES,
    LABELS,
    AnswerRequest,
    CompareRequest,
    Judge,
    Verdict,
    clip,
)
from codetool.search.records import Trajectory
from codetool.secrets import redact

logger = logging.getLogger(__name__)

GIVE_UP_MARK = "give_up_and_restart"  # ToolBench's give-up return type, also inside answer texts


def rule_verdict(traj: Trajectory, blank_finish: str = "unsolved") -> Verdict | None:
    """Unsolved without a judge call (give-up, no answer, empty answer), else ``None``. An episode
    without ``finish`` is judged only when an answer was generated for it after the search (under
    ``answer.final_answer: reference`` a given-up one too, as CodeTool judges every answer it
    wrote). ``blank_finish="judge"``: a ``finish`` with an empty or blank answer goes to the judge,
    as in StableToolBench (its export holds ToolBench's JSON text there, and only an exactly empty
    ``final_answer`` is ruled out); ``unsolved`` (ours) rules it out."""
    generated = (traj.extra or {}).get("answer_source") == "generated"
    regenerated = (traj.extra or {}).get("answer_procedure") == "reference"
    if traj.finish_type == "give_up" and not regenerated:
        return Verdict("Unsolved", "the episode gave up", "rule")
    if traj.finish_type != "finish" and not generated:
        return Verdict("Unsolved", f"no finish call (episode ended with {traj.finish_type})", "rule")
    answer = (traj.final_answer or "").strip()
    if not answer:
        if blank_finish == "judge" and traj.finish_type == "finish" and not generated:
            return None
        return Verdict("Unsolved", "empty final answer", "rule")
    if GIVE_UP_MARK in answer:
        return Verdict("Unsolved", "the answer gives up", "rule")
    return None


def render_trajectory(traj: Trajectory, max_chars: int = 6000) -> str:
    """The chosen path of ``traj`` as text for the judge: per step the code (or thought), each tool
    call with its status and (cut) response, what it printed, and how the episode ended."""
    lines = []
    for step in traj.steps:
        cand = step.chosen_candidate
        lines.append(f"Step {step.index + 1}:")
        if cand.code:
            lines.append("code:\n" + clip(cand.code, 1500))
        elif cand.text:
            lines.append("thought: " + clip(cand.text, 1000))
        for call in cand.result.tool_calls if cand.result is not None else []:
            args = call.arguments
            args = getattr(call, "arguments_text", "") if args is None else json.dumps(args, ensure_ascii=False)
            body = call.response
            body = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
            lines.append(f"call {call.name or '?'}({clip(args, 300)}) -> {call.status}: "
                         f"{clip(body, 600)}")
        result = cand.result
        printed = (result.stdout if result is not None else "") or step.observation
        if printed:
            lines.append("printed: " + clip(printed, 800))
        if result is not None and result.error_type:
            lines.append(f"error: {result.error_type}: {clip(result.error_message or '', 300)}")
    lines.append(f"Episode ended with: {traj.finish_type}")
    return redact(clip("\n".join(lines), max_chars))


def answer_details(traj: Trajectory) -> str:
    """The whole answer of ``traj`` as StableToolBench's evaluator reads it: JSON of
    ``{"final_answer": ..., "answer_details": [...]}`` (the converted-answer chain of messages:
    system, user, each step, each tool call and its response, the Finish call), secrets redacted."""
    from codetool.eval.convert import trajectory_to_converted

    answer = trajectory_to_converted(traj)["answer"]
    if (traj.extra or {}).get("answer_source") == "generated":
        answer["final_answer"] = traj.final_answer or ""
    return redact(json.dumps({"final_answer": answer["final_answer"], "answer_details": answer["answer_details"]},
                             ensure_ascii=False))


def judged_answer(traj: Trajectory) -> str:
    """The answer text the judge reads: the final answer, or for a ``finish`` with an empty or
    blank one, StableToolBench's converted ``final_answer`` (ToolBench's JSON text)."""
    answer = traj.final_answer or ""
    if answer.strip() or traj.finish_type != "finish":
        return answer
    from codetool.eval.convert import trajectory_to_converted

    return str(trajectory_to_converted(traj)["answer"]["final_answer"])


def judge_pass(trajs: Sequence[Trajectory], judge: Judge | None, rounds: int = 3, *,
               max_trajectory_chars: int = 0, protocol: str = "stabletoolbench",
               blank_finish: str = "unsolved") -> list[list[Verdict]]:
    """Pass-rate verdicts: ``(len(trajs), rounds)``, one :class:`Verdict` per trajectory and round.

    The rule (:func:`rule_verdict`) decides without the judge where it can; the rest go to the
    judge in one batch per stage (final answers, then, under the ``stabletoolbench`` protocol, the
    Unsure ones with their whole answer and details, :func:`answer_details`). The ``codetool``
    protocol stops after the first stage.

    Args:
        max_trajectory_chars (`int`, *optional*, defaults to 0): cut the details to this many
            characters (0: never).
        blank_finish (`str`, *optional*, defaults to ``"unsolved"``): see :func:`rule_verdict`.

    Raises:
        CodetoolError: a trajectory needs a judge but ``judge`` is ``None``.
    """
    out: list[list[Verdict | None]] = [[None] * rounds for _ in trajs]
    todo = []
    for i, traj in enumerate(trajs):
        rule = rule_verdict(traj, blank_finish)
        for r in range(rounds):
            if rule is not None:
                out[i][r] = rule
            else:
                todo.append((i, r))
    if todo and judge is None:
        raise CodetoolError(f"{len(todo)} answers need a judge for the pass rate, but none is configured; "
                            f"set --judge.model (a local model or an http(s):// server).")
    first = judge.judge_answers([AnswerRequest(trajs[i].query, judged_answer(trajs[i]), None, r)
                                 for i, r in todo]) if todo else []
    unsure = []
    for (i, r), verdict in zip(todo, first):
        out[i][r] = verdict
        if verdict.label == "Unsure":
            unsure.append((i, r))
    if unsure and protocol == "stabletoolbench":
        texts = {i: answer_details(trajs[i]) for i, _ in unsure}
        if max_trajectory_chars:
            texts = {i: clip(t, max_trajectory_chars) for i, t in texts.items()}
        second = judge.judge_answers([AnswerRequest(trajs[i].query, judged_answer(trajs[i]), texts[i], r)
                                      for i, r in unsure])
        for (i, r), verdict in zip(unsure, second):
            verdict.source = "trajectory"
            out[i][r] = verdict
    return out  # type: ignore[return-value]


@dataclass
class PassRate:
    """A pass rate over rounds.

    Args:
        mean (`float`): mean over rounds, in [0, 1].
        std (`float`): population standard deviation of the per-round rates.
        per_round (`list[float]`): (rounds,) the rate of each round.
        n (`int`): number of queries.
        counts (`dict[str, int]`): labels over all queries and rounds.
    """

    mean: float
    std: float
    per_round: list[float]
    n: int
    counts: dict[str, int] = field(default_factory=dict)


def pass_rate(labels: Sequence[Mapping[int, str] | Sequence[str]], rounds: int) -> PassRate:
    """StableToolBench's pass-rate formula over ``labels`` (one entry per query: its label per
    round, as a list or a ``{round: label}`` mapping; a missing round scores 0).

    Raises:
        CodetoolError: a label outside Solved / Unsure / Unsolved.
    """
    per_query = [dict(enumerate(q)) if not isinstance(q, Mapping) else {int(k): v for k, v in q.items()}
                 for q in labels]
    counts: Counter = Counter()
    per_round = []
    for r in range(rounds):
        total = 0.0
        for q in per_query:
            if r in q:
                if q[r] not in LABEL_SCORES:
                    raise CodetoolError(f"pass-rate label must be one of {LABELS}, got {q[r]!r}.")
                total += LABEL_SCORES[q[r]]
                counts[q[r]] += 1
        per_round.append(total / len(per_query) if per_query else 0.0)
    return PassRate(float(np.mean(per_round)), float(np.std(per_round)), per_round, len(per_query),
                    {label: counts.get(label, 0) for label in LABELS})


def average_pass_rate(groups: Sequence[PassRate]) -> PassRate:
    """The mean of group pass rates, round by round (the papers' average over groups)."""
    if not groups:
        return PassRate(0.0, 0.0, [], 0)
    per_round = [float(np.mean(r)) for r in zip(*(g.per_round for g in groups))]
    counts = Counter()
    for g in groups:
        counts.update(g.counts)
    return PassRate(float(np.mean(per_round)), float(np.std(per_round)), per_round,
                    sum(g.n for g in groups), dict(counts))


def majority_label(labels: Sequence[str]) -> str:
    """The most frequent label; a tie between labels (or no label) is ``Unsure``."""
    top = Counter(labels).most_common()
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return "Unsure"
    return top[0][0]


def load_pass_results(path: str | Path) -> dict[str, list[str]]:
    """Labels per query (in round order) from a StableToolBench ``pass_rate_results`` JSON file
    (``{query_id: {"is_solved": {"0": "AnswerStatus.Solved", ...}, ...}}``)."""
    data = json.loads(Path(path).read_text())
    out = {}
    for qid, entry in data.items():
        rounds = {int(k): str(v).split(".")[-1] for k, v in entry.get("is_solved", {}).items()}
        out[str(qid)] = [rounds[r] for r in sorted(rounds)]
    return out


@dataclass
class PairCount:
    """Round wins of one query in a candidate-vs-reference comparison.

    Args:
        candidate, reference (`int`): rounds won by each run.
        judged (`int`): rounds that needed a judge call.
    """

    candidate: int = 0
    reference: int = 0
    judged: int = 0

    @property
    def outcome(self) -> str:
        """``win`` (for the candidate), ``lose`` or ``tie``."""
        if self.candidate > self.reference:
            return "win"
        return "lose" if self.reference > self.candidate else "tie"


@dataclass
class WinRate:
    """Candidate-vs-reference win rate: ``win + lose + tie == 1`` over ``n`` queries."""

    win: float
    lose: float
    tie: float
    n: int
    per_query: dict[str, PairCount] = field(default_factory=dict)
    coin_flips: int = 0


def win_rate_from_counts(counts: Mapping[str, PairCount]) -> WinRate:
    """Win / lose / tie shares from per-query round wins."""
    outcomes = Counter(c.outcome for c in counts.values())
    n = len(counts)
    share = (lambda k: outcomes[k] / n) if n else (lambda k: 0.0)
    return WinRate(share("win"), share("lose"), share("tie"), n, dict(counts))


def load_preference_results(path: str | Path, reference: str, candidate: str) -> dict[str, PairCount]:
    """Round wins per query from a StableToolBench ``preference_results`` JSON file
    (``{query_id: {<reference>: wins, <candidate>: wins, "round_0": "complete", ...}}``)."""
    data = json.loads(Path(path).read_text())
    return {str(qid): PairCount(int(e.get(candidate, 0)), int(e.get(reference, 0))) for qid, e in data.items()}


def coin_flip(seed: int, qid: str, round: int) -> str:
    """``candidate`` or ``reference``, seeded by ``seed``, the query id and the round."""
    digest = hashlib.sha256(f"{seed}|{qid}|{round}".encode()).hexdigest()
    return "candidate" if int(digest[:8], 16) % 2 else "reference"


def compare_runs(candidate: Mapping[str, Trajectory], reference: Mapping[str, Trajectory],
                 candidate_labels: Mapping[str, Sequence[str]], reference_labels: Mapping[str, Sequence[str]],
                 judge: Judge | None, rounds: int = 3, *, query_ids: Sequence[str] | None = None,
                 seed: int = 0, max_details_chars: int = 0) -> WinRate:
    """SoWR of ``candidate`` against ``reference`` (both keyed by query id), given each run's
    pass-rate labels per round (see :func:`judge_pass`: a fresh solved status every round).

    Args:
        query_ids (`Sequence[str]`, *optional*): the test ids (default: every id of either run).
        seed (`int`, *optional*, defaults to 0): seed of the coin flips.
        max_details_chars (`int`, *optional*, defaults to 0): cut each whole answer shown to the
            judge to this many characters (0: never).

    Raises:
        CodetoolError: a pair needs a comparison but ``judge`` is ``None``.
    """
    ids = list(query_ids) if query_ids is not None else sorted(set(candidate) | set(reference), key=str)
    counts = {qid: PairCount() for qid in ids}
    flips: dict[str, int] = {}
    asks = []  # (qid, round, candidate_is_a)

    def win(qid: str, who: str) -> None:
        setattr(counts[qid], who, getattr(counts[qid], who) + 1)

    for qid in ids:
        if qid not in reference or qid not in candidate:
            winner = "candidate" if qid not in reference else "reference"
            setattr(counts[qid], winner, rounds)
            continue
        ref_labels, cand_labels = list(reference_labels[qid]), list(candidate_labels[qid])
        for r in range(rounds):
            ref_solved = ref_labels[r % len(ref_labels)] == "Solved"
            cand_solved = cand_labels[r % len(cand_labels)] == "Solved"
            if ref_solved != cand_solved:
                win(qid, "candidate" if cand_solved else "reference")
            elif _same_answer(reference[qid], candidate[qid]) or _both_empty(reference[qid], candidate[qid]):
                win(qid, coin_flip(seed, qid, r))
                flips[qid] = flips.get(qid, 0) + 1
            else:
                asks.append((qid, r, r % 2 == 1))
    if asks and judge is None:
        raise CodetoolError(f"{len(asks)} answer pairs need a judge for the win rate, but none is configured.")
    details: dict[tuple[str, str], str] = {}

    def detail(who: str, qid: str, traj: Trajectory) -> str:
        if (who, qid) not in details:
            text = answer_details(traj)
            details[(who, qid)] = clip(text, max_details_chars) if max_details_chars else text
        return details[(who, qid)]

    requests = []
    for qid, r, cand_is_a in asks:
        pair = [("candidate", candidate[qid]), ("reference", reference[qid])]
        (wa, a), (wb, b) = pair if cand_is_a else pair[::-1]
        requests.append(CompareRequest(reference[qid].query, a.final_answer or "", b.final_answer or "", r,
                                       details_a=detail(wa, qid, a), details_b=detail(wb, qid, b),
                                       allow_tie=False))
    prefs = judge.compare_many(requests) if requests else []
    for (qid, r, cand_is_a), pref in zip(asks, prefs):
        counts[qid].judged += 1
        if pref.winner not in ("a", "b"):  # undecided or unreadable: no ties, a coin decides
            win(qid, coin_flip(seed, qid, r))
            flips[qid] = flips.get(qid, 0) + 1
            continue
        win(qid, "candidate" if (pref.winner == "a") == cand_is_a else "reference")
    result = win_rate_from_counts(counts)
    result.coin_flips = sum(flips.values())
    return result


def _both_empty(a: Trajectory, b: Trajectory) -> bool:
    return not (a.final_answer or "").strip() and not (b.final_answer or "").strip()


def _same_answer(a: Trajectory, b: Trajectory) -> bool:
    return ((a.final_answer or "").strip() == (b.final_answer or "").strip()
            and answer_details(a) == answer_details(b))


def pass_rates_by_group(trajs: Sequence[Trajectory], verdicts: Sequence[Sequence[Verdict]],
                        rounds: int) -> tuple[dict[str, PassRate], PassRate]:
    """Per-group pass rates (groups in first-seen order; no group is ``all``) and their average."""
    groups: dict[str, list[list[str]]] = {}
    for traj, row in zip(trajs, verdicts):
        groups.setdefault(traj.group or "all", []).append([v.label for v in row])
    rates = {g: pass_rate(labels, rounds) for g, labels in groups.items()}
    return rates, average_pass_rate(list(rates.values()))
