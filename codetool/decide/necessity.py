"""Tool-necessity labels from a run without tools (When2Tool's labelling rule).

When2Tool labels a task *tool-necessary* when the model fails it without tools: each training
task is run with tool calls refused, and the answer is checked. We run each query once through
the router's direct route (``prompts/decide_answer.txt``: answer directly, no functions offered,
greedy) and decide "fails without tools" by one rule per benchmark (:data:`DEFAULT_RULES`):

- ``judge`` (StableToolBench, RestBench-TMDB, ToolBench examples: no reference answers exist,
  the answer depends on live API data): the pass-rate judge (:mod:`codetool.judge`) labels
  the no-tool answer on the query, one round; ``Solved`` means it needs no tool, ``Unsure`` and
  ``Unsolved`` mean it does;
- ``reference`` (When2Tool's tasks, our tool-free queries that carry an answer): a grounded check
  of the reply against the reference answer (:func:`grounded_match`); no judge;
- ``given`` (our tool-free queries; or any benchmark when no run is wanted): the label by
  construction (tool-free queries need none, benchmark queries need one); nothing runs.

:func:`label_items` writes ``labels.jsonl`` one batch at a time and skips ids already there, so a
killed run resumes. Limits: one sample and one judge round per query (When2Tool runs each no-tool
task once too); a weak judge (the embedded model) makes weak labels, and the report says so.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from codetool import CodetoolError
from codetool.decide.labelled import DecisionItem
from codetool.decide.metrics import answer_matches
from codetool.decide.stage import answer_messages
from codetool.jsonl import append_jsonl, read_jsonl
from codetool.progress import ProgressFactory, ticker
from codetool.secrets import redact

if TYPE_CHECKING:
    from codetool.judge.records import Judge
    from codetool.models.completion import LLMBackend

logger = logging.getLogger(__name__)

RULES = ("judge", "reference", "given")
DEFAULT_RULES = {"stabletoolbench": "judge", "restbench-tmdb": "judge", "toolbench": "judge",
                 "tool_free": "given", "when2tool": "reference"}


@dataclass
class NecessityLabel:
    """One line of ``labels.jsonl``.

    Args:
        id (`str`): the item id. benchmark (`str`), group (`str`): where it comes from.
        needs_tool (`bool`): the label: the query fails without tools.
        rule (`str`): ``judge``, ``reference`` or ``given``.
        no_tool_answer (`str`, *optional*): the reply of the run without tools (``None`` for ``given``).
        verdict (`str`, *optional*): the judge's label, or ``match``/``no_match`` for ``reference``.
        tokens (`int`): tokens the no-tool run read and wrote.
    """

    id: str
    benchmark: str
    group: str
    needs_tool: bool
    rule: str
    no_tool_answer: str | None = None
    verdict: str | None = None
    tokens: int = 0


_BOXED = re.compile(r"\\boxed\{")
_NUM = re.compile(r"^[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?$")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or ``None``."""
    starts = [m.end() for m in _BOXED.finditer(text or "")]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return text[start:].strip()


def _norm(text: str) -> str:
    text = re.sub(r"\\(text|mathrm)\{([^}]*)\}", r"\2", text.strip().strip("$").strip())
    return " ".join(text.replace(",", "").lower().split()).strip(" .'\"")


def grounded_match(reply: str, answer: str) -> bool:
    """Whether ``reply`` gives the reference ``answer`` (a check against data, not a judge).

    A boxed reply (``\\boxed{...}``, When2Tool's answer format) must equal the answer after
    normalising case, spaces, thousands separators, quotes and ``\\text{}`` (numbers compare as
    numbers, relative tolerance 1e-6); any other reply goes through the lenient whole-word match
    of :func:`codetool.decide.metrics.answer_matches`.
    """
    got = boxed(reply)
    if got is None:
        return answer_matches(reply, answer)
    a, b = _norm(got), _norm(str(answer))
    if _NUM.match(a) and _NUM.match(b):
        x, y = float(a), float(b)
        return abs(x - y) <= 1e-6 * max(1.0, abs(y))
    return a == b


def rule_for(item: DecisionItem, rules: dict[str, str]) -> str:
    """The labelling rule of ``item`` (``reference`` falls back to ``given`` without an answer)."""
    rule = rules.get(item.benchmark, DEFAULT_RULES.get(item.benchmark, "judge"))
    if rule not in RULES:
        raise CodetoolError(f"labelling rule for {item.benchmark} must be one of {RULES}, got {rule!r}.")
    if rule == "reference" and not item.answer:
        return "given"
    return rule


