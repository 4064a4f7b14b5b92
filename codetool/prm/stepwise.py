"""TRL's stepwise-supervision layout: export our PRM rows to it, and read it back.

A stepwise-supervision dataset (TRL's dataset format of that name; the layout of Math-Shepherd
and of the ``trl.PRMTrainer`` that TRL shipped from 0.13 to 1.13 and removed in 1.14) has one row
per step sequence: ``prompt`` (text), ``completions`` (the steps, text) and ``labels`` (one bool
per step). ``codetool train-prm`` is the maintained trainer for this layout: ``train-prm`` and
``eval-prm`` read it directly (:func:`codetool.prm.data.read_rows` calls :func:`from_stepwise`).

Reading (:func:`from_stepwise`): step ``i`` of a row is a candidate, steps ``0..i-1`` its history,
``labels[i]`` its label, so a row of ``n`` steps is ``n`` PRM example rows (DESIGN.md §3); a step
written as our export writes it (a fenced Python block, then ``Output:``) is split into code and
output, any other text is the step's code with no output. A row that carries ``candidate_index``
(our export does) yields that one step only.

Writing (:func:`to_stepwise`): each PRM example row (one candidate after a history of chosen
steps) becomes one sequence: the history steps with their outputs, then the candidate without
its output (what the PRM sees). A history step's label is the label of the row in which that
step was the candidate (same query, same earlier steps, same code); a history step without such
a row counts as positive, since the search expanded it. Rows keep ``query``, ``query_id``,
``source``, ``latent_reward``, ``candidate_output`` and ``candidate_index``, so reading the
export gives back the rows it was written from.

    python -m codetool.prm.stepwise data/prm/prm_examples.jsonl data/prm/prm_stepwise.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import re

from codetool import CodetoolError
from codetool.prm.data import query_key

logger = logging.getLogger(__name__)

STEPWISE_KEYS = ("prompt", "completions", "labels")
_STEP = re.compile(r"\A(?:(?P<plan>.*?)\n)?```python\n(?P<code>.*?)\n```(?:\nOutput:\n(?P<output>.*))?\Z", re.DOTALL)
_KEPT = ("query_id", "source", "latent_reward", "candidate_output")


def _step_text(code: str, output: str | None = None, plan: str = "") -> str:
    """A step as text: the plan line, the code in a fenced block, then its output (none: not shown)."""
    text = f"{plan}\n```python\n{code}\n```" if plan else f"```python\n{code}\n```"
    return text if output is None else f"{text}\nOutput:\n{output}"


def _parse_step(text: str) -> dict:
    """``{"code", "output"[, "plan"]}`` of one step's text (see the module docstring); ``output``
    is ``None`` (not shown to the PRM) where the text has no ``Output:`` part."""
    match = _STEP.match(text)
    if match is None:
        return {"code": text, "output": None}
    step = {"code": match["code"], "output": match["output"]}
    if match["plan"]:
        step["plan"] = match["plan"]
    return step


def _key(row_query: str, history: list[dict], code: str) -> str:
    return json.dumps([row_query, [h.get("code", "") for h in history], code], sort_keys=True)


def is_stepwise(row: dict) -> bool:
    """Whether ``row`` is in the stepwise-supervision layout (has ``prompt``, ``completions`` and
    ``labels``, and no ``label``)."""
    return isinstance(row, dict) and all(k in row for k in STEPWISE_KEYS) and "label" not in row


def to_stepwise(rows: list[dict]) -> list[dict]:
    """Our PRM example rows -> TRL stepwise-supervision rows (see the module docstring).

    Returns:
        One dict per input row, in order: ``prompt`` (tools, then the query), ``completions``
        (list[str]: each history step's plan, code and output, then the candidate's plan and
        code), ``labels`` (list[bool], same length), ``candidate_index`` (the last index),
        ``query``, and the row's ``query_id``, ``source``, ``latent_reward``, ``candidate_output``.
    """
    known = {_key(query_key(r), r.get("history") or [], str(r.get("candidate") or "")): bool(int(r["label"]))
             for r in rows}
    out = []
    for row in rows:
        history = row.get("history") or []
        query = query_key(row)
        labels = [known.get(_key(query, history[:i], str(step.get("code", ""))), True)
                  for i, step in enumerate(history)]
        tools = str(row.get("tools") or "")
        completions = [_step_text(str(h.get("code") or ""), None if h.get("output") is None else str(h["output"]),
                                  str(h.get("plan") or "")) for h in history]
        completions.append(_step_text(str(row.get("candidate") or ""), plan=str(row.get("candidate_plan") or "")))
        out.append({"prompt": f"{tools}\n\n{row['query']}" if tools else row["query"],
                    "completions": completions, "labels": labels + [bool(int(row["label"]))],
                    "candidate_index": len(history), "query": row["query"],
                    **{k: row.get(k) for k in _KEPT if k in row}})
    return out


def _check(row: dict, where: str) -> tuple[str, list[str], list[int]]:
    """``(prompt, completions, labels as 0/1)`` of a stepwise row, or a one-line error naming ``where``."""
    prompt, completions, labels = (row.get(k) for k in STEPWISE_KEYS)
    if not isinstance(prompt, str) or not prompt:
        raise CodetoolError(f"{where}: a stepwise row needs a text 'prompt', got {type(prompt).__name__}.")
    if not isinstance(completions, list) or not completions or not all(isinstance(c, str) for c in completions):
        raise CodetoolError(f"{where}: 'completions' must be a non-empty list of step texts, got "
                            f"{type(completions).__name__} {str(completions)[:80]!r}.")
    if not isinstance(labels, list) or len(labels) != len(completions):
        raise CodetoolError(f"{where}: 'labels' must hold one label per step ({len(completions)} completions), "
                            f"got {str(labels)[:80]!r}.")
    bad = [x for x in labels if not (isinstance(x, bool) or x in (0, 1))]
    if bad:
        raise CodetoolError(f"{where}: step labels must be true/false (or 1/0), got {bad[0]!r}.")
    return prompt, completions, [int(x) for x in labels]


def from_stepwise(row: dict, where: str = "stepwise row") -> list[dict]:
    """One stepwise-supervision row -> its PRM example rows (see the module docstring).

    Args:
        row (`dict`): ``prompt``, ``completions``, ``labels`` (and, from our export, ``query``,
            ``candidate_index`` and the kept fields).
        where (`str`, *optional*): ``file:line`` for error messages.
    Returns:
        `list[dict]`: PRM example rows (``query``, ``tools``, ``history``, ``candidate``, ``label``,
        ...), in step order.
    Raises:
        CodetoolError: on a malformed row (missing prompt, labels not one per step, a label that
            is not a bool, a ``candidate_index`` out of range), in one line naming ``where``.
    """
    prompt, completions, labels = _check(row, where)
    query = row.get("query") if isinstance(row.get("query"), str) and row.get("query") else prompt
    tools = prompt[: -len(query)].removesuffix("\n\n") if query != prompt and prompt.endswith(query) else ""
    steps = [_parse_step(text) for text in completions]
    index = row.get("candidate_index")
    if index is not None and (not isinstance(index, int) or not 0 <= index < len(steps)):
        raise CodetoolError(f"{where}: 'candidate_index' must be a step index below {len(steps)}, got {index!r}.")
    out = []
    for i in [index] if index is not None else range(len(steps)):
        step = steps[i]
        example = {"query": query, "tools": tools, "history": steps[:i], "candidate": step["code"],
                   "label": labels[i]}
        if step.get("plan"):
            example["candidate_plan"] = step["plan"]
        example.update({k: row[k] for k in _KEPT if k in row})
        out.append(example)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m codetool.prm.stepwise IN.jsonl OUT.jsonl``."""
    from codetool.jsonl import write_jsonl
    from codetool.prm.data import read_rows

    parser = argparse.ArgumentParser(prog="python -m codetool.prm.stepwise", description=__doc__.split("\n")[0])
    parser.add_argument("input", nargs="+", help="PRM example JSONL file(s)")
    parser.add_argument("output", help="stepwise-supervision JSONL to write")
    args = parser.parse_args(argv)
    rows = to_stepwise(read_rows(args.input))
    write_jsonl(args.output, rows)
    logger.info("wrote %d stepwise rows to %s", len(rows), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
