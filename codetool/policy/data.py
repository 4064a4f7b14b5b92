"""Training prompts and held-out evaluation sets: which queries, and the guarantee they are disjoint.

Training queries come from ToolBench's training distribution (``toolbench`` query files, e.g.
ToolBench's example instructions) and RestBench-TMDB (``restbench-tmdb``, a second domain);
StableToolBench's solvable queries are test sets and are refused as prompts
(``TrainPolicyConfig``). A training query is dropped when it belongs to any evaluation set of the
run, to ``never_train_on`` (by default the pipeline quickstart's evaluation sets) or to the named
``test_sets`` (by default every StableToolBench test query, which ToolBench's own query files
hold), matched by query id *and* by its normalised text (a query copied into another file under
another id is still caught) with :mod:`codetool.tools.heldout`, the filter build-trees and
train-prm use; :func:`training_queries` counts what it dropped (the report says how many), and
``tests/test_policy_data.py`` checks the quickstart recipe's sets are disjoint.

A task's key (``benchmark/group/query_id``) is what the GRPO dataset's ``prompt`` column holds;
the rollout looks the task up by it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from codetool import CodetoolError
from codetool.resume import unit_key

from .config import QuerySet, TrainPolicyConfig

logger = logging.getLogger(__name__)


def _benchmark(query) -> str:
    return "restbench-tmdb" if query.benchmark == "restbench" else query.benchmark


def query_key(query) -> str:
    """``benchmark/group/query_id`` of a ``BenchmarkQuery`` (the GRPO dataset's prompt value)."""
    return unit_key(_benchmark(query), query.group, query.query_id)


def normalised(text: str) -> str:
    """A query's text for matching (:func:`codetool.tools.heldout.normalised`)."""
    from codetool.tools.heldout import normalised as norm

    return norm(text)


def load_queries(qs: QuerySet, data_dir: str | None = None) -> list:
    """The ``BenchmarkQuery`` list of a :class:`QuerySet` after ``offset`` and ``limit``.

    Raises:
        CodetoolError: a toolbench query path that exists neither as given nor under the data folder.
    """
    from codetool.tools.files import load_queries as load_query_file
    from codetool.tools.loaders import data_root, load_restbench, load_stabletoolbench

    if qs.benchmark == "world":  # generated: nothing is read
        from codetool.world import load_queries as load_world

        return load_world(qs.group, qs.limit, offset=qs.offset)
    root = Path(data_dir) if data_dir else data_root()
    if qs.benchmark == "toolbench":
        assert qs.queries is not None  # QuerySet: a toolbench set needs queries
        path = Path(qs.queries)
        if not path.exists():
            path = root / qs.queries
        if not path.exists():
            raise CodetoolError(f"toolbench queries {qs.queries!r} not found (looked as given and under {root}); "
                                "pass a ToolBench query file or folder, or fetch the data with `codetool data`.")
        queries = load_query_file(path)
    elif qs.benchmark == "stabletoolbench":
        queries = load_stabletoolbench(qs.group, root, subset=qs.subset)
    else:
        queries = load_restbench(root, source=qs.subset)
    end = None if qs.limit is None else qs.offset + qs.limit
    return queries[qs.offset:end]


def training_queries(cfg: TrainPolicyConfig) -> TrainingQueries:
    """The training queries of ``cfg.prompts``: no evaluation or test query (by id and by text,
    :class:`codetool.tools.heldout.HeldOut`: the filter build-trees and train-prm use too), no
    repeats, no broken entries. How many test queries were dropped is the list's ``dropped``.

    Raises:
        CodetoolError: when nothing is left to train on, or a test set's files are missing.
    """
    from codetool.tools.heldout import held_out_of, load_held_out

    held = held_out_of([q for qs in [*cfg.evals, *cfg.never_train_on] for q in load_queries(qs, cfg.data_dir)],
                       "evals and never_train_on") | load_held_out(cfg.test_sets, cfg.data_dir)
    loaded = [q for qs in cfg.prompts for q in load_queries(qs, cfg.data_dir)]
    kept, dropped = held.split(loaded)
    out, seen = TrainingQueries(), set()
    out.dropped = len(dropped)
    for q in kept:
        text = normalised(q.query)
        if text in seen or q.extra.get("load_error") or not q.apis:
            continue
        seen.add(text)
        out.append(q)
    if dropped:
        logger.info("kept %d evaluation or test queries out of the training prompts", len(dropped))
    if not out:
        raise CodetoolError("no training queries left after removing the evaluation sets; widen prompts "
                            "(e.g. more restbench-tmdb queries) or narrow evals / never_train_on.")
    return out


class TrainingQueries(list):
    """The training queries, with ``dropped``: how many evaluation or test queries were left out."""

    dropped = 0


def evaluation_queries(cfg: TrainPolicyConfig) -> dict[str, list]:
    """``{set name: queries}`` of ``cfg.evals`` (a set named twice gets its offset appended)."""
    out: dict[str, list] = {}
    for qs in cfg.evals:
        name = qs.name if qs.name not in out else f"{qs.name}@{qs.offset}"
        out[name] = [q for q in load_queries(qs, cfg.data_dir) if not q.extra.get("load_error")]
    return out


def backend_kind(cfg: TrainPolicyConfig, benchmark: str) -> str:
    """The tool backend of a benchmark: ``restbench_backend`` for RestBench-TMDB, the world's own
    for the synthetic world, else ``tools_backend`` (``auto``: the simulator)."""
    if benchmark == "restbench-tmdb":
        return cfg.restbench_backend
    if benchmark == "world":
        return "world"
    return "simulator" if cfg.tools_backend == "auto" else cfg.tools_backend


def make_tasks(queries: list, backends: dict, cfg: TrainPolicyConfig) -> dict:
    """``{key: SearchTask}`` of ``queries`` with the backend of each one's benchmark."""
    from codetool.assemble import make_task

    return {query_key(q): make_task(q, backends[_benchmark(q)], max_response_chars=cfg.max_response_chars,
                                    tool_doc=cfg.tool_doc) for q in queries}
