"""Turn labelled trees into PRM examples and a Hugging Face dataset (docs/DESIGN.md §3).

Each sibling pair of a tree gives two rows that share their prefix (query, tools, the path of
steps above them): the "more promising" sibling with ``label=1`` and the other with ``label=0``,
both with the pair's id (``pair``) and each with whether its own step ran (``ok``, the on-the-spot
reward): :mod:`codetool.prm.evaluate` measures the PRM on labelled pairs, split by what decided them.
The history shows what the policy saw when it wrote the step: with the tree's
``observation_history: last`` only the parent's output (earlier outputs are ``None``).
Every row keeps its candidate's own output; the PRM format decides whether the PRM sees it.
With ``emit='nodes'`` every node becomes a row with its soft target (``latent_reward``) and
``label = 1 if lr_soft >= 0.5`` (a node that was not executed, or none of whose leaves was, has no
target and gives no row). Candidates whose reply had no code block are left out: the search
never asks the PRM about them (they get latent reward 0), so they would only waste training.

Under ``label_rule: reference`` the rows are the public code's (:mod:`codetool.tree.reference`),
in its order: two per kept pair, first sibling first, both possibly ``0``, replies without code
included (their ``step_text`` is empty), ``latent_reward`` the public code's. Every row also
carries what the reference PRM interface shows (``prm.format.interface: reference``):
``step_text``, ``previous_steps`` and ``parent_result`` (uncut).

The train/validation split is by query id, never by row, so no query leaks across the split; it is
:func:`codetool.split.heldout_query_ids`, the split ``train-prm`` and ``eval-prm`` use.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.jsonl import write_jsonl
from codetool.search.step import step_item
from codetool.split import heldout_query_ids
from codetool.tree.labels import add_counts, pair_counts, path_to
from codetool.tree.reference import interface_fields

logger = logging.getLogger(__name__)

PRM_FIELDS = ("query_id", "query", "tools", "history", "candidate", "candidate_output", "candidate_plan",
              "label", "latent_reward", "source", "label_rule", "step_text", "previous_steps", "parent_result",
              "ok", "pair")


def _row(record: dict[str, Any], node_id: str, label: int, reference: dict | None = None,
         pair: str | None = None) -> dict[str, Any]:
    nodes = record["nodes"]
    node = nodes[node_id]
    item = step_item(record["query"], record["tools"], [nodes[n] for n in path_to(nodes, node_id)[:-1]],
                     node["code"], node.get("text"), node["observation"],
                     step_format=record.get("step_format", "code_only"),
                     observation_history=record.get("observation_history", "all"))  # as the search scores it
    row = {"query_id": str(record["query_id"]), "query": item.query, "tools": item.tools,
           "history": item.history, "candidate": item.candidate, "candidate_output": item.candidate_output,
           "candidate_plan": item.candidate_plan, "label": int(label), "latent_reward": float(node["latent_reward"]),
           "source": f"{record['query_id']}:{node_id}", "label_rule": record.get("label_rule", "ours"),
           "ok": bool(node.get("ok")), "pair": pair, **interface_fields(record, node_id)}
    if reference is not None:  # the public code's row: its texts and its latent reward
        row.update({k: reference[k] for k in ("step_text", "previous_steps", "parent_result")})
        row["latent_reward"] = float(record["reference"]["nodes"][node_id]["latent_reward"])
    return row


def tree_rows(record: dict[str, Any], emit: str = "pairs") -> tuple[list[dict[str, Any]], int]:
    """PRM rows of one tree record; returns the rows and how many were skipped for lacking code
    (none under ``label_rule: reference``, whose rows keep replies without code)."""
    nodes = record["nodes"]
    rows, skipped = [], 0
    if emit == "pairs" and record.get("label_rule") == "reference" and "reference" in record:
        # (records written before the reference rows existed called our rule "reference": their pairs stand)
        return [_row(record, r["node"], r["label"], r, pair=f"{record['query_id']}:{k // 2}")
                for k, r in enumerate(record["reference"]["rows"])], 0
    if emit == "nodes":
        for node_id, node in nodes.items():
            if node.get("lr_soft") is None:  # not executed (or nothing below it was): no target
                continue
            if node["code"] is None:
                skipped += 1
                continue
            rows.append(_row(record, node_id, int(node["lr_soft"] >= 0.5)))
        return rows, skipped
    for better, worse in record["pairs"]:
        if nodes[better]["code"] is None or nodes[worse]["code"] is None:
            skipped += 1
            continue
        pair = f"{record['query_id']}:{better}>{worse}"
        rows.append(_row(record, better, 1, pair=pair))
        rows.append(_row(record, worse, 0, pair=pair))
    return rows, skipped


def split_query_ids(query_ids: list[str], val_fraction: float, seed: int = 0) -> set[str]:
    """The query ids held out for validation (:func:`codetool.split.heldout_query_ids`: the same
    split that ``train-prm`` and ``eval-prm`` use with the same fraction and seed)."""
    return heldout_query_ids(query_ids, val_fraction, seed)


class EmptyDatasetError(CodetoolError):
    """The trees give no PRM row (every sibling pair dropped, or no code): nothing to write."""


def export_dataset(records: list[dict[str, Any]], out_dir: str | Path, *, emit: str = "pairs",
                   val_fraction: float = 0.2, seed: int = 0, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the PRM dataset into ``out_dir``: ``prm_examples.jsonl`` (every row; what
    ``codetool train-prm`` reads by default), ``train.jsonl`` and ``validation.jsonl`` (split by
    query id; ``datasets.load_dataset("json", data_files=...)`` reads them as a ``Dataset``).

    Also writes ``summary.json``: the row counts, the nodes the executor could not run
    (``not_executed_nodes``: no row or label counts them), the trees' pair counts (pairs by what
    decided them, drops by reason, ``not_executed`` among them; see ``codetool.tree.labels.sibling_pairs``)
    and ``extra`` (the caller's counts, e.g. ``test_queries_dropped``).

    Returns:
        ``{"train": n_rows, "validation": n_rows, "skipped_no_code": n, "not_executed_nodes": n,
        "val_query_ids": [...], "pair_counts": {"decided": {...}, "dropped": {...}}}``.
    Raises:
        EmptyDatasetError: when the trees hold no usable row (e.g. every pair dropped).
        CodetoolError: a file cannot be written (e.g. a full disk).
    """
    out_dir = Path(out_dir)
    rows, skipped, counts, lost = [], 0, pair_counts(), 0
    for record in records:
        r, s = tree_rows(record, emit)
        rows.extend(r)
        skipped += s
        add_counts(counts, record.get("summary", {}).get("pair_counts", {}))
        lost += int(record.get("summary", {}).get("not_executed", 0))
    logger.info("sibling pairs by what decided them: %s; dropped: %s",
                ", ".join(f"{k} {v}" for k, v in counts["decided"].items()),
                ", ".join(f"{k} {v}" for k, v in counts["dropped"].items()))
    if not rows:
        raise EmptyDatasetError(f"the {len(records)} trees gave no PRM rows (every sibling pair was dropped, see the "
                            "pair counts, or had no code). Build more or deeper trees (--max-depth, --branching), "
                            "use a policy that reaches successful leaves, or use --emit nodes.")
    val_ids = split_query_ids([r["query_id"] for r in rows], val_fraction, seed)
    splits = {"train": [r for r in rows if r["query_id"] not in val_ids],
              "validation": [r for r in rows if r["query_id"] in val_ids]}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "prm_examples.jsonl", rows)
    for name, split_rows in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", split_rows)
    stats = {"train": len(splits["train"]), "validation": len(splits["validation"]),
             "skipped_no_code": skipped, "not_executed_nodes": lost, "val_query_ids": sorted(val_ids),
             "pair_counts": counts, **(extra or {})}
    (out_dir / "summary.json").write_text(json.dumps(stats, indent=2) + "\n")
    logger.info("PRM dataset: %d train rows, %d validation rows (%d held-out queries) -> %s",
                stats["train"], stats["validation"], len(val_ids), out_dir)
    return stats
