"""StableToolBench solvable pass rate (SoPR) as its evaluator computes it, and CodeTool's variant.

Every answer is read as StableToolBench's evaluator reads it: the answer of its converted-answer
entry (:func:`converted_answer`, codetool's export :func:`codetool.eval.convert.trajectory_to_converted`;
an imported converted answer exports back to itself). ``final_answer`` there is the raw field,
ToolBench's JSON text ``{"return_type": ..., "final_answer": ...}`` for our runs.

``judge.protocol: stabletoolbench`` (``toolbench/tooleval/eval_pass_rate.py`` with
``check_is_solved`` of ``evaluators/registered_cls/rtl.py``), per query and round:

- **Unsolved without a judge call** when the last tool node with a non-empty message (as
  ``utils.get_steps`` walks the chain: only nodes that have a ``next`` key are read) does not
  contain ``'name': 'Finish'`` in its text (a dict message reads as ``str(dict)``; JSON text with
  double quotes does not match), when ``final_answer`` is exactly ``""``, or when it contains
  ``give_up_and_restart`` (case-sensitive, anywhere). A JSON text with an empty or blank inner
  answer, or a blank string, goes to the judge (``blank_finish="judge"``, the functions' default
  and ``configs/eval/stabletoolbench.yaml``'s); ``judge.blank_finish: unsolved``, the config's
  default (ours), rules such a blank finish Unsolved without a call.
- otherwise the judge labels the query and ``final_answer`` (stage one, StableToolBench's
  ``check_answer_status``) and an **Unsure** answer is judged again from the whole answer as
  JSON (``json.dumps(answer)``: method, total steps, final answer and the chain; stage two,
  ``parse_answer_status``); the second label stands.
- scores Solved 1, Unsure 0.5, Unsolved 0. The rate of round ``r`` is the sum of scores over the
  group's queries divided by their number (a query without a verdict in round ``r`` scores 0);
  the reported rate is the mean over rounds and the spread their population standard deviation
  (``numpy.std``). The average over groups (the papers' "Avg." column) is the mean of the group
  rates, round by round.

``judge.protocol: codetool`` is CodeTool's ``eval/eval_pass_rate.py``: every trajectory is judged
once per round on the query and its final answer text (no rule, no second stage), Unsure 0.5,
Unsolved 0, anything else 1; its group rate (:func:`codetool_pass_rate`) skips the queries whose
id contains one of its ``Filter_Map`` ids but still divides by every query.

The win rate (SoWR) is in :mod:`codetool.eval.preference`. :func:`evaluate` gives ``codetool eval``
its sections of every benchmark but RestBench-TMDB (whose :func:`codetool.eval.restbench.evaluate`
adds the path metrics to the same numbers).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from codetool import CodetoolError
from codetool.eval.metrics import answer_source, not_executed_trajectory, run_metrics
from codetool.judge.records import LABEL_SCORES, LABELS, AnswerRequest, Judge, Verdict
from codetool.search.records import Trajectory
from codetool.secrets import redact
from codetool.text import clip

logger = logging.getLogger(__name__)

GIVE_UP_MARK = "give_up_and_restart"  # ToolBench's give-up return type, also inside answer texts


def converted_answer(traj: Trajectory) -> dict[str, Any]:
    """The ``answer`` of ``traj``'s converted-answer entry (``method``, ``total_steps``,
    ``final_answer``, ``answer_details``): what StableToolBench's evaluator judges."""
    from codetool.eval.convert import trajectory_to_converted

    return trajectory_to_converted(traj)["answer"]


def final_step(answer: Mapping[str, Any]) -> str:
    """``utils.get_steps``' final step of a converted answer: ``"Final step: <message>"`` of the
    last ``tool`` node with a non-empty message, walking the chain while a node has a ``next`` key
    (``""`` when there is none)."""
    details = answer.get("answer_details") or []
    if not details:
        return ""
    node, final = details[0], ""
    while "next" in node:
        message = node.get("message")
        if message and node.get("role") == "tool":
            final = f"Final step: {message}"
        if not node["next"]:
            break
        node = node["next"][0]
    return final


def blank_answer(text: str) -> bool:
    """Whether a converted ``final_answer`` holds no answer: blank text, or ToolBench's JSON text of
    a ``give_answer`` whose inner answer is blank (a ``finish("")`` or ``finish("   ")``)."""
    if not text.strip():
        return True
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return (isinstance(data, dict) and data.get("return_type", "give_answer") == "give_answer"
            and not str(data.get("final_answer", "")).strip())


