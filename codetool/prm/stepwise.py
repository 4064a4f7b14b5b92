"""Export PRM example rows in TRL's stepwise-supervision layout, so TRL users can read our data.

TRL's stepwise-supervision datasets (the layout of ``trl.PRMTrainer`` and of the Math-Shepherd
example) have one row per step sequence: ``prompt`` (text), ``completions`` (the steps, text)
and ``labels`` (one bool per step). A PRM example row of ours (DESIGN.md §3) is one candidate
step after a history of chosen steps, so it becomes one sequence: the history steps, then the
candidate. A history step's label is the label of the row in which that step was the candidate
(same query, same earlier steps, same code); a history step without such a row counts as
positive, since the search expanded it. Rows keep ``query_id`` and ``source`` for traceability.

    python -m codetool.prm.stepwise data/prm/prm_examples.jsonl data/prm/prm_stepwise.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging

from codetool.prm.data import query_key

logger = logging.getLogger(__name__)


def _step_text(code: str, output: str | None = None) -> str:
    text = f"```python\n{code}\n```"
    return text if output is None else f"{text}\nOutput:\n{output}"


def _key(row_query: str, history: list[dict], code: str) -> str:
    return json.dumps([row_query, [h.get("code", "") for h in history], code], sort_keys=True)


def to_stepwise(rows: list[dict]) -> list[dict]:
    """Our PRM example rows -> TRL stepwise-supervision rows (see the module docstring).

    Returns:
        One dict per input row, in order: ``prompt`` (tools, then the query), ``completions``
        (list[str]: each history step's code and output, then the candidate's code, which is what
        the PRM sees), ``labels`` (list[bool], same length), ``query_id``, ``source``.
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
        out.append({"prompt": f"{tools}\n\n{row['query']}" if tools else row["query"],
                    "completions": [_step_text(str(h.get("code", "")), str(h.get("output", ""))) for h in history]
                    + [_step_text(str(row.get("candidate") or ""))],
                    "labels": labels + [bool(int(row["label"]))],
                    "query_id": row.get("query_id"), "source": row.get("source")})
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
