"""Training prompts and held-out evaluation sets: which queries, and the guarantee they are disjoint.

Training queries come from ToolBench's training distribution (``toolbench`` query files, e.g.
ToolBench's example instructions) and RestBench-TMDB (``restbench-tmdb``, a second domain);
StableToolBench's solvable queries are test sets and are refused as prompts
(``TrainPolicyConfig``). A training query is dropped when it belongs to any evaluation set of the
run or to ``never_train_on`` (by default the pipeline quickstart's evaluation sets), matched by
benchmark and query id *and* by its normalised text (a query copied into another file under
another id is still caught); :func:`training_queries` logs how many it dropped, and
``tests/test_policy_data.py`` checks the quickstart recipe's sets are disjoint.

A task's key (``benchmark/group/query_id``) is what the GRPO dataset's ``prompt`` column holds;
the rollout looks the task up by it.
"""

from __future__ import annotations

import logging
import re
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
    """A query's text for matching: lower case, runs of non-alphanumerics as one space."""
    return re.sub(r"[^a-z0-9]+", " ", str(text).lower()).strip()


def load_queries(qs: QuerySet, data_dir: str | None = None) -> list:
    """The ``BenchmarkQuery`` list of a :class:`QuerySet` after ``offset`` and ``limit``.

    Raises:
        CodetoolError: a toolbench query path that exists neither as given nor under the data folder.
    """
    from codetool.tools.loaders import (
        data_root,
        load_restbench,
        load_stabletoolbench,
        load_toolbench_queries,
    )

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
        queries = load_toolbench_queries(path)
    elif qs.benchmark == "stabletoolbench":
        queries = load_stabletoolbench(qs.group, root, subset=qs.subset)
    else:
        queries = load_restbench(root, source=qs.subset)
    end = None if qs.limit is None else qs.offset + qs.limit
    return queries[qs.offset:end]


def training_queries(cfg: TrainPolicyConfig) -> list:
    """The training queries of ``cfg.prompts``: no evaluation query, no repeats, no broken entries.

    Raises:
        CodetoolError: when nothing is left to train on.
    """
    held = [q for qs in [*cfg.evals, *cfg.never_train_on] for q in load_queries(qs, cfg.data_dir)]
    held_keys = {query_key(q) for q in held}
    held_texts = {normalised(q.query) for q in held}
    out, seen, dropped = [], set(), 0
    for qs in cfg.prompts:
        for q in load_queries(qs, cfg.data_dir):
            text = normalised(q.query)
            if query_key(q) in held_keys or text in held_texts:
                dropped += 1
                continue
            if text in seen or q.extra.get("load_error") or not q.apis:
                continue
            seen.add(text)
            out.append(q)
    if dropped:
        logger.info("kept %d evaluation queries out of the training prompts", dropped)
    if not out:
        raise CodetoolError("no training queries left after removing the evaluation sets; widen prompts "
                            "(e.g. more restbench-tmdb queries) or narrow evals / never_train_on.")
    return out


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
