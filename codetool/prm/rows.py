"""PRM example rows as they are read: both layouts, validated, and the query each belongs to.

A JSONL line is either one of our PRM example rows (``query``, ``tools``, ``history``,
``candidate``, ``label``, ...; DESIGN.md §3) or a row in TRL's stepwise-supervision layout
(``prompt``, ``completions``, ``labels``: the layout of Math-Shepherd and of the ``trl.PRMTrainer``
that TRL shipped from 0.13 to 1.13). :func:`read_rows` reads files holding either, or both mixed;
:func:`from_stepwise` turns one stepwise row into its example rows. Writing the stepwise layout is
:mod:`codetool.prm.stepwise`, which imports this module (never the other way).

Reading a stepwise row: step ``i`` is a candidate, steps ``0..i-1`` its history, ``labels[i]``
its label, so a row of ``n`` steps is ``n`` PRM example rows; a step written as our export writes
it (an optional plan line, a fenced Python block, then ``Output:``) is split into plan, code and
output, any other text is the step's code with no output. A row that carries ``candidate_index``
(our export does) yields that one step only.
"""

from __future__ import annotations

import re
from pathlib import Path

from codetool import CodetoolError
from codetool.jsonl import read_jsonl
from codetool.prm.format import item_from_row

STEPWISE_KEYS = ("prompt", "completions", "labels")
# fields a stepwise row carries over from (and back to) the example rows it was written from
KEPT_FIELDS = ("query_id", "source", "latent_reward", "candidate_output")
_STEP = re.compile(r"\A(?:(?P<plan>.*?)\n)?```python\n(?P<code>.*?)\n```(?:\nOutput:\n(?P<output>.*))?\Z", re.DOTALL)


def query_key(row: dict) -> str:
    """The split unit of a row: ``query_id`` when present, else the query text."""
    return str(row.get("query_id", row.get("query", "")))


def read_rows(paths: str | list[str]) -> list[dict]:
    """The PRM example rows of one or more JSONL files (DESIGN.md §3), validated. Lines in TRL's
    stepwise-supervision layout (``prompt``, ``completions``, ``labels``) become one row per step
    (:func:`from_stepwise`); the two layouts may be mixed.

    Raises:
        CodetoolError: if a file is missing or empty, or a row lacks ``query``/``label`` or has a
            label other than 0/1, or a stepwise row is malformed (one line naming file:line).
    """
    rows = []
    files = [paths] if isinstance(paths, str) else list(paths)
    for index, path in enumerate(files):
        if not Path(path).is_file():
            raise CodetoolError(f"PRM dataset not found: {path}. Build one with 'codetool build-trees' "
                                "or write PRM example rows (query, tools, history, candidate, label, ...) to a JSONL file.")
        skipped: list[int] = []
        for number, line in enumerate(read_jsonl(path, skipped), 1):
            where = f"{path}:{number}"
            for row in from_stepwise(line, where) if is_stepwise(line) else [line]:
                label = row.get("label")
                if isinstance(label, bool):
                    label = int(label)
                if label not in (0, 1):
                    raise CodetoolError(f"{where}: 'label' must be 0 or 1, got {row.get('label')!r} (a PRM "
                                        "example row needs query, history, candidate, label; a stepwise row "
                                        "prompt, completions, labels).")
                item_from_row(row)  # raises on a missing query or a malformed history
                if len(files) > 1 and row.get("pair") is not None:  # pair ids are per file: two builds share them
                    row = {**row, "pair": f"{index}:{row['pair']}"}
                rows.append({**row, "label": label})
        if skipped:  # never train on a silently shortened file (issue 19)
            raise CodetoolError(f"{path}: {len(skipped)} lines are not JSON objects (lines "
                                f"{', '.join(map(str, skipped[:5]))}); fix or delete them, then rerun.")
    if not rows:
        raise CodetoolError(f"no PRM rows in {paths}; the file is empty.")
    return rows


def is_stepwise(row: dict) -> bool:
    """Whether ``row`` is in the stepwise-supervision layout (has ``prompt``, ``completions`` and
    ``labels``, and no ``label``)."""
    return isinstance(row, dict) and all(k in row for k in STEPWISE_KEYS) and "label" not in row


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
    query = given if isinstance(given := row.get("query"), str) and given else prompt
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
        example.update({k: row[k] for k in KEPT_FIELDS if k in row})
        out.append(example)
    return out
