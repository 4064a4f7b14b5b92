"""``codetool run``: the stepwise search on one query or a benchmark, written as trajectories.

    codetool run --query "What is the weather in Paris?" --tools my_apis.json
    codetool run --benchmark stabletoolbench --group G1_instruction --limit 5
    codetool run --benchmark restbench-tmdb --limit 10 --prm checkpoints/prm/quickstart

Trajectories go to ``--output`` as JSON Lines, appended one query at a time; a rerun skips the
queries already there (by benchmark, group and query id), so a killed run resumes where it
stopped. A rerun with changed settings refuses to mix records (``--force_resume`` overrides); the
output is locked while a run writes it; a query whose run raises (a policy 4xx/5xx after retries,
unencodable text, a malformed API entry) is recorded as ``finish_type: error`` and the run goes
on, but a policy or PRM server that cannot be reached after the retries stops it
(``codetool.jobs.stop_if_unreachable``; the rerun resumes); the exit status is 1 when any query failed, and ``--retry_failed`` reruns only those
(``codetool.resume``). The end of the run prints a
one-screen summary (finished, gave up, SCEP, mean steps, tokens, seconds per query and per phase,
mean tool cost). ``--prm`` picks the latent reward: a PRM checkpoint directory, the URL of a
``codetool serve-prm`` server, ``rollout`` (Monte Carlo rollouts with the policy) or ``none``;
``--search.latent`` may be left at its default (``prm``: follow ``--prm``) or agree with it, else
the config is refused. The parts are composed by :mod:`codetool.assemble` (:class:`~codetool.jobs.queries.QueryRunner`
holds them). ``--ray ADDRESS`` runs the queries on the workers of a Ray cluster
(:mod:`codetool.distributed`); this process still plans the resume and writes ``--output``.
Against a policy server the episodes advance on their own (``search.schedule``,
:mod:`codetool.search.schedule`) inside :class:`~codetool.jobs.queries.QueryRunner`, on one machine and in each Ray
worker alike, and the summary shows the servers' client limits and use.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.commands import job_progress
from codetool.jobs.queries import (
    RunConfig,
    load_benchmark,
    method_label,
    query_key,
    record_key,
    run_hash,
    run_queries,
    single_query,
)
from codetool.jobs.run_summary import summary_rows
from codetool.jsonl import check_output
from codetool.progress import JobProgress, ProgressFactory
from codetool.resume import OutputLock, plan_resume

logger = logging.getLogger(__name__)


def execute_run(cfg: RunConfig, *, policy=None, scorer=None, show_summary: bool = True,
                records: list[dict] | None = None) -> Path:
    """Run the search that ``cfg`` describes, appending trajectories to ``cfg.output`` (resumable).

    Args:
        policy (`LLMBackend`, *optional*): a loaded policy to reuse (default: built from ``cfg.policy``).
        scorer (`PRMScorer`, *optional*): a loaded PRM to reuse (default: built from ``cfg.prm``).
        show_summary (`bool`, *optional*, defaults to `True`): print the summary at the end.
        records (`list[dict]`, *optional*): receives every record of the output once the run
            ended (read once: the summary uses them too).
    Returns:
        The trajectory file.
    Raises:
        CodetoolError: the output is a folder, is locked by another run, or holds records written
            with other settings; no queries were selected; the output cannot be written.
    """
    cfg.search.latent = cfg.prm_spec.latent  # --prm decides (checked in RunConfig)
    cfg.search.method = method_label(cfg.search)
    check_output(cfg.output, queries=cfg.queries, tools=cfg.tools)  # before any work
    queries = [single_query(cfg)] if cfg.query is not None else load_benchmark(cfg)
    if not queries:
        raise CodetoolError(f"no queries to run in {cfg.queries or cfg.benchmark}; check --queries, --group, --offset.")
    out = Path(cfg.output)
    if out.is_dir():
        raise CodetoolError(f"--output {out} is a folder; pass a file path such as {out / 'trajectories.jsonl'}.")
    chash = run_hash(cfg)
    with OutputLock(out):
        plan = plan_resume(out, [query_key(q) for q in queries], record_key, chash,
                           retry_failed=cfg.retry_failed, force=cfg.force_resume)
        todo = [q for q in queries if query_key(q) not in plan.done]
        if plan.done:
            logger.info("resuming: %d of %d queries already in %s", len(queries) - len(todo), len(queries), out)
        serving: dict[str, Any] = {}
        prefetch = SummaryPrefetch() if show_summary else None
        if todo:
            with job_progress(run_progress(cfg)) as progress:
                run_queries(cfg, todo, out, chash, policy=policy, scorer=scorer, clients=serving,
                            progress=prefetch.on_first_record(progress) if prefetch else progress)
        else:
            logger.info("nothing to do: all %d queries are in %s", len(queries), out)
    if records is not None:
        from codetool.jsonl import read_jsonl

        records.extend(read_jsonl(out))
    if prefetch is not None:
        prefetch.wait()
        print_summary(out, [q.query_id for q in queries], clients=serving, records=records)
    return out


class SummaryPrefetch:
    """The summary's imports (the metrics with numpy, ``rich``'s table: tenths of a second on a
    busy machine), done in a thread of its own once the first record landed, while the search
    still waits for its server, not after its last reply (issue 39). :meth:`wait` before the
    summary (no import runs in two threads at once)."""

    MODULES = ("codetool.eval.metrics", "rich.console", "rich.table")

    def __init__(self):
        self._thread: threading.Thread | None = None

    def on_first_record(self, progress: ProgressFactory) -> ProgressFactory:
        """``progress`` that also starts the imports when the first record is written."""
        def factory(total: int):
            tick = progress(total)

            def on_record(record: dict) -> None:
                if self._thread is None:
                    self.start()
                tick(record)
            return on_record
        return factory

    def start(self) -> None:
        def load() -> None:
            for name in self.MODULES:
                with contextlib.suppress(Exception):  # the summary imports it again and says what failed
                    importlib.import_module(name)
        self._thread = threading.Thread(target=load, name="codetool-prefetch", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def run_progress(cfg: RunConfig) -> JobProgress:
    """The progress of a run: queries, and the steps sampled inside them (an episode takes at most
    ``max_steps`` steps; beam, best-of-n and lookahead sample several per step). With ``--ray`` the
    steps happen in the workers, so only queries are counted."""
    s = cfg.search
    per_step = {"beam": s.beam_width, "best_of_n": s.n, "lookahead": 1 + s.k * s.lookahead_depth}.get(s.strategy, 1)
    where = Path(cfg.queries).name if cfg.queries else cfg.benchmark or "one query"
    return JobProgress(f"{s.method} on {where}", "queries", "" if cfg.ray else "steps",
                       work_per_unit=s.max_steps * per_step, used=lambda r: len(r.get("steps") or []) * per_step)


def run_command(cfg: RunConfig) -> int:
    """``codetool run``; see the module docstring. Exit status 1 when any selected query failed."""
    records: list[dict] = []
    out = execute_run(cfg, records=records)  # the output's records, read once for the summary and this count
    failed = sum(1 for r in records if r.get("finish_type") == "error" and r.get("config_hash") == run_hash(cfg))
    if failed:
        logger.warning("%d queries in %s ended with an error; rerun with --retry_failed to run only those", failed, out)
        return 1
    return 0


def print_summary(path: Path, query_ids: list[str] | None = None, clients: dict | None = None,
                  records: list[dict] | None = None) -> dict[str, Any]:
    """Print the one-screen summary of a trajectory file (restricted to ``query_ids``), with how
    remote servers were used (from the trajectories) and what this run's ``clients`` measured.
    ``records``: the file's records when they were read already (else it is read here)."""
    from rich.console import Console
    from rich.table import Table

    from codetool.eval.metrics import run_metrics
    from codetool.jsonl import read_jsonl
    from codetool.search.records import Trajectory

    wanted = set(query_ids) if query_ids is not None else None
    rows = read_jsonl(path) if records is None else records
    trajs = [Trajectory.from_dict(r) for r in rows if wanted is None or str(r.get("query_id")) in wanted]
    m = run_metrics(trajs)
    table = Table(title=f"{path} ({m.n} queries)", show_header=False)
    for k, v in summary_rows(m, trajs, clients or {}):
        table.add_row(k, str(v))
    Console().print(table)
    return {"n": m.n, "finish_types": m.finish_types, "scep": m.scep}
