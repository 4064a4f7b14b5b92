"""StableToolBench solvable win rate (SoWR): candidate against reference, as its evaluator computes it.

StableToolBench ``toolbench/tooleval/eval_preference.py`` with ``BaseEvaluator.annotate_preference``
(``evaluators/registered_cls/base.py``) and ``normalized_openai_completions`` /
``select_better_answer`` (``rtl.py``), per query and round:

- a query missing from the reference run is the candidate's, one point each round (and the other
  way round: StableToolBench then fails while writing its CSV, before any rate);
- both answers are cut first (``process_answer``: the final answer to its first 1,000
  characters, the ``method`` field dropped) and put in a random order (``random.shuffle``;
  here a stream seeded by ``judge.seed``, the query and the round);
- each answer's solved status is judged again in every round (the pass-rate results it reads are
  never used: the CSV cell holds the text of a dict); the rule is the pass rate's without the
  Finish check (an empty ``final_answer`` or ``give_up_and_restart`` in the cut text), then the
  judge's two stages, without asking for a reason;
- exactly one Solved answer wins; two Solved are compared; with no Solved, exactly one Unsure wins
  without a comparison; two Unsure or two Unsolved (by the judge or the rule) are compared;
- a comparison of two identical answers (same final answer, same ``str(answer_details)``) is a
  random pick without a judge call; otherwise the judge sees both cut answers as JSON in the
  shuffled order and names an ``index``;
- each round gives one point; a query goes to the run with more points (so 3 rounds never tie);
  win / lose / tie rates are shares of the group's queries.

Not reproduced: ``check_task_solvable``, which StableToolBench asks before some comparisons and
whose answer its comparison prompt never reads; its global random stream (ours is seeded per query
and round, so a rerun or a subset gives the same draws). A comparison whose reply cannot be read
after the judge's retries (StableToolBench raises) is a seeded random pick, counted in
``WinRate.undecided``.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.eval.stabletoolbench import answer_json, converted_answer, judge_statuses
from codetool.judge.records import CompareRequest, Judge
from codetool.search.records import Trajectory

logger = logging.getLogger(__name__)

ANSWER_CUT = 1000  # process_answer: final_answer[:1000]
RUNS = ("reference", "candidate")  # the order eval_preference.py passes the two answers in


@dataclass
class PairCount:
    """Round wins of one query in a candidate-vs-reference comparison.

    Args:
        candidate, reference (`int`): rounds won by each run.
        judged (`int`): rounds decided by a judge comparison.
        round_winners (`list[str]`): the run that got each round's point, in round order.
    """

    candidate: int = 0
    reference: int = 0
    judged: int = 0
    round_winners: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """``win`` (for the candidate), ``lose`` or ``tie``."""
        if self.candidate > self.reference:
            return "win"
        return "lose" if self.reference > self.candidate else "tie"


@dataclass
class WinRate:
    """Candidate-vs-reference win rate: ``win + lose + tie == 1`` over ``n`` queries.

    ``random_picks`` counts rounds decided by a random pick between identical answers;
    ``undecided`` counts comparisons whose reply could not be read (a seeded random pick).
    """

    win: float
    lose: float
    tie: float
    n: int
    per_query: dict[str, PairCount] = field(default_factory=dict)
    random_picks: int = 0
    undecided: int = 0


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


def preference_answer(traj: Trajectory) -> dict[str, Any]:
    """``process_answer`` of ``traj``'s converted answer: the final answer cut to 1,000 characters,
    ``method`` dropped (the chain is a one-node list, so its ``[:3000]`` cut changes nothing)."""
    answer = dict(converted_answer(traj))
    answer["final_answer"] = (answer.get("final_answer") or "")[:ANSWER_CUT]
    answer["answer_details"] = answer["answer_details"][:3000]
    answer.pop("method", None)
    return answer


def _identical(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """``check_identity_answers``: same final answer and the same ``str()`` of the chain."""
    return a["final_answer"] == b["final_answer"] and str(a["answer_details"]) == str(b["answer_details"])


def _stream(seed: int, qid: str, round: int) -> random.Random:
    return random.Random(f"{seed}|{qid}|{round}")


def compare_runs(candidate: Mapping[str, Trajectory], reference: Mapping[str, Trajectory], judge: Judge | None,
                 rounds: int = 3, *, query_ids: Sequence[str] | None = None, seed: int = 0,
                 max_details_chars: int = 0, blank_finish: str = "judge") -> WinRate:
    """SoWR of ``candidate`` against ``reference`` (both keyed by query id) as StableToolBench
    computes it (see the module docstring).

    Args:
        query_ids (`Sequence[str]`, *optional*): the test ids (default: every id of either run).
        seed (`int`, *optional*, defaults to 0): seed of the shuffles and random picks.
        max_details_chars (`int`, *optional*, defaults to 0): cut each whole answer (JSON) shown to
            the judge to this many characters (0: never, as StableToolBench).
        blank_finish (`str`, *optional*, defaults to `"judge"`): ``unsolved`` rules a blank answer
            out without a judge call (ours); ``judge`` is StableToolBench's.

    Raises:
        CodetoolError: an answer needs the judge but ``judge`` is ``None``.
    """
    ids = list(query_ids) if query_ids is not None else sorted(set(candidate) | set(reference), key=str)
    counts = {qid: PairCount() for qid in ids}
    both = [q for q in ids if q in candidate and q in reference]
    answers = {q: (preference_answer(reference[q]), preference_answer(candidate[q])) for q in both}
    picks = undecided = 0
    for r in range(rounds):
        for qid in ids:  # eval_preference.py: a missing query is the other run's without a judge
            if qid not in reference or qid not in candidate:
                _point(counts[qid], "candidate" if qid not in reference else "reference")
        order = {}
        for qid in both:
            order[qid] = [0, 1]
            _stream(seed, qid, r).shuffle(order[qid])
        items = [(reference[q].query, answers[q][i], r) for q in both for i in order[q]]
        statuses = judge_statuses(items, judge, finish_check=False, reason=False, max_details_chars=max_details_chars,
                                  blank_finish=blank_finish)
        asks = []  # (qid, rng) of the pairs that go to a comparison
        for k, qid in enumerate(both):
            labels = [statuses[2 * k].label, statuses[2 * k + 1].label]  # in the shuffled order
            solved = [i for i, label in enumerate(labels) if label == "Solved"]
            unsure = [i for i, label in enumerate(labels) if label == "Unsure"]
            if len(solved) == 1 or (not solved and len(unsure) == 1):
                _point(counts[qid], RUNS[order[qid][(solved or unsure)[0]]])
                continue
            first, second = (answers[qid][i] for i in order[qid])
            if _identical(first, second):
                _point(counts[qid], RUNS[order[qid][_stream(seed, f"pick|{qid}", r).choice([0, 1])]])
                picks += 1
                continue
            asks.append(qid)
        if asks and judge is None:
            raise CodetoolError(f"{len(asks)} answer pairs need a judge for the win rate, but none is configured.")
        requests = []
        for qid in asks:
            first, second = (answers[qid][i] for i in order[qid])
            requests.append(CompareRequest(reference[qid].query, first["final_answer"], second["final_answer"], r,
                                           details_a=answer_json(first, max_details_chars),
                                           details_b=answer_json(second, max_details_chars), allow_tie=False))
        prefs = judge.compare_many(requests) if requests and judge is not None else []
        for qid, pref in zip(asks, prefs):
            if pref.winner in ("a", "b"):
                counts[qid].judged += 1
                shown = 0 if pref.winner == "a" else 1
            else:  # unreadable after the judge's retries: a seeded pick (StableToolBench would raise)
                undecided += 1
                shown = _stream(seed, f"undecided|{qid}", r).choice([0, 1])
            _point(counts[qid], RUNS[order[qid][shown]])
    result = win_rate_from_counts(counts)
    result.random_picks, result.undecided = picks, undecided
    if undecided:
        logger.warning("SoWR: %d comparisons could not be read; a seeded random pick decided them", undecided)
    return result


def _point(count: PairCount, who: str) -> None:
    setattr(count, who, getattr(count, who) + 1)
    count.round_winners.append(who)


def win_rates(runs: Sequence, reference, judge: Judge, rounds: int, *, skip: Sequence[str] = (), seed: int = 0,
              max_details_chars: int = 0, blank_finish: str = "judge") -> dict[str, Any]:
    """SoWR of each run of ``runs`` against ``reference`` (:class:`codetool.eval.runs.Run`), per
    benchmark and group (:func:`compare_runs`; the keyword arguments are its own); a group the
    reference did not run is left out.

    Args:
        skip (`Sequence[str]`, *optional*): benchmarks without a win rate (RestBench-TMDB).

    Returns:
        ``{"<method> vs <reference>": {benchmark: {"groups": {group: {"win", "lose", "tie", "n",
        "judged_pairs", "random_picks", "undecided", "round_winners"}}, "average": {"win", "lose",
        "tie"}}}}`` (the average is the mean of the group rates).
    """
    def pick(run, bench: str, group: str) -> dict[str, Trajectory]:
        return {t.query_id: t for t in run.trajectories if t.benchmark == bench and (t.group or "all") == group}

    out: dict[str, Any] = {}
    for run in runs:
        if run is reference:
            continue
        result: dict[str, Any] = {}
        for bench in dict.fromkeys(t.benchmark for t in run.trajectories if t.benchmark not in skip):
            groups: dict[str, dict[str, Any]] = {}
            for group in dict.fromkeys(t.group or "all" for t in run.trajectories if t.benchmark == bench):
                cand, ref = pick(run, bench, group), pick(reference, bench, group)
                if not ref:
                    continue
                win = compare_runs(cand, ref, judge, rounds, seed=seed, max_details_chars=max_details_chars,
                                   blank_finish=blank_finish)
                groups[group] = {"win": win.win, "lose": win.lose, "tie": win.tie, "n": win.n,
                                 "judged_pairs": sum(c.judged for c in win.per_query.values()),
                                 "random_picks": win.random_picks, "undecided": win.undecided,
                                 "round_winners": {q: c.round_winners for q, c in win.per_query.items()}}
            if groups:
                average = {k: sum(g[k] for g in groups.values()) / len(groups) for k in ("win", "lose", "tie")}
                result[bench] = {"groups": groups, "average": average}
        if result:
            out[f"{run.method} vs {reference.method}"] = result
    return out
