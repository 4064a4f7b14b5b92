"""The long-job side of ``codetool build-trees``: which queries, where trees are built, how shards
merge, how the dataset is written (issue 28). The command is :mod:`codetool.commands.build_trees`.

- :func:`load_training_queries` reads the training queries, their ids made unique;
- :class:`TreeRunner` holds what one machine, or one Ray worker, needs to build trees (policy,
  :class:`~codetool.tree.build.TreeBuilder`, tool backend); :func:`build_missing` runs it here or
  through :func:`codetool.distributed.run_on_ray` (``--ray``), appending one record per query to
  the (shard's) output, with resume, lock and error records from :mod:`codetool.resume`; with a
  remote policy the runner grows its units node by node (:mod:`codetool.tree.grow`), so each Ray
  worker schedules continuously within its own client (:func:`ray_batch`: the units per call);
- :func:`relabel` labels the built trees again (``--relabel``), re-running in a sandbox the
  programs ``label_rule: reference`` needs that a record does not hold yet;
- :func:`merge_shards` joins the ``--shard i/n`` files and refuses while a shard is missing trees,
  naming the shards to run again (they resume);
- :func:`export_atomically` writes the PRM dataset into a staging folder and moves it in whole, so
  a full disk leaves the previous export (or none) and is an error, not a warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.jobs import ProgressFactory
from codetool.resume import UnitRunner
from codetool.search.schedule import closed_on_interrupt, planned_units
from codetool.tree.build import TreeBuilder, judge_fn, label_record
from codetool.tree.config import TreeConfig, tree_hash

logger = logging.getLogger(__name__)


def load_training_queries(cfg: TreeConfig) -> tuple[list, int]:
    """The training queries of ``cfg`` (any layout :func:`codetool.tools.files.load_queries` reads)
    and how many test queries were dropped from them (``never_train_on``, by id and by text:
    :mod:`codetool.tools.heldout`), with ids made unique as ``<file stem>/<query_id>`` (ToolBench
    files reuse ids across groups); ``world:<split>[:<n>]`` or ``world:<split>:<offset>:<n>`` generates the synthetic
    world's queries (``codetool.world.parse_spec``: queries offset to offset+n-1 of the split; ``limit``
    applies, ids stay ``<split>-<i>``, none is a test query of a benchmark). Queries that offer no API are skipped with a warning; a
    malformed entry is kept (its ``extra["load_error"]`` becomes its error record).

    Raises:
        ConfigError: no such file or folder.
        CodetoolError: a file of another kind (named), a file that repeats a query id (the ids are
            named); no query is found, none is well formed, or none offers a documented API (a build
            would write nothing and exit 0: says what to pass).
    """
    from codetool.resume import refuse_duplicates
    from codetool.tools.files import load_queries
    from codetool.tools.heldout import load_held_out
    from codetool.tools.loaders import data_root
    from codetool.world import load_queries as load_world_queries
    from codetool.world import parse_spec

    try:
        world = parse_spec(cfg.queries or "")
    except ValueError as e:
        raise ConfigError(f"--queries: {e}") from None
    if world is not None:  # the synthetic world's queries (generated; ids are unique already)
        split, offset, n = world
        counts = [x for x in (n, cfg.limit) if x is not None]
        return load_world_queries(split, min(counts) if counts else None, offset=offset), 0  # none given: the world's default (40)
    path = Path(cfg.queries) if cfg.queries else data_root() / "ToolBench" / "data_example" / "instruction"
    if not path.exists():
        raise ConfigError(f"--queries {path}: no such file or folder. Pass a ToolBench-format query file "
                          "(e.g. G1_query.json) or a folder of them, or RestGPT's layout (a list of {query, "
                          "solution}) with --tools spec.json; `codetool data fetch toolbench-examples` gets the 10 "
                          "example queries.")
    queries = load_queries(path, cfg.tools)
    if not queries:
        raise CodetoolError(f"--queries {path}: no query found (an empty list, or a folder without *.json query "
                            "files); pass a ToolBench-format query file such as G1_query.json, a folder of them, "
                            "or RestGPT's layout (a list of {query, solution}) with --tools spec.json.")
    if all(q.extra.get("load_error") for q in queries):  # not one entry is a query: the wrong file
        raise CodetoolError(f"--queries {path}: none of its {len(queries)} entries is a query (entry "
                            f"{queries[0].query_id}: {queries[0].extra['load_error']}); pass a ToolBench-format "
                            "query file (a list of {query_id, query, api_list}) or RestGPT's layout with --tools.")
    refuse_duplicates([f"{q.group}/{q.query_id}" for q in queries], str(path))
    queries, held = load_held_out(cfg.never_train_on).split(queries)
    if held:
        logger.warning("%d of the training queries are test queries of %s (e.g. %s/%s); no tree is built for them",
                       len(held), ", ".join(cfg.never_train_on), held[0].group, held[0].query_id)
    if held and not queries:
        raise CodetoolError(f"all {len(held)} queries in {path} are test queries of {', '.join(cfg.never_train_on)} "
                            "(never_train_on), so no tree may be built on them: build trees on training queries "
                            "(e.g. ToolBench's G1_query.json minus the test ids), or set never_train_on to [] for a "
                            "build that will never train a PRM (a benchmark of the builder itself).")
    usable = [q for q in queries if q.apis or q.extra.get("load_error")]
    if not usable:
        raise CodetoolError(f"{len(queries)} of {len(queries)} queries in {path} offer no documented API, so "
                            "there is no tree to build: pass the APIs with --tools (an OpenAPI spec for a list of "
                            "{query, solution}; ToolBench's toolenv/tools folder for queries that list API names "
                            "only), or use query files whose api_list documents each API.")
    if len(usable) < len(queries):
        logger.warning("%d of %d queries offer no documented API and are skipped: %s", len(queries) - len(usable),
                       len(queries), ", ".join(f"{q.group}/{q.query_id}" for q in queries
                                 if not (q.apis or q.extra.get("load_error"))))
    for q in usable:
        q.query_id = f"{q.group}/{q.query_id}"
    return (usable[: cfg.limit] if cfg.limit is not None else usable), len(held)


def merge_shards(cfg: TreeConfig, out: Path, queries: list, order: dict) -> list[dict]:
    """Join the shard files of ``out`` into ``out``; every query must have its tree (or error record).

    Raises:
        ConfigError: no shard files.
        CodetoolError: queries without a record, naming the shards to run again (they resume).
    """
    import re

    from codetool.jsonl import read_jsonl, write_jsonl

    shards = sorted(out.parent.glob(f"{out.stem}.shard-*-of-*{out.suffix}"))
    if not shards:
        raise ConfigError(f"--merge found no shard files {out.stem}.shard-I-of-N{out.suffix} in {out.parent}.")
    merged = {str(r["query_id"]): r for shard in shards for r in read_jsonl(shard)}
    missing = [q for q in queries if str(q.query_id) not in merged]
    if missing:
        counts = {int(m.group(1)) for p in shards if (m := re.search(r"\.shard-\d+-of-(\d+)", p.name))}
        rerun = (", ".join(f"--shard {i}/{n}" for n in sorted(counts) for i in sorted({order[q.query_id] % n
                                                                                         for q in missing}))
                 if len(counts) == 1 else "the unfinished shards")
        raise CodetoolError(f"--merge: {len(missing)} of {len(queries)} queries have no tree in {len(shards)} shard "
                            f"files (e.g. {', '.join(str(q.query_id) for q in missing[:3])}): their shard did not "
                            f"finish. Run {rerun} again (it resumes), then --merge.")
    records = sorted(merged.values(), key=lambda r: order.get(str(r["query_id"]), len(order)))
    write_jsonl(out, records)
    logger.info("merged %d shard files into %s (%d trees)", len(shards), out, len(records))
    return records


def relabel(cfg: TreeConfig, records: list[dict], queries: list) -> list[dict]:
    """``--relabel``: :func:`label_record` on every built tree. Under ``label_rule: reference`` a
    program missing from a record's run cache is run in a sandbox on the query's tools (started
    only when one is missing)."""
    built = [r for r in records if r.get("finish_type") != "error"]
    if cfg.label_rule != "reference":
        for r in built:
            label_record(r, cfg, recompute_success=True)
        return records
    from codetool.assemble import executor_factory, make_task, tool_backend
    from codetool.tree.reference import LazyRunner, reference_runner

    by_id, make_executor = {str(q.query_id): q for q in queries}, executor_factory(cfg.executor)
    with tool_backend(cfg.tools_backend, server_url=cfg.tool_server_url, cache_dir=cfg.tool_cache_dir) as backend:
        for r in built:
            q = by_id.get(str(r["query_id"]))
            start = None if q is None else (lambda q=q: reference_runner(make_task(q, backend, tool_doc=cfg.tool_doc),
                                                                          make_executor))
            with LazyRunner(start) as runner:
                label_record(r, cfg, recompute_success=True, runner=runner)
    return records


def export_atomically(records: list[dict], cfg: TreeConfig) -> dict | None:
    """Export the PRM dataset of ``records`` into ``cfg.dataset_dir``, all or nothing: the files are
    written into a temporary folder beside it and moved in once complete, so a failed export (a
    full disk) leaves the previous dataset, or no dataset, and raises.

    Trees of queries in ``cfg.never_train_on`` (built before the filter existed, or under another
    setting) are left out, and counted (``test_queries_dropped``).

    Returns:
        The export's statistics, or ``None`` when the trees give no row (a warning; nothing written).
    Raises:
        CodetoolError: the dataset could not be written (the message says what to free or fix).
    """
    import shutil
    import tempfile

    from codetool.tools.heldout import load_held_out
    from codetool.tree.dataset import EmptyDatasetError, export_dataset

    target = Path(cfg.dataset_dir)
    held_out = load_held_out(cfg.never_train_on)
    records, held = held_out.split_rows(records)
    if held:
        logger.warning("%d trees belong to test queries (%s) and are left out of the PRM dataset", len(held),
                       ", ".join(cfg.never_train_on))

    def refuse(error) -> CodetoolError:
        return CodetoolError(f"cannot write the PRM dataset into {target}: {error} (free space or fix permissions, "
                             "then run the same build-trees command again: the trees are kept and only the export "
                             "runs).")

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as e:
        raise refuse(e.strerror or e) from None
    try:
        stats = export_dataset(records, staging, emit=cfg.emit, val_fraction=cfg.val_fraction, seed=cfg.seed,
                               extra={"test_queries_dropped": len(held), "test_sets_unchecked": list(held_out.unchecked)})
        target.mkdir(exist_ok=True)
        for entry in sorted(staging.iterdir()):  # renames within one file system: no space needed
            dest = target / entry.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            os.replace(entry, dest)
    except EmptyDatasetError as e:  # the trees are valid; they only hold no labelled pair
        logger.warning("no PRM dataset written: %s", e)
        return None
    except CodetoolError as e:
        raise refuse(str(e)) from None
    except OSError as e:
        raise refuse(e.strerror or e) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return stats


def build_missing(cfg: TreeConfig, mine: list, path: Path, progress: ProgressFactory | None = None,
                  clients: dict | None = None) -> int:
    """Build the trees of ``mine`` not yet in ``path`` (resume keyed by the unique query id and
    guarded by ``tree_hash``), here or on Ray workers (``--ray``); a tree whose build raises, or a
    malformed query, is recorded as ``finish_type: error`` and the others go on
    (``codetool.resume``).

    Args:
        progress (`Callable[[int], Callable[[dict], None]]`, *optional*): called once with the
            number of trees to build (when there are any); what it returns is called with each
            record once it is written (the command's progress bar).
        clients (`dict`, *optional*): receives this process's remote policy client (``{"policy":
            ...}``, what has ``stats()``), for the summary (a Ray worker's stay on the worker).
    Returns:
        The number of trees that failed.
    """
    from codetool.jsonl import append_jsonl
    from codetool.resume import FatalError, plan_resume

    chash = tree_hash(cfg)
    plan = plan_resume(path, [str(q.query_id) for q in mine], lambda r: str(r.get("query_id")), chash,
                       retry_failed=cfg.retry_failed, force=cfg.force_resume)
    todo = [q for q in mine if str(q.query_id) not in plan.done]
    if plan.done:
        logger.info("resuming: %d of %d trees already in %s", len(mine) - len(todo), len(mine), path)
    if not todo:
        return 0
    failed = [0]
    tick = progress(len(todo)) if progress is not None else None

    def land(record: dict) -> None:
        try:
            append_jsonl(path, record)
        except CodetoolError as e:  # a full disk stops the job; it is not one tree's fault
            raise FatalError(str(e)) from None
        failed[0] += record.get("finish_type") == "error"
        if tick is not None:
            tick(record)

    if cfg.ray:
        from codetool.distributed import run_on_ray

        run_on_ray(cfg.ray, cfg.cluster, todo, unit_key=lambda q: str(q.query_id),
                   record_key=lambda r: str(r["query_id"]), runner=(TreeRunner, (cfg, chash)), on_record=land,
                   on_error=lambda q, e: land(tree_error_record(q, e, chash)), batch=ray_batch(cfg))
        return failed[0]
    from codetool.tree.checkpoint import NodeLog, nodes_path, read_partial

    log = NodeLog(nodes_path(path), chash)  # the nodes of the trees in progress (a kill keeps them)
    partial = read_partial(log.path, chash, {str(q.query_id) for q in todo})
    if partial:
        logger.info("resuming %d trees from their logged nodes (%d nodes) in %s", len(partial),
                    sum(len(p["nodes"]) for p in partial.values()), log.path)
    try:
        with TreeRunner(cfg, chash) as runner:
            runner.run(todo, land, partial=partial, node_log=log)
            log_client_stats(runner.builder.policy)
            if clients is not None and callable(getattr(runner.builder.policy, "stats", None)):
                clients["policy"] = runner.builder.policy
    except BaseException:
        log.close()  # kept: a rerun continues the trees from their logged nodes
        raise
    log.remove()  # every tree is recorded
    return failed[0]


def ray_batch(cfg: TreeConfig) -> int:
    """Trees per call to a Ray worker (unless ``cluster.batch`` is set): as many as one worker keeps
    in flight, ``batch_trees`` or what the worker's builder picks for its policy."""
    return planned_units(cfg.batch_trees, cfg.policy_spec.remote, cfg.search.schedule, cfg.policy_client, local_default=8,
                         per_unit=2 * cfg.branching)


def log_client_stats(policy) -> None:
    """Log what a remote policy's client did (requests, retries, sequences in flight); nothing for
    a local policy."""
    if callable(getattr(policy, "stats", None)):
        stats = policy.stats()
        logger.info("policy server: %d requests (%d retries, %d failovers, %d timeouts; faults retried: %s); "
                    "sequences in flight: peak %s of %s, effective %.1f", stats["requests"], stats["retries"],
                    stats["failovers"], stats["timeouts"], stats.get("faults"), stats["in_flight_peak"],
                    stats["max_in_flight"], stats["in_flight_effective"])


def tree_error_record(query, error: BaseException | str, config_hash: str) -> dict[str, Any]:
    """The record of a query whose tree could not be built (a malformed entry, a failed build);
    ``not_executed`` when the failure is the machine's (``codetool.rewards.machine_failure``)."""
    from codetool.resume import error_message
    from codetool.rewards import machine_failure

    return {"query_id": query.query_id, "query": query.query, "config_hash": config_hash, "finish_type": "error",
            "error": error if isinstance(error, str) else error_message(error), "nodes": {}, "pairs": [],
            **({"not_executed": True} if machine_failure(error) else {})}


class TreeRunner(UnitRunner):
    """What one machine, or one Ray worker, needs to build trees: the policy, the builder (its
    executors) and an open tool backend (closed by ``close``, or at the end of a ``with`` block).

    Args:
        cfg (`TreeConfig`): the tree settings.
        chash (`str`): the config hash stored in every record.
    """

    def __init__(self, cfg: TreeConfig, chash: str):
        from codetool.assemble import executor_factory, make_policy, tool_backend

        self.cfg, self.chash = cfg, chash
        from codetool.executor import started_in_background
        from codetool.memory_use import memory_gate
        from codetool.search.schedule import is_continuous

        policy = make_policy(cfg.policy_spec)
        continuous = is_continuous(policy, cfg.search.schedule)
        # new trees wait while they would pass the cap; what this process has is measured before the
        # executors' first process (their principal check) starts
        self.gate = memory_gate(cfg.max_memory_mb) if continuous else None
        make_executor = executor_factory(cfg.executor)
        if continuous:  # a tree's sandbox starts while its root is sampled
            make_executor = started_in_background(make_executor)
        self.builder = TreeBuilder(policy, cfg, make_executor, judge=judge_fn(cfg))
        self.backend = self.open(tool_backend(cfg.tools_backend, server_url=cfg.tool_server_url,
                                              cache_dir=cfg.tool_cache_dir))

    def run(self, queries: list, on_record, *, partial: dict[str, dict] | None = None, node_log=None) -> int:
        """Build the trees of ``queries`` (``BenchmarkQuery``) and call ``on_record(dict)`` once per
        query; a malformed query or a failed build gets an error record. A local policy grows
        ``batch_trees`` trees at a time level by level; a remote one grows them node by node, a
        new tree as soon as one is done (:mod:`codetool.tree.grow`). Nodes go to ``node_log`` (a
        :class:`~codetool.tree.checkpoint.NodeLog`) as they are built, and the trees of
        ``partial`` (logged by a killed run) continue from their nodes. Returns the number of
        error records."""
        from codetool.assemble import make_task
        from codetool.jobs import stop_if_unreachable
        from codetool.resume import run_isolated
        from codetool.streaming import Delivery

        cfg, failed = self.cfg, 0

        def stop_if_dead() -> None:  # a dead policy server stops the job (the tree is not recorded)
            stop_if_unreachable({"policy": self.builder.policy},
                                "it resumes with the trees not yet in the output (this one included)")

        def failed_unit(q, error: BaseException | str) -> None:
            nonlocal failed
            stop_if_dead()
            failed += 1
            on_record(tree_error_record(q, error, self.chash))

        def land(record: dict) -> None:
            nonlocal failed
            if record.get("finish_type") == "error":
                stop_if_dead()
            failed += record.get("finish_type") == "error"
            on_record(record)

        def build_batch(batch: list, on_done) -> None:
            tasks = [make_task(q, self.backend, tool_doc=cfg.tool_doc) for q in batch]
            for record in self.builder.build_many(tasks, partial):  # each batch lands before the next starts
                on_done(record)

        def key(x) -> str:
            return str(x["query_id"] if isinstance(x, dict) else x.query_id)

        good = []
        for q in queries:
            if q.extra.get("load_error"):  # a malformed entry: recorded, never built
                failed_unit(q, f"CodetoolError: {q.extra['load_error']}")
            else:
                good.append(q)
        builder = self.builder
        builder.node_log = node_log
        with closed_on_interrupt(builder.policy):
            if builder.continuous:
                from codetool.tree.grow import grow

                def grow_batch(batch: list, on_done) -> None:
                    # records are written (fsynced) in a thread of their own: the scheduler goes on
                    delivery = Delivery(on_done)
                    try:
                        grow(builder, (make_task(q, self.backend, tool_doc=cfg.tool_doc) for q in batch),
                             delivery.put, trees=builder.trees,
                             workers=max(8, getattr(builder.policy, "max_in_flight", 8)),
                             admit=self.gate.admit if self.gate is not None else None, partial=partial)
                    except Exception:
                        delivery.close()  # what finished before the error lands (run_isolated reruns the rest)
                        raise
                    except BaseException:
                        delivery.abandon()
                        raise
                    delivery.close()

                run_isolated(good, grow_batch, key, land, failed_unit)
            else:
                for b in range(0, len(good), builder.trees):
                    run_isolated(good[b:b + builder.trees], build_batch, key, land, failed_unit)
        if self.gate is not None:
            self.gate.report()
        return failed