def reference_rule(answer: Mapping[str, Any], *, finish_check: bool = True,
                   blank_finish: str = "judge") -> Verdict | None:
    """StableToolBench's Unsolved-without-a-judge rule on a converted answer, else ``None``.

    Args:
        answer (`Mapping`): the converted answer (see :func:`converted_answer`).
        finish_check (`bool`, *optional*, defaults to `True`): ``eval_pass_rate.py``'s check that
            the final step is a Finish call (its preference run has none).
        blank_finish (`str`, *optional*, defaults to `"judge"`): ``judge`` (StableToolBench: only an
            exactly empty ``final_answer`` is ruled out, so a blank answer's JSON text is judged) or
            ``unsolved`` (ours, ``judge.blank_finish``: a blank answer is Unsolved without a call).
    """
    if finish_check and "'name': 'Finish'" not in final_step(answer):
        return Verdict("Unsolved", "the answer's last tool step is not a Finish call", "rule")
    text = answer.get("final_answer") or ""
    if text == "" or (blank_finish == "unsolved" and blank_answer(text)):
        return Verdict("Unsolved", "empty final answer", "rule")
    if GIVE_UP_MARK in text:
        return Verdict("Unsolved", "the answer gives up", "rule")
    return None


def rule_verdict(traj: Trajectory) -> Verdict | None:
    """:func:`reference_rule` of ``traj``'s converted answer (the pass rate's rule)."""
    return reference_rule(converted_answer(traj))


def answer_json(answer: Mapping[str, Any], max_chars: int = 0) -> str:
    """``json.dumps(answer)`` as StableToolBench shows a whole answer to its judge (ASCII escapes,
    its separators), secrets redacted, cut to ``max_chars`` when that is set (0: never)."""
    text = redact(json.dumps(answer))
    return clip(text, max_chars) if max_chars else text


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


def judge_statuses(items: Sequence[tuple[str, Mapping[str, Any], int]], judge: Judge | None, *,
                   finish_check: bool, reason: bool = True, max_details_chars: int = 0,
                   blank_finish: str = "judge") -> list[Verdict]:
    """StableToolBench's ``check_is_solved`` on each ``(query, converted answer, round)``: the rule
    (:func:`reference_rule`), then stage one on the final answer, then stage two on the whole
    answer for the Unsure ones; one judge batch per stage.

    Args:
        finish_check (`bool`): apply the pass rate's Finish check (the preference run does not).
        reason (`bool`, *optional*, defaults to `True`): ask the judge for a reason (the pass rate
            does; the preference run's status checks do not).
        max_details_chars (`int`, *optional*, defaults to 0): cut stage two's JSON (0: never).
        blank_finish (`str`, *optional*, defaults to `"judge"`): see :func:`reference_rule`.

    Raises:
        CodetoolError: an answer needs a judge but ``judge`` is ``None``.
    """
    out: list[Verdict | None] = [reference_rule(a, finish_check=finish_check, blank_finish=blank_finish)
                                 for _, a, _ in items]
    todo = [i for i, v in enumerate(out) if v is None]
    if todo and judge is None:
        raise CodetoolError(f"{len(todo)} answers need a judge, but none is configured; set --judge.model "
                            f"(a local model or an http(s):// server).")
    first = judge.judge_answers([AnswerRequest(items[i][0], items[i][1].get("final_answer") or "", None,
                                               items[i][2], reason) for i in todo]) if todo and judge else []
    unsure = []
    for i, verdict in zip(todo, first):
        out[i] = verdict
        if verdict.label == "Unsure":
            unsure.append(i)
    if unsure and judge is not None:  # a judge gave the first verdicts
        second = judge.judge_answers([AnswerRequest(items[i][0], items[i][1].get("final_answer") or "",
                                                    answer_json(items[i][1], max_details_chars), items[i][2],
                                                    reason) for i in unsure])
        for i, verdict in zip(unsure, second):
            verdict.source = "trajectory"
            out[i] = verdict
    return out  # type: ignore[return-value]