def label_items(items: Sequence[DecisionItem], policy: LLMBackend, judge: Judge | None, out: str | Path, *,
                rules: dict[str, str] | None = None, max_new_tokens: int = 160, batch_size: int = 16,
                seed: int | None = 0, progress: ProgressFactory | None = None) -> dict[str, NecessityLabel]:
    """Label every item by its rule, appending to ``out`` (JSONL) and resuming from it.

    Args:
        items (`Sequence[DecisionItem]`): the queries (``benchmark``, ``answer`` and ``needs_tool`` are read).
        policy (`LLMBackend`): answers without tools.
        judge (`Judge` or `None`): decides ``judge``-rule items (``None`` is refused when one needs it).
        out (`str` or `Path`): ``labels.jsonl``; ids already in it are not run again.
        rules (`dict`, *optional*): benchmark -> rule, over :data:`DEFAULT_RULES`.
        progress (`ProgressFactory`, *optional*): told the number of no-tool batches, ticked after
            each (:mod:`codetool.progress`).
    Returns:
        Labels by item id (earlier lines included).
    Raises:
        CodetoolError: an item needs a judge and ``judge`` is ``None``.
    """
    from codetool.judge.records import AnswerRequest

    rules = {**DEFAULT_RULES, **(rules or {})}
    out = Path(out)
    done = {r["id"]: NecessityLabel(**r) for r in read_jsonl(out)} if out.is_file() else {}
    todo = [it for it in items if it.item_id not in done]
    if judge is None and any(rule_for(it, rules) == "judge" for it in todo):
        raise CodetoolError("labelling StableToolBench, RestBench or ToolBench queries needs a judge (rule judge): "
                            "set --judge.model (default: the embedded model, weak), or label them by construction "
                            "with --label_benchmarks given.")
    given = [it for it in todo if rule_for(it, rules) == "given"]
    for it in given:
        done[it.item_id] = NecessityLabel(it.item_id, it.benchmark, it.group, it.needs_tool, "given")
        append_jsonl(out, asdict(done[it.item_id]))
    run = [it for it in todo if rule_for(it, rules) != "given"]
    starts = range(0, len(run), batch_size)
    tick = ticker(progress if len(starts) > 1 else None, len(starts))
    for first in starts:
        batch = run[first:first + batch_size]
        replies = policy.generate([answer_messages(it.query) for it in batch], n=1, temperature=0.0,
                                  max_new_tokens=max_new_tokens, seed=seed)
        texts = [redact(c.text.strip()) for [c] in replies]
        need_judge = [i for i, it in enumerate(batch) if rule_for(it, rules) == "judge"]
        verdicts = dict(zip(need_judge, judge.judge_answers([AnswerRequest(batch[i].query, texts[i])
                                                             for i in need_judge]))) if need_judge and judge else {}
        for i, (it, [c]) in enumerate(zip(batch, replies, strict=True)):
            if i in verdicts:
                verdict = verdicts[i].label
                needs = verdict != "Solved"
            else:
                ok = grounded_match(texts[i], it.answer or "")
                verdict, needs = ("match" if ok else "no_match"), not ok
            done[it.item_id] = NecessityLabel(it.item_id, it.benchmark, it.group, needs, rule_for(it, rules),
                                              texts[i], verdict, c.prompt_tokens + c.completion_tokens)
            append_jsonl(out, asdict(done[it.item_id]))
        tick(len(batch))
    return done


DRAW_KEYS = ("data", "groups", "n_tool", "n_restbench", "n_toolbench", "n_free", "free_queries", "seed",
             "when2tool", "when2tool_envs")


def draw_items(cfg) -> tuple[list[DecisionItem], dict[str, int]]:
    """The queries of ``codetool train-probe`` (and of ``eval-decision`` on a probe's held-out part):
    :func:`~codetool.decide.labelled.build_items` plus the When2Tool tasks of ``cfg.when2tool``.
    ``cfg`` has the :data:`DRAW_KEYS` (missing ones count as empty)."""
    from codetool.decide.labelled import build_items
    from codetool.decide.when2tool import load_when2tool

    items, skipped = build_items(cfg.groups, cfg.n_tool, cfg.n_free, seed=cfg.seed, data=cfg.data,
                                 free_queries=cfg.free_queries, n_restbench=getattr(cfg, "n_restbench", 0),
                                 n_toolbench=getattr(cfg, "n_toolbench", 0))
    if getattr(cfg, "when2tool", ""):
        items += load_when2tool(cfg.when2tool, getattr(cfg, "when2tool_envs", "") or None)
    ids = [it.item_id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CodetoolError(f"query id {dup!r} occurs twice among the drawn queries; ids must be unique.")
    return items, skipped
