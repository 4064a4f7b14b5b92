"""TRL's stepwise-supervision layout: export our PRM rows to it.

A stepwise-supervision dataset (TRL's dataset format of that name; the layout of Math-Shepherd
and of the ``trl.PRMTrainer`` that TRL shipped from 0.13 to 1.13 and removed in 1.14) has one row
per step sequence: ``prompt`` (text), ``completions`` (the steps, text) and ``labels`` (one bool
per step). ``codetool train-prm`` is the maintained trainer for this layout: ``train-prm`` and
``eval-prm`` read it directly (:func:`codetool.prm.rows.read_rows` reads both layouts, by
:func:`codetool.prm.rows.from_stepwise`, which also says how a stepwise row is read back).

Writing (:func:`to_stepwise`): each PRM example row (one candidate after a history of chosen
steps) becomes one sequence: the history steps with their outputs (a plan line, a fenced Python
block, then ``Output:``), then the candidate without its output (what the PRM sees). A history
step's label is the label of the row in which that step was the candidate (same query, same
earlier steps, same code); a history step without such a row counts as positive, since the
search expanded it. Rows keep ``query``, ``query_id``, ``source``, ``latent_reward``,
``candidate_output`` and ``candidate_index``, so reading the export gives back the rows it was
written from.

    python -m codetool.prm.stepwise data/prm/prm_examples.jsonl data/prm/prm_stepwise.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging

from codetool.prm.rows import KEPT_FIELDS, query_key, read_rows

logger = logging.getLogger(__name__)


def _step_text(code: str, output: str | None = None, plan: str = "") -> str:
    """A step as text: the plan line, the code in a fenced block, then its output (none: not shown)."""
    text = f"{plan}\n```python\n{code}\n```" if plan else f"```python\n{code}\n```"
    return text if output is None else f"{text}\nOutput:\n{output}"


def _key(row_query: str, history: list[dict], code: str) -> str:
    return json.dumps([row_query, [h.get("code", "") for h in history], code], sort_keys=True)


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
                    **{k: row.get(k) for k in KEPT_FIELDS if k in row}})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m codetool.prm.stepwise IN.jsonl OUT.jsonl``."""
    from codetool.jsonl import write_jsonl

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