def judge_pass(trajs: Sequence[Trajectory], judge: Judge | None, rounds: int = 3, *,
               max_trajectory_chars: int = 0, protocol: str = "stabletoolbench",
               blank_finish: str = "judge") -> list[list[Verdict]]:
    """Pass-rate verdicts: ``(len(trajs), rounds)``, one :class:`Verdict` per trajectory and round
    (see the module docstring for the two protocols).

    Args:
        max_trajectory_chars (`int`, *optional*, defaults to 0): cut stage two's JSON to this many
            characters (0: never, as StableToolBench).
        blank_finish (`str`, *optional*, defaults to `"judge"`): see :func:`reference_rule`.

    Raises:
        CodetoolError: a trajectory needs a judge but ``judge`` is ``None``.
    """
    if protocol == "codetool":
        if trajs and judge is None:
            raise CodetoolError(f"{len(trajs)} answers need a judge for the pass rate, but none is configured; "
                                f"set --judge.model (a local model or an http(s):// server).")
        flat = judge.judge_answers([AnswerRequest(t.query, t.final_answer or "", None, r)
                                    for t in trajs for r in range(rounds)]) if trajs and judge else []
        return [flat[i * rounds:(i + 1) * rounds] for i in range(len(trajs))]
    items = [(t.query, converted_answer(t), r) for t in trajs for r in range(rounds)]
    flat = judge_statuses(items, judge, finish_check=True, max_details_chars=max_trajectory_chars,
                          blank_finish=blank_finish)
    return [flat[i * rounds:(i + 1) * rounds] for i in range(len(trajs))]


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
    counts: Counter[str] = Counter()
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


def codetool_pass_rate(query_ids: Sequence[str], labels: Sequence[Sequence[str]], rounds: int,
                       filter_ids: Sequence[str] = ()) -> PassRate:
    """CodeTool's ``calculate_pass_rate`` per round: Unsure 0.5, Unsolved 0, anything else 1, summed
    over the queries whose id contains none of ``filter_ids`` (its ``Filter_Map`` of the test set,
    a substring test), divided by **every** query. Without filter ids it is :func:`pass_rate`.

    Args:
        query_ids (`Sequence[str]`): (n,) the group's query ids; labels (`Sequence`): (n, rounds).
        filter_ids (`Sequence[str]`, *optional*): the ids CodeTool leaves out of the sum.
    """
    skipped = {q for q in query_ids if any(f in str(q) for f in filter_ids)}
    kept = [[label.lower() for label in row] for q, row in zip(query_ids, labels) if q not in skipped]
    per_round = []
    for r in range(rounds):
        total = sum(0.5 if row[r] == "unsure" else 0.0 if row[r] == "unsolved" else 1.0 for row in kept if r < len(row))
        per_round.append(total / len(query_ids) if query_ids else 0.0)
    counts = Counter(label for row in labels for label in row)
    return PassRate(float(np.mean(per_round)), float(np.std(per_round)), per_round, len(query_ids),
                    {label: counts.get(label, 0) for label in LABELS})


def pass_rates_by_group(trajs: Sequence[Trajectory], verdicts: Sequence[Sequence[Verdict]],
                        rounds: int) -> tuple[dict[str, PassRate], PassRate]:
    """Per-group pass rates (groups in first-seen order; no group is ``all``) and their average."""
    groups: dict[str, list[list[str]]] = {}
    for traj, row in zip(trajs, verdicts):
        groups.setdefault(traj.group or "all", []).append([v.label for v in row])
    rates = {g: pass_rate(labels, rounds) for g, labels in groups.items()}
    return rates, average_pass_rate(list(rates.values()))


def judge_runs(runs: Sequence, judge: Judge | None, rounds: int, *, max_trajectory_chars: int = 0,
               protocol: str = "stabletoolbench", blank_finish: str = "judge"
               ) -> tuple[dict[str, list[list[str]] | None], list[dict[str, Any]], int]:
    """Pass-rate verdicts of every trajectory of ``runs`` (:class:`codetool.eval.runs.Run`;
    :func:`judge_pass`, the keyword arguments are its own); without a judge, none.

    Returns:
        The labels by method (``(trajectories, rounds)``, or ``None`` without a judge), one
        ``verdicts.jsonl`` row per trajectory (labels, sources, reasons, and errors where a request
        failed) and the number of replies that could not be read.
    """
    labels: dict[str, list[list[str]] | None] = {}
    rows: list[dict[str, Any]] = []
    parse_failures = 0
    for run in runs:
        verdicts = judge_pass(run.trajectories, judge, rounds, max_trajectory_chars=max_trajectory_chars,
                              protocol=protocol, blank_finish=blank_finish) if judge else None
        labels[run.method] = [[v.label for v in row] for row in verdicts] if verdicts else None
        for i, traj in enumerate(run.trajectories):
            row = verdicts[i] if verdicts else []
            parse_failures += sum(v.parse_failed for v in row)
            rows.append({"method": run.method, "benchmark": traj.benchmark, "group": traj.group,
                         "query_id": traj.query_id, "finish_type": traj.finish_type,
                         "answer_source": answer_source(traj),
                         "labels": [v.label for v in row], "sources": [v.source for v in row],
                         "reasons": [v.reason for v in row],
                         **({"errors": [v.error for v in row]} if any(v.error for v in row) else {})})
    return labels, rows, parse_failures


