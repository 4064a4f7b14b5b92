"""``codetool build-trees``: build the DFS action trees of the training queries and export the PRM
dataset (CodeTool §3.2).

    codetool build-trees --queries data/ToolBench/data_example/instruction --limit 10
    codetool build-trees --shard 0/4 ...   # one shard (Slurm: scripts/slurm/), then --merge
    codetool build-trees --relabel --label_rule reference

Three modes: build (a shard of) the trees, ``--merge`` the shard files, or ``--relabel`` the trees
already built; then export the PRM dataset all or nothing and print the summary. The settings are
:class:`~codetool.tree.config.TreeConfig`; the builder and the labelling are
:mod:`codetool.tree.build`; the job (resume, Ray, shards, the export) is :mod:`codetool.jobs.trees`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.commands import job_progress
from codetool.config import ConfigError
from codetool.jobs import client_rows
from codetool.jobs.trees import (
    build_missing,
    export_atomically,
    load_training_queries,
    merge_shards,
    relabel,
)
from codetool.jsonl import check_output, read_jsonl, write_jsonl
from codetool.progress import JobProgress
from codetool.resume import OutputLock
from codetool.tree.build import summarize
from codetool.tree.config import TreeConfig, tree_hash

logger = logging.getLogger(__name__)


def build_trees_command(cfg: TreeConfig) -> int:
    """``codetool build-trees``: build (a shard of) the trees, or ``--merge`` shards; then export the
    PRM dataset and print the summary. Exit status 1 when a tree of the output (of the shard) is an
    error record (a malformed query, a failed build); ``--retry_failed`` rebuilds only those.

    Raises:
        CodetoolError: the output is a folder or locked; ``--merge`` finds shards missing trees;
            the PRM dataset cannot be written (the trees are kept; the previous dataset too).
    """
    out = Path(cfg.output)
    check_output(out, queries=cfg.queries, tools=cfg.tools)
    queries, test_dropped = load_training_queries(cfg)
    clients: dict[str, Any] = {}  # the remote policy client of this process, for the summary
    order = {q.query_id: i for i, q in enumerate(queries)}
    if cfg.relabel:
        if not out.is_file():
            raise ConfigError(f"--relabel needs the tree records of --output; {out} does not exist.")
        records = relabel(cfg, list(read_jsonl(out)), queries)
        for r in records:  # the records now hold this run's settings: resume and --retry_failed accept them
            r["config_hash"] = tree_hash(cfg)
        write_jsonl(out, records)
        logger.info("relabelled %d trees in %s (success %s, label rule %s)", len(records), out,
                    cfg.success, cfg.label_rule)
    elif cfg.merge:
        records = merge_shards(cfg, out, queries, order)
    else:
        index, count = cfg.shard_index()
        mine = [q for i, q in enumerate(queries) if i % count == index]
        path = cfg.shard_path()
        if path.is_dir():
            raise CodetoolError(f"--output {path} is a folder; pass a file path such as {path / 'trees.jsonl'}.")
        with OutputLock(path), job_progress(tree_progress(cfg)) as progress:
            build_missing(cfg, mine, path, progress=progress, clients=clients)
        records = sorted(read_jsonl(path), key=lambda r: order.get(str(r["query_id"]), len(order)))
        if cfg.shard is not None:
            _print_summary(f"shard {cfg.shard}: {path}", summarize(records), client_rows(clients))
            if not _report_failed(records):
                logger.info("shard done; run again with --merge once every shard has finished")
                return 0
            return 1
    summary = summarize(records)  # "errors" counts the failed trees
    summary["test_queries_dropped"] = test_dropped  # from the queries; the export drops any tree of one too
    stats = export_atomically([r for r in records if r.get("finish_type") != "error"], cfg)
    if stats is not None:
        summary.update({f"dataset_{k}": v for k, v in stats.items() if k not in ("val_query_ids", "pair_counts")})
    _print_summary(f"trees: {out}", summary, client_rows(clients))
    return 1 if _report_failed(records) else 0


def _report_failed(records: list[dict]) -> bool:
    failed = [r for r in records if r.get("finish_type") == "error"]
    if failed:
        logger.warning("%d trees ended with an error (e.g. %s: %s); rerun with --retry_failed to rebuild only those",
                       len(failed), failed[0].get("query_id"), failed[0].get("error"))
    return bool(failed)


def tree_progress(cfg: TreeConfig) -> JobProgress:
    """The progress of the trees stage: trees, and the nodes sampled inside them (trees grow
    together, so a bar of finished trees stood at 0% until the end). A tree has at most
    ``branching + branching^2 + ... + branching^max_depth`` nodes; with ``--ray`` only trees are
    counted (the nodes grow in the workers)."""
    b, depth = cfg.branching, cfg.max_depth
    inner = sum(b ** d for d in range(depth))  # the expansions of a full tree: its root and inner nodes

    def used(record: dict) -> int:
        nodes = record.get("nodes") or {}
        return (1 + sum(1 for n in nodes.values() if not n.get("leaf"))) if nodes else 0

    return JobProgress("trees", "trees", "" if cfg.ray else "nodes", work_per_unit=inner, scale=b, used=used)


def _print_summary(title: str, summary: dict[str, Any], rows: Sequence[tuple[str, str]] = ()) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    for key, value in summary.items():
        table.add_row(key.replace("_", " "), f"{value:.3f}" if isinstance(value, float) else str(value))
    for key, value in rows:  # the remote clients' use (codetool.jobs.client_rows)
        table.add_row(key, value)
    Console().print(table)
