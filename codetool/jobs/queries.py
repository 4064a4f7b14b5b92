"""The unit runner of ``codetool run`` (the command is :mod:`codetool.commands.run`): the run's
settings (:class:`RunConfig`), which queries it searches (:func:`load_benchmark`,
:func:`single_query`), and :class:`QueryRunner`, what one machine or one Ray worker needs to search
them; :func:`run_queries` runs it here or hands it to :func:`codetool.distributed.run_on_ray`
(``--ray``), writing one trajectory record per query. The parts come from :mod:`codetool.assemble`.

Against a server nothing a finished trajectory needs holds back the next episode (issue 39): the
reference re-run of its steps and its final answer run beside the search (a
:class:`~codetool.streaming.Finisher`; up to 16 episodes in the place of those the job no longer
has re-run each step as it is chosen, :mod:`codetool.search.reference_stepwise`, so the job's end
waits for their last steps only), its record is written in a thread of its own, episodes
share sandbox families and start their sandbox while their first step is generated
(:class:`codetool.executor.FamilyPool`), and ``max_memory_mb`` caps what the episodes in flight add to
the client's memory (:mod:`codetool.memory_use`); docs/SCALE.md has the measurements.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.assemble import executor_factory, make_scorer, make_search, make_task, tool_backend
from codetool.config import ConfigError, config_hash, option
from codetool.config_groups import with_defaults
from codetool.decide.stage import RouterConfig
from codetool.distributed.ray_cluster import WorkersGroup
from codetool.executor import ExecutorConfig, started_in_background
from codetool.jobs import ProgressFactory
from codetool.jsonl import append_jsonl
from codetool.memory_use import MemoryGroup, memory_gate
from codetool.models.remote import RemoteConfig
from codetool.models.spec import ModelSpec, PolicyBackendGroup
from codetool.resume import (
    FatalError,
    OutputGroup,
    UnitRunner,
    error_message,
    refuse_duplicates,
    run_isolated,
    unit_key,
)
from codetool.rewards import machine_failure
from codetool.search.answer import AnswerConfig, needs_answer, write_final_answers
from codetool.search.config import SearchConfig
from codetool.search.reference import record_reference_steps
from codetool.search.reference_stepwise import StepwiseReferences
from codetool.search.schedule import closed_on_interrupt, is_continuous, planned_units
from codetool.streaming import Finisher
from codetool.tools.config import ToolsGroup
from codetool.tools.loaders import BENCHMARKS, QueriesGroup

logger = logging.getLogger(__name__)



@with_defaults(output="runs/run/trajectories.jsonl")
class RunOutput(OutputGroup):
    """The output group of ``codetool run``."""


RERUNS_AT_ONCE = 16  # reference re-runs of finished trajectories in flight at once (each holds a sandbox)


@dataclass
class RunConfig(QueriesGroup, PolicyBackendGroup, ToolsGroup, RunOutput, WorkersGroup, MemoryGroup):
    """Settings of ``codetool run``: the groups it composes (queries, policy, tools, output,
    workers) and its own. ``__post_init__`` parses ``prm`` once into ``prm_spec`` (beside the
    policy group's ``policy_spec``; neither is a setting)."""

    query: str | None = option(None, "one query to solve (with --tools)")
    tools: str | None = option(None, "the APIs: for --query, an OpenAPI 3 spec (JSON or YAML), an api_list or one "
                               "ToolBench query; for RestGPT-layout --queries, its OpenAPI spec; for ToolBench "
                               "queries that list API names only, ToolBench's toolenv/tools folder")
    queries: str | None = option(None, "a query file or folder (sets --benchmark toolbench): ToolBench/StableToolBench "
                                 "format, or RestGPT's layout (a list of {query, solution}) with --tools SPEC")
    prm: str = option("none", "latent reward: a PRM checkpoint dir, a serve-prm URL (several: comma-separated), "
                      "rollout, or none")
    prm_device: str = option("auto", "device of a local PRM")
    router: bool = option(False, "decide first (When2Tool): route easy queries past the full search")
    prm_client: RemoteConfig = field(default_factory=RemoteConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    routing: RouterConfig = field(default_factory=RouterConfig)
    answer: AnswerConfig = field(default_factory=AnswerConfig)

    def __post_init__(self):
        super().__post_init__()  # each group's checks; the policy group parses policy_spec
        if self.queries and self.benchmark is None and self.query is None:
            self.benchmark = "toolbench"  # queries from a file: --queries alone says which
        if self.query is None and self.tools and self.benchmark in ("stabletoolbench", "restbench-tmdb"):
            raise ConfigError(f"--tools {self.tools} is not read with --benchmark {self.benchmark} (its queries bring "
                              "their own APIs); pass your queries with --queries FILE --tools SPEC, or one query "
                              "with --query TEXT --tools SPEC.")
        if (self.query is None) == (self.benchmark is None):
            raise ConfigError("give either --query (with --tools) or --benchmark "
                              f"({', '.join(BENCHMARKS)}), not both and not neither.")
        if self.query is not None and not self.query.strip():
            raise ConfigError(f"--query is {self.query!r}: give the question to answer.")
        if self.query is not None and not self.tools:
            raise ConfigError("--query needs --tools FILE: an OpenAPI spec, a JSON api_list or one ToolBench query.")
        if self.benchmark == "toolbench" and not self.queries:
            raise ConfigError("--benchmark toolbench needs --queries FILE_OR_FOLDER (ToolBench format).")
        if self.queries and self.benchmark not in (None, "toolbench"):
            raise ConfigError(f"--queries {self.queries} is read only with --benchmark toolbench; --benchmark "
                              f"{self.benchmark} reads its own files (choose them with --group, --subset, --offset "
                              "and --limit), or pass --benchmark toolbench for a ToolBench-format file.")
        self.prm_spec = ModelSpec.parse(self.prm, role="prm", device=self.prm_device, client=self.prm_client)
        latent = self.prm_spec.latent
        if getattr(self.search, "latent", "prm") not in ("prm", latent):
            raise ConfigError(f"--search.latent {self.search.latent} disagrees with --prm {self.prm!r} (which means "
                              f"latent {latent}); --prm decides the latent reward: pass --prm {self.search.latent} "
                              "or leave --search.latent at its default.")


def load_benchmark(cfg: RunConfig) -> list:
    """The ``BenchmarkQuery`` list that ``cfg`` asks for, after ``offset`` and ``limit``."""
    from codetool.tools.files import load_queries
    from codetool.tools.loaders import load_restbench, load_stabletoolbench

    root = Path(cfg.data_dir) if cfg.data_dir else None
    if cfg.benchmark == "world":  # generated, deterministic: offset and limit select, nothing is read
        from codetool.world import load_queries as load_world_queries

        return load_world_queries(cfg.group, cfg.limit, offset=cfg.offset)
    if cfg.benchmark == "stabletoolbench":
        queries = load_stabletoolbench(cfg.group, root, subset=cfg.subset if cfg.subset in ("full", "codetool") else "codetool")
    elif cfg.benchmark == "restbench-tmdb":
        queries = load_restbench(root, source=cfg.subset if cfg.subset in ("restgpt", "codetool") else "restgpt")
    else:
        assert cfg.queries is not None  # RunConfig: --benchmark toolbench needs --queries
        queries = load_queries(Path(cfg.queries), cfg.tools)
    refuse_duplicates([query_key(q) for q in queries], cfg.queries or f"{cfg.benchmark} {cfg.group or ''}".strip())
    end = None if cfg.limit is None else cfg.offset + cfg.limit
    if cfg.offset >= len(queries):
        raise CodetoolError(f"--offset {cfg.offset} skips all {len(queries)} queries of {cfg.benchmark}"
                            + (f" ({cfg.queries})" if cfg.queries else "") + ".")
    selected = queries[cfg.offset:end]
    if selected and all(q.extra.get("load_error") for q in selected):  # say so before a model is loaded for nothing
        raise CodetoolError(f"{cfg.queries or cfg.benchmark}: not one of the {len(selected)} selected entries is a "
                            f"query (entry {selected[0].query_id}: {selected[0].extra['load_error']}); pass a "
                            "ToolBench-format file (a list of {query, query_id, api_list}).")
    return selected


def single_query(cfg: RunConfig):
    """A ``BenchmarkQuery`` for ``--query`` with the APIs of ``--tools``
    (:func:`codetool.tools.files.load_tools`: a query file there is refused, named as such)."""
    from codetool.tools.files import load_tools
    from codetool.tools.loaders import BenchmarkQuery

    assert cfg.tools is not None and cfg.query is not None  # RunConfig: --query needs --tools
    path = Path(cfg.tools)
    if not path.exists():
        raise CodetoolError(f"--tools file not found: {path}.")
    return BenchmarkQuery(query_id="query", query=cfg.query, apis=load_tools(path), benchmark="custom")


def run_hash(cfg: RunConfig) -> str:
    """The config hash stored in trajectories (what changes results; not paths or limits)."""
    return config_hash(cfg, ignore=("output", "offset", "limit", "data_dir", "prm_device", "retry_failed",
                                    "force_resume", "ray", "cluster", "policy_client", "prm_client",
                                    "max_memory_mb"))


def query_key(q) -> str:
    """The resume key of a ``BenchmarkQuery`` (benchmark, group, query id)."""
    return unit_key("restbench-tmdb" if q.benchmark == "restbench" else q.benchmark, q.group, q.query_id)


def record_key(r: dict) -> str:
    """The resume key of a trajectory record, as :func:`query_key` makes it for its query."""
    return unit_key(r.get("benchmark"), r.get("group"), r.get("query_id"))


def _unit_key(x) -> str:  # a SearchTask or a Trajectory
    return unit_key(x.benchmark, x.group, x.query_id)


def method_label(search: SearchConfig) -> str:
    """The method name trajectories carry: ``search.method``, except that the default label
    (``spot+latent``) of a run without a PRM says what ran instead: ``single-sample`` (k = 1),
    ``spot+rollout`` (rollout values: ``latent: rollout``, or the ``lookahead`` strategy) or ``spot-only``."""
    if search.method != "spot+latent" or search.latent == "prm":
        return search.method
    rollouts = search.latent == "rollout" or search.strategy == "lookahead"
    return "single-sample" if search.k == 1 else "spot+rollout" if rollouts else "spot-only"


def run_queries(cfg: RunConfig, todo: list, out: Path, chash: str, *, policy=None, scorer=None,
                clients: dict | None = None, progress: ProgressFactory | None = None) -> int:
    """Search every query of ``todo`` here, or on Ray workers with ``--ray``; one record per query
    appended to ``out`` (a query that fails gets an error record).

    Args:
        policy (`LLMBackend`, *optional*), scorer (`PRMScorer`, *optional*): loaded parts to reuse.
        clients (`dict`, *optional*): receives this process's remote clients, whose ``stats()`` the
            summary shows (a Ray worker's stay on the worker; its trajectories still carry their
            ``serving`` records).
        progress (`Callable[[int], Callable[[dict], None]]`, *optional*): called once with the
            number of queries; what it returns is called with each record once it is written.
    Returns:
        The number of queries that failed.
    Raises:
        FatalError: a record could not be written (a full disk stops the run).
    """
    start, counts = time.perf_counter(), {"failed": 0}
    tick = progress(len(todo)) if progress is not None else None

    def land(record: dict) -> None:
        try:
            append_jsonl(out, record)
        except CodetoolError as e:  # a full disk stops the run; it is not one query's fault
            raise FatalError(str(e)) from None
        counts["failed"] += record.get("finish_type") == "error"
        if tick is not None:
            tick(record)

    if cfg.ray:
        from codetool.distributed import run_on_ray

        run_on_ray(cfg.ray, cfg.cluster, todo, unit_key=query_key, record_key=record_key,
                   runner=(QueryRunner, (cfg, chash)), on_record=land,
                   on_error=lambda q, e: land(error_record(cfg, chash, q, e)), batch=ray_batch(cfg))
    else:
        with QueryRunner(cfg, chash, policy, scorer) as runner:
            if clients is not None:
                clients.update(runner.clients())
            runner.run(todo, land)
    logger.info("ran %d queries in %.1f s (%d failed)", len(todo), time.perf_counter() - start, counts["failed"])
    return counts["failed"]


def ray_batch(cfg: RunConfig) -> int:
    """Queries per call to a Ray worker (unless ``cluster.batch`` is set): as many as one worker
    keeps in flight, ``search.concurrency`` or what its search picks for its policy."""
    return planned_units(cfg.search.concurrency, cfg.policy_spec.remote, cfg.search.schedule, cfg.policy_client,
                         local_default=4, per_unit=cfg.search.k)


def error_record(cfg: RunConfig, chash: str, unit, error: BaseException | str) -> dict:
    """The trajectory record of a query whose run failed (``finish_type: error``, a one-line message).
    An error that is the machine's (``codetool.rewards.machine_failure``: a sandbox that could not
    be started or used, a policy or PRM server that failed the request after every retry) gave the
    policy no turn: the record says so as the search does (``extra["not_executed"]``), so no rate
    counts it (an error the server answered, HTTP 400, stays the query's own)."""
    from codetool.search.records import Trajectory

    benchmark = "restbench-tmdb" if unit.benchmark == "restbench" else unit.benchmark
    message = error if isinstance(error, str) else error_message(error)
    machine = machine_failure(error)
    extra = {"not_executed": {"step": 0, "reason": message}} if machine else {}
    return Trajectory(query_id=unit.query_id, query=unit.query, benchmark=benchmark, group=unit.group,
                      method=cfg.search.method, config_hash=chash, finish_type="error",
                      error=message, extra=extra).to_dict()


class QueryRunner(UnitRunner):
    """What one machine, or one Ray worker, needs to run queries: the policy, the PRM, the search
    and an open tool backend (closed by ``close``, or at the end of a ``with`` block).

    Args:
        cfg (`RunConfig`): the run's settings.
        chash (`str`): the config hash stored in every record.
        policy (`LLMBackend`, *optional*), scorer (`PRMScorer`, *optional*): loaded parts to reuse.
    """

    def __init__(self, cfg: RunConfig, chash: str, policy=None, scorer=None):
        import codetool.assemble as assemble  # read at call time: tests substitute a scripted policy
        from codetool.models.loading import resolve_model

        self.cfg, self.chash = cfg, chash
        spec = cfg.policy_spec
        if policy is None and spec.kind == "local":  # a mistyped policy path fails before the PRM loads
            resolve_model(spec.location)
        # the PRM before the policy: a PRM folder that does not exist fails at once, not after the policy loaded
        self.scorer = make_scorer(cfg.prm_spec, cfg.prm_device, client=cfg.prm_client) if scorer is None else scorer
        if scorer is None and hasattr(self.scorer, "check_reachable"):
            self.scorer.check_reachable()  # a dead PRM server stops the run before the policy's first round
        self.policy = policy or assemble.make_policy(spec)
        self.continuous = is_continuous(self.policy, cfg.search.schedule)
        # against a server a memory cap holds new episodes back (codetool.memory_use): what this process
        # has is measured before the executors' first process (their principal check) starts
        self.gate = memory_gate(cfg.max_memory_mb) if self.continuous else None
        self.make_executor = executor_factory(cfg.executor)
        # against a server an episode's sandbox starts while its first step is generated
        episode_executor = started_in_background(self.make_executor) if self.continuous else self.make_executor
        # against a server each chosen step's reference program runs while the episode goes on
        self.reference = (StepwiseReferences(self.make_executor, RERUNS_AT_ONCE)
                          if self.continuous and cfg.search.reference_steps else None)
        self.search = make_search(self.policy, cfg.search, episode_executor, scorer=self.scorer, config_hash=chash,
                                  admit=self.gate.admit if self.gate is not None else None,
                                  on_step=self.reference.on_step if self.reference is not None else None)
        self.backend = self.open(tool_backend(cfg.tools_backend, benchmark=cfg.benchmark, data_dir=cfg.data_dir,
                                              server_url=cfg.tool_server_url, cache_dir=cfg.tool_cache_dir))

    def run(self, queries: list, on_record) -> int:
        """Search ``queries`` (``BenchmarkQuery``) and call ``on_record(dict)`` once per query with its
        trajectory record (one call at a time); a malformed query, or one whose episode raises, gets
        an error record and the others go on. Returns the number of error records.

        Against a server (continuous scheduling) what a finished trajectory still needs (the
        reference re-run of its steps, its final answer) runs in a :class:`Finisher` beside the
        search, one trajectory per job, so no episode waits for it; under batched rounds it runs
        between rounds and final answers are written in batches of ``search.episodes`` (a local
        model decodes them together), as before."""
        cfg = self.cfg
        answers = cfg.answer.enabled(cfg.benchmark)
        waiting: list = []  # trajectories that await their final answer (written in batches)
        ended = [0]  # episodes that ended (their trajectory handed on, or their unit failed)
        failed = 0
        lock = threading.Lock()  # on_record is called by one thread at a time

        def land(traj) -> None:
            nonlocal failed
            with lock:
                failed += traj.finish_type == "error"
                on_record(traj.to_dict())

        def flush() -> None:
            write_final_answers(waiting, self.policy, cfg.answer)
            for traj in waiting:
                land(traj)
            waiting.clear()

        settings = fidelity_settings(cfg, self.scorer)
        finisher = Finisher(max(self.search.episodes, 1), land) if self.continuous else None
        reruns = threading.BoundedSemaphore(RERUNS_AT_ONCE)  # reference re-runs (sandboxes) at once

        def complete(traj):  # in a finisher thread: what the trajectory still needs
            task = by_key.get(_unit_key(traj))
            stepwise = self.reference.take(traj) if self.reference is not None else None
            if cfg.search.reference_steps and task is not None:
                if stepwise is not None:  # its steps ran while the episode went on: the last one is left
                    stepwise.finish(traj)
                else:
                    with reruns:
                        record_reference_steps(traj, task, self.make_executor)
            elif stepwise is not None:
                stepwise.close()
            if answers and needs_answer(traj, cfg.answer):
                write_final_answers([traj], self.policy, cfg.answer)  # one request, as in a batch
            return traj

        def done(traj) -> None:
            ended[0] += 1
            if traj.finish_type == "error":  # a dead policy or PRM server stops the run (not recorded)
                self.stop_if_unreachable()
            traj.extra["fidelity"] = settings
            if finisher is not None:
                finisher.submit(complete, traj)
                return
            task = by_key.get(_unit_key(traj))
            if cfg.search.reference_steps and task is not None:  # the public code's step statuses (SCEP)
                record_reference_steps(traj, task, self.make_executor)
            if answers and needs_answer(traj, cfg.answer):  # CodeTool: every trajectory gets a final answer
                waiting.append(traj)
                if len(waiting) >= self.search.episodes:
                    flush()
            else:
                land(traj)

        def failed_unit(unit, error: BaseException) -> None:
            nonlocal failed
            ended[0] += _unit_key(unit) in by_key  # (a malformed query never was an episode)
            self.stop_if_unreachable()
            with lock:
                failed += 1
                on_record(error_record(cfg, self.chash, unit, error))

        tasks: list = []
        by_key: dict[str, Any] = {}
        for q in queries:
            try:
                if q.extra.get("load_error"):
                    raise CodetoolError(q.extra["load_error"])
                tasks.append(make_task(q, self.backend, max_response_chars=cfg.max_response_chars,
                                       tool_doc=cfg.tool_doc))
            except Exception as e:  # a malformed query entry fails that query only
                failed_unit(q, e)

        def run_batch(batch, on_done) -> None:
            if cfg.router:
                from codetool.decide.router import route_and_solve

                route_and_solve(batch, cfg.routing, self.search, self.policy, self.make_executor, on_done=on_done)
            else:
                self.search.run(batch, on_done=on_done)

        by_key.update((_unit_key(t), t) for t in tasks)
        if self.reference is not None:  # stepwise re-runs take the place of episodes the job no longer has
            self.reference.spare = lambda: max(0, self.search.episodes - (len(tasks) - ended[0]))
        with closed_on_interrupt(self.policy, self.scorer):  # Ctrl-C cancels what servers are generating
            try:
                run_isolated(tasks, run_batch, _unit_key, done, failed_unit)
                if finisher is not None:
                    finisher.close()
            except BaseException:
                if finisher is not None:
                    finisher.abandon()
                raise
            finally:
                if self.reference is not None:  # what an episode that did not finish had started
                    self.reference.close()
            flush()
        if self.gate is not None:
            self.gate.report()
        return failed

    def stop_if_unreachable(self) -> None:
        """Raise ``FatalError`` when the policy or PRM server cannot be reached (:func:`codetool.jobs.stop_if_unreachable`)."""
        from codetool.jobs import stop_if_unreachable

        stop_if_unreachable({"policy": self.policy, "PRM": self.scorer},
                            "it resumes with the queries not yet in the output (this one included)")

    def clients(self) -> dict[str, Any]:
        """The remote clients among the policy and the PRM (``{"policy": ..., "prm": ...}``: what
        has ``stats()``), for the run summary."""
        return {name: part for name, part in (("policy", self.policy), ("prm", self.scorer))
                if callable(getattr(part, "stats", None))}


def fidelity_settings(cfg: RunConfig, scorer=None) -> dict[str, Any]:
    """The settings of this run where a reference behaviour is an option (docs/FIDELITY.md), for
    each trajectory's ``extra["fidelity"]``: the evaluation's comparability block names each one
    that is not the public code's. ``prm`` holds the PRM's interface and the tree label rules of
    its training rows where the scorer knows them (a local checkpoint)."""
    meta = getattr(scorer, "meta", None) or {}
    fmt = getattr(getattr(scorer, "encoder", None), "fmt", None)
    prm = None if scorer is None else {"interface": getattr(fmt, "interface", None),
                                       "label_rules": meta.get("label_rules")}
    search = {k: getattr(cfg.search, k) for k in ("k", "max_steps", "temperature", "top_p", "w_spot", "w_latent",
                                                   "w_cost", "latent", "seed")}  # what decides a method's numbers
    return {"search": search, "tie_break": cfg.search.tie_break, "observation_cut": cfg.search.observation_cut,
            "max_observation_chars": cfg.search.max_observation_chars,
            "observation_history": cfg.search.observation_history, "step_format": cfg.search.step_format,
            "reference_steps": cfg.search.reference_steps, "final_answer": cfg.answer.final_answer, "prm": prm}


def log_prompt_cache(policy) -> None:
    """Log how much of the prompts a local policy's prompt cache (``codetool.models.prompt_cache``)
    served from memory; nothing for a policy without one."""
    cache = getattr(policy, "prompt_cache", None)
    if cache is not None and cache.hit_tokens + cache.miss_tokens:
        logger.info("policy prompt cache: %d of %d prompt tokens reused (%.0f%%), %.0f MiB held",
                    cache.hit_tokens, cache.hit_tokens + cache.miss_tokens,
                    100 * cache.hit_tokens / (cache.hit_tokens + cache.miss_tokens), cache.nbytes / 2**20)