def pass_summary(trajs: Sequence[Trajectory], labels: Sequence[Sequence[str]] | None, rounds: int) -> dict[str, Any]:
    """The report's numbers of one method on one group (or all of a benchmark): ``n``, the
    judge-free ``metrics`` (:func:`codetool.eval.metrics.run_metrics`), the ``pass_rate`` and the
    pass rate by where the final answer came from (finish / generated / none); the rates are
    ``None`` and absent without labels."""
    out: dict[str, Any] = {"n": len(trajs), "metrics": asdict(run_metrics(trajs))}
    out["pass_rate"] = asdict(pass_rate(labels, rounds)) if labels is not None else None
    if labels is not None:
        sources: dict[str, list[int]] = {}
        for i, traj in enumerate(trajs):
            sources.setdefault(answer_source(traj), []).append(i)
        out["pass_rate_by_answer_source"] = {src: asdict(pass_rate([labels[i] for i in idx], rounds))
                                             for src, idx in sorted(sources.items())}
    return out


def evaluate(runs: Sequence, labels: Mapping[str, Sequence[Sequence[str]] | None], rounds: int,
             benchmarks: Sequence[str], *, filters: Callable[[str], list[str] | None] | None = None,
             extra: Callable[[list[Trajectory], list | None], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's sections of ``benchmarks`` in StableToolBench's terms: per method (in the order
    of ``runs``) and group (first-seen order; no group is ``all``), :func:`pass_summary`; ``overall``
    holds the average of the group rates as ``pass_rate`` (the papers' "Avg.") and the rate over all
    queries as ``pass_rate_pooled``.

    Args:
        runs (`Sequence[Run]`): the runs shown; labels (`Mapping`): :func:`judge_runs`'s labels.
        benchmarks (`Sequence[str]`): the benchmarks scored here (the trajectories' ``benchmark``).
        filters (`Callable`, *optional*): CodeTool's ``Filter_Map`` ids of a group (the codetool
            protocol): a group with ids also gets ``pass_rate_codetool`` (:func:`codetool_pass_rate`).
        extra (`Callable`, *optional*): more numbers of a set of trajectories and their labels
            (RestBench's path metrics, :func:`codetool.eval.restbench.evaluate`).

    Returns:
        ``{benchmark: {"methods": {method: {"groups": {...}, "overall": {...}}}}}``, benchmarks in
        first-seen order. An episode that ended because the executor could run none of a step's
        candidates (:func:`codetool.eval.metrics.not_executed_trajectory`, a failure of the machine)
        is left out of every number (``n`` and the rates) and counted as ``not_executed``.
    """
    def summary(trajs: list[Trajectory], lab: list | None) -> dict[str, Any]:
        return {**pass_summary(trajs, lab, rounds), **(extra(trajs, lab) if extra else {})}

    out: dict[str, Any] = {}
    for run in runs:
        for bench in dict.fromkeys(t.benchmark for t in run.trajectories if t.benchmark in benchmarks):
            every = [i for i, t in enumerate(run.trajectories) if t.benchmark == bench]
            idx = [i for i in every if not not_executed_trajectory(run.trajectories[i])]
            kept = set(idx)
            lost = Counter(run.trajectories[i].group or "all" for i in every if i not in kept)
            trajs = [run.trajectories[i] for i in idx]
            every_label = labels[run.method]
            lab = [every_label[i] for i in idx] if every_label is not None else None
            by_group: dict[str, list[int]] = {}
            for i, traj in enumerate(trajs):
                by_group.setdefault(traj.group or "all", []).append(i)
            groups = {}
            for group, members in by_group.items():
                sub = [lab[i] for i in members] if lab is not None else None
                groups[group] = {**summary([trajs[i] for i in members], sub), "not_executed": lost[group]}
                ids = filters(group) if sub is not None and filters else None
                if ids and sub is not None:  # CodeTool's own formula: its Filter_Map ids leave the sum, not the count
                    groups[group]["pass_rate_codetool"] = asdict(codetool_pass_rate(
                        [trajs[i].query_id for i in members], sub, rounds, ids))
            overall = {**summary(trajs, lab), "not_executed": sum(lost.values())}
            if lab is not None:
                overall["pass_rate_pooled"] = overall["pass_rate"]
                overall["pass_rate"] = asdict(average_pass_rate(
                    [pass_rate([lab[i] for i in m], rounds) for m in by_group.values()]))
            out.setdefault(bench, {"methods": {}})["methods"][run.method] = {"groups": groups, "overall": overall}
    return out
