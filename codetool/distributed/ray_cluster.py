"""Units of a long job on a Ray cluster: one actor per worker slot, results written by the driver.

The command that starts the job (``codetool run --ray ADDRESS``, ``codetool build-trees --ray
ADDRESS``) stays the *driver*: it plans the resume, holds the output lock and is the only writer
of the output JSONL, exactly as on one machine. :func:`run_on_ray` starts ``workers`` Ray actors;
each builds its own *runner* (the command's policy client or model, PRM, executor and tool
environment: ``codetool.jobs.queries.QueryRunner`` or ``codetool.jobs.trees.TreeRunner``) once, then runs
batches of units that the driver sends it and returns their records. The driver appends each
record as its batch comes back, so the file grows while the job runs and a killed driver resumes
like any single-machine run.

Failures, and what becomes of the units:

- a worker is lost (its process or its node died, Ray's memory monitor killed it): the units of
  its unfinished calls go to the other workers, each at most ``retries`` more times (a unit that
  keeps killing its worker is then recorded as an error); Ray restarts the actor where its node
  lives on (``max_restarts=-1``) and the driver sends it work again once it answers;
- a runner raises (not a unit's own error, which the runner already records): the batch is split
  and each unit runs alone once; one that still raises is recorded as an error, as
  :func:`codetool.resume.run_isolated` does on one machine;
- records are keyed (``record_key``): a unit's record is written once, whatever was retried.

Why the driver, and not Ray's own actor-task retries, sends lost units again: Ray retries a call
on a restarted actor of the same slot, which never comes back when its node is gone; the driver
sends the unit to any live worker. Limits: every node needs codetool (same version) and the
files the command reads (models, benchmark data) at the same paths: workers change into the
driver's working directory when it exists there, as on a shared file system; secrets (API keys)
come from each node's own environment and are never shipped. Results are the same as on one
machine for the same batches (seeds come from the units, not from the worker).

:class:`WorkersGroup` (and :class:`ShardedWorkersGroup`) are the settings of where a job's units
run, composed by ``run`` and ``build-trees``.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.config_groups import Group
from codetool.resume import error_message

logger = logging.getLogger(__name__)

# The node address of a Ray started by this process (``--ray local``) or joined on loopback. Left
# to itself Ray picks the machine's non-loopback address and its GCS and raylets listen on every
# interface; and Ray (2.x) rewrites a node address or cluster address of 127.0.0.1/localhost into
# that address too (``ray start --head --node-ip-address 127.0.0.1`` listens on the network). Its
# one switch for "this machine only" is LOCAL_ONLY_ENV=0, read when ray is imported and inherited
# by the processes it starts (:func:`pin_loopback`).
LOOPBACK = "127.0.0.1"
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def pin_loopback(ray=None) -> None:
    """Keep the Ray of this process on loopback: sets ``LOCAL_ONLY_ENV=0`` for Ray and the
    processes it starts (unless the user set it), and, when ``ray`` is already imported, its
    constant read from it (private to Ray: only set when present)."""
    os.environ.setdefault(LOCAL_ONLY_ENV, "0")
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and os.environ[LOCAL_ONLY_ENV] == "0" and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False


def is_loopback_address(address: str) -> bool:
    """Whether a ``--ray`` address names a cluster on this machine's loopback (``local``, or a
    ``host:port`` / ``ray://host:port`` whose host is 127.x, ``localhost`` or ``::1``; ``auto``
    counts when ``RAY_ADDRESS`` does)."""
    from codetool.serving import is_loopback

    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
    if address == "local":
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return bool(host) and is_loopback(host)


@dataclass
class ClusterConfig:
    """How a ``--ray`` job uses the cluster (``--cluster.workers 8 --cluster.gpus_per_worker 1``)."""

    workers: int = option(0, "worker slots (one Ray actor each, with its own policy, executor and tools); 0: as "
                          "many as the cluster's CPUs allow (its GPUs with gpus_per_worker > 0)")
    cpus_per_worker: float = option(1.0, "CPUs Ray reserves for each worker")
    gpus_per_worker: float = option(0.0, "GPUs Ray reserves for each worker (1 for a local policy on a GPU; 0 for "
                                    "a policy behind a server)")
    batch: int = option(0, "units per call to a worker; 0: the command's own batch (search.concurrency for run, "
                        "batch_trees for build-trees)")
    in_flight: int = option(2, "calls queued per worker (one runs, the others wait), so no worker idles between "
                            "batches")
    retries: int = option(3, "times a unit goes to another worker after its worker was lost (process or node "
                          "died); then it is recorded as an error")
    wait_s: float = option(1800.0, "stop (the output resumes) when no worker has been alive for this many seconds, "
                           "model loading included")

    def __post_init__(self):
        if self.workers < 0 or self.batch < 0 or self.retries < 0:
            raise ConfigError(f"cluster.workers, cluster.batch and cluster.retries must be >= 0, got {self.workers}, "
                              f"{self.batch}, {self.retries}.")
        if self.in_flight < 1 or self.wait_s <= 0:
            raise ConfigError(f"cluster.in_flight must be >= 1 and cluster.wait_s > 0, got {self.in_flight}, "
                              f"{self.wait_s}.")
        if self.cpus_per_worker < 0 or self.gpus_per_worker < 0:
            raise ConfigError(f"cluster.cpus_per_worker and gpus_per_worker must be >= 0, got {self.cpus_per_worker}, "
                              f"{self.gpus_per_worker}.")
        if self.workers == 0 and self.cpus_per_worker == 0 and self.gpus_per_worker == 0:
            raise ConfigError("cluster.workers 0 counts workers by cpus_per_worker or gpus_per_worker, but both are 0: "
                              "set cluster.workers, or give each worker a CPU or GPU.")


@dataclass
class RayStats:
    """What a ``--ray`` job did: units sent, records written, workers lost, units sent again.

    ``duplicates`` counts records dropped because their unit was already written; ``per_worker``
    the records each worker returned; ``seconds`` the driver's wall time (start-up included).
    """

    units: int = 0
    workers: int = 0
    records: int = 0
    errors: int = 0
    lost_workers: int = 0
    resent: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    per_worker: list[int] = field(default_factory=list)

    def line(self) -> str:
        """One log line with every number."""
        return (f"ray: {self.units} units on {self.workers} workers in {self.seconds:.1f} s: {self.records} records "
                f"written ({self.errors} errors), {self.lost_workers} workers lost, {self.resent} units sent again, "
                f"{self.duplicates} duplicate results dropped; records per worker {self.per_worker}")


def _ray():
    try:
        import ray
    except ImportError:
        raise CodetoolError("--ray needs Ray: pip install 'codetool[ray]' (or pip install ray) on the driver and on "
                            "every node of the cluster.") from None
    return ray


class _Worker:
    """One worker slot: builds ``factory(*args)`` once and runs batches of units with it."""

    def __init__(self, factory: Callable, args: tuple, cwd: str, log_level: int):
        from codetool.secrets import RedactingFilter

        if os.path.isdir(cwd):  # the driver's relative paths (models, data, checkpoints) mean the same here
            os.chdir(cwd)
        root = logging.getLogger()
        if not any(isinstance(f, RedactingFilter) for h in root.handlers for f in h.filters):
            handler = logging.StreamHandler()
            handler.addFilter(RedactingFilter())
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            root.addHandler(handler)
        logging.getLogger("codetool").setLevel(log_level)
        self.where = f"{socket.gethostname()} pid {os.getpid()}"
        self.runner, self.error = None, None
        try:
            self.runner = factory(*args)
        except Exception as e:  # noqa: BLE001 - told to the driver by ready(), in one line
            self.error = error_message(e)

    def ready(self) -> str:
        if self.error:
            raise CodetoolError(f"{self.where}: {self.error}")
        return self.where

    def run(self, units: list) -> list[dict]:
        records: list[dict] = []
        assert self.runner is not None  # the driver calls run() only after ready() passed
        self.runner.run(units, records.append)
        return records


def _slots(ray, cluster: ClusterConfig, address: str) -> int:
    if cluster.workers:
        return cluster.workers
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    n = int(gpus // cluster.gpus_per_worker) if cluster.gpus_per_worker else int(cpus // cluster.cpus_per_worker)
    if cluster.gpus_per_worker and cluster.cpus_per_worker:
        n = min(n, int(cpus // cluster.cpus_per_worker))
    if n < 1:
        raise CodetoolError(f"the Ray cluster at {address} has {cpus:g} CPUs and {gpus:g} GPUs: no room for one worker "
                            f"of {cluster.cpus_per_worker:g} CPUs and {cluster.gpus_per_worker:g} GPUs; lower "
                            "--cluster.cpus_per_worker / gpus_per_worker, or add nodes.")
    return n


def run_on_ray(address: str, cluster: ClusterConfig, units: list, *, unit_key: Callable[[Any], str],
               record_key: Callable[[dict], str], runner: tuple[Callable, tuple],
               on_record: Callable[[dict], None], on_error: Callable[[Any, BaseException], None],
               batch: int) -> RayStats:
    """Run ``units`` on Ray workers; hand every record to ``on_record`` on this process.

    Args:
        address (`str`): ``auto`` (the cluster of ``ray start`` / ``RAY_ADDRESS``), ``host:port``,
            ``ray://host:10001`` (Ray Client) or ``local`` (a Ray started here for this job, pinned
            to 127.0.0.1, so nothing of it listens beyond this machine; a cluster address on
            loopback is joined on loopback: :func:`pin_loopback`).
        cluster (`ClusterConfig`): worker slots, their resources, batch size, retries.
        units (`list`): picklable units (e.g. ``BenchmarkQuery``), sent in batches of ``batch``
            (``cluster.batch`` when set).
        unit_key, record_key (`Callable`): a unit's and a record's identity (the same for a unit
            and its record).
        runner (`tuple`): ``(factory, args)``; each worker calls ``factory(*args)`` once and then
            ``runner.run(batch, on_record)`` per batch.
        on_record (`Callable[[dict], None]`): called once per unit with its record, in the order
            records come back (the command appends it to its JSONL file).
        on_error (`Callable[[unit, BaseException], None]`): called for a unit that cannot be run
            (its worker kept dying, or its runner raised when it ran alone).
    Returns:
        The job's :class:`RayStats`.
    Raises:
        CodetoolError: Ray is not installed or not reachable, no worker fits the cluster, or no
            worker has been alive for ``cluster.wait_s`` (the records written so far stay).
    """
    if is_loopback_address(address):  # before Ray is imported, where it can be
        pin_loopback(sys.modules.get("ray"))
    ray = _ray()
    start = time.perf_counter()
    owned = not ray.is_initialized()
    if owned:
        kwargs: dict[str, Any] = {"namespace": "codetool", "log_to_driver": True, "logging_level": logging.WARNING}
        if address == "local":  # a Ray started here for this job listens on loopback only (Ray would
            kwargs.update(include_dashboard=False, _node_ip_address=LOOPBACK)  # pick this machine's address)
        try:
            ray.init(address=None if address == "local" else address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise CodetoolError(f"--ray {address}: cannot connect to a Ray cluster ({error_message(e)}); start one "
                                f"with `{LOCAL_ONLY_ENV}=0 ray start --head` (on one machine: loopback only) and "
                                f"pass its address ({LOOPBACK}:PORT), or --ray local.") from None
    batch = max(1, cluster.batch or batch)
    actors: list = []
    try:
        n = min(_slots(ray, cluster, address), -(-len(units) // batch))
        stats = RayStats(units=len(units), workers=n, per_worker=[0] * n)
        actor_class = ray.remote(_Worker).options(num_cpus=cluster.cpus_per_worker,
                                                  num_gpus=cluster.gpus_per_worker, max_restarts=-1,
                                                  max_task_retries=0)
        level = logging.getLogger("codetool").getEffectiveLevel()
        actors = [actor_class.remote(runner[0], runner[1], os.getcwd(), level) for _ in range(n)]
        _dispatch(ray, cluster, actors, units, batch, unit_key, record_key, on_record, on_error, stats)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if owned:
            ray.shutdown()
    stats.seconds = time.perf_counter() - start
    logger.info("%s", stats.line())
    return stats


def _dispatch(ray, cluster: ClusterConfig, actors: list, units: list, batch: int, unit_key, record_key, on_record,
              on_error, stats: RayStats) -> None:
    """The driver's loop: keep every live worker ``in_flight`` calls deep until every unit has a record."""
    exceptions = ray.exceptions
    RayError, RayTaskError = exceptions.RayError, exceptions.RayTaskError
    restarting = getattr(exceptions, "ActorUnavailableError", ())  # Ray is restarting the actor: ask again later
    batches = deque(units[i:i + batch] for i in range(0, len(units), batch))
    starting = {actor.ready.remote(): i for i, actor in enumerate(actors)}  # ping -> worker
    calls: dict[Any, tuple[int, list]] = {}  # call -> (worker, its units)
    load = [0] * len(actors)
    alive: set[int] = set()
    lost_times: dict[str, int] = {}
    written: set[str] = set()
    first_error: BaseException | None = None
    ask_again: dict[int, float] = {}  # worker -> when to ping it again (Ray is restarting it)
    last_alive = time.monotonic()
    while batches or calls:
        for i, when in list(ask_again.items()):
            if time.monotonic() >= when:
                del ask_again[i]
                starting[actors[i].ready.remote()] = i
        for i in sorted(alive, key=lambda w: load[w]):
            while batches and load[i] < cluster.in_flight:
                units_ = batches.popleft()
                calls[actors[i].run.remote(units_)] = (i, units_)
                load[i] += 1
        if alive:
            last_alive = time.monotonic()
        elif not starting and not calls and not ask_again:
            raise CodetoolError(f"no Ray worker could start ({_why(first_error) if first_error else 'none left'}); "
                                "the records written so far stay, and the same command resumes.")
        elif time.monotonic() - last_alive > cluster.wait_s:
            raise CodetoolError(f"no Ray worker has been alive for {cluster.wait_s:g} s ({len(batches)} batches left); "
                                "add nodes or raise --cluster.wait_s, then run the same command again: it resumes.")
        ready, _ = ray.wait(list(calls) + list(starting), num_returns=1, timeout=5.0)
        for ref in ready:
            if ref in starting:
                i = starting.pop(ref)
                try:
                    logger.info("ray worker %d ready on %s", i, ray.get(ref))
                    alive.add(i)
                except restarting:
                    ask_again[i] = time.monotonic() + 5.0
                except RayTaskError as e:  # its runner could not be built (a model, a server, a setting)
                    first_error = first_error or getattr(e, "cause", None) or e
                    logger.warning("ray worker %d could not start: %s", i, _why(first_error))
                except RayError as e:
                    first_error = first_error or e
                    logger.warning("ray worker %d could not start: %s", i, error_message(e))
                continue
            i, units_ = calls.pop(ref)
            load[i] -= 1
            try:
                records = ray.get(ref)
            except RayTaskError as e:  # the runner raised (not one unit's own error, which it records)
                cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
                if len(units_) > 1:
                    logger.warning("a batch of %d units failed on worker %d (%s); each runs alone", len(units_), i,
                                   error_message(cause))
                    batches.extendleft([u] for u in reversed(units_))
                else:
                    on_error(units_[0], cause)
                    stats.errors += 1
                continue
            except RayError as e:  # the worker died: its process or its node
                _lost(ray, i, e, actors, alive, starting, stats)
                again = []
                for u in units_:
                    key = unit_key(u)
                    lost_times[key] = lost_times.get(key, 0) + 1
                    if lost_times[key] > cluster.retries:
                        on_error(u, CodetoolError(f"its Ray worker was lost {lost_times[key]} times (last: "
                                                  f"{error_message(e)}); the unit may crash its worker (memory?)"))
                        stats.errors += 1
                    else:
                        again.append(u)
                if again:
                    batches.appendleft(again)
                    stats.resent += len(again)
                continue
            stats.per_worker[i] += len(records)
            returned = set()
            for record in records:
                key = record_key(record)
                returned.add(key)
                if key in written:
                    stats.duplicates += 1
                    continue
                written.add(key)
                on_record(record)
                stats.records += 1
            for u in units_:
                if unit_key(u) not in returned and unit_key(u) not in written:
                    on_error(u, CodetoolError("its Ray worker returned no record for it"))
                    stats.errors += 1


def _why(error: BaseException) -> str:
    """One line: a CodetoolError's own message (it says what to fix), else the type and message."""
    return " ".join(str(error).split())[:500] if isinstance(error, CodetoolError) else error_message(error)


def _lost(ray, i: int, error: BaseException, actors: list, alive: set[int], starting: dict, stats: RayStats) -> None:
    """Take worker ``i`` out of service after a failed call; ping it, so it is back once Ray restarts it."""
    if i not in alive:
        return
    alive.discard(i)
    stats.lost_workers += 1
    logger.warning("ray worker %d lost (%s); its units go to the other workers", i, error_message(error))
    starting[actors[i].ready.remote()] = i


@dataclass
class WorkersGroup(Group):
    """Where a job's units run: here, or on the workers of a Ray cluster (:func:`run_on_ray`)."""

    ray: str | None = option(None, "run the units (queries, trees) on a Ray cluster: its address (auto, host:port, "
                             "ray://host:10001) or local (started here, on 127.0.0.1); this process writes --output (pip "
                             "install 'codetool[ray]'; on one machine start Ray on loopback with "
                             "`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head`)")
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


@dataclass
class ShardedWorkersGroup(WorkersGroup):
    """:class:`WorkersGroup` plus a shard of the units (machines without a shared cluster each build
    one shard; ``build-trees --merge`` joins them).

    Raises:
        ConfigError: a ``shard`` that is not ``i/n`` with ``0 <= i < n``.
    """

    shard: str | None = option(None, "i/n: build only the i-th of n shards of the queries")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard is not None:
            self.shard_index()

    def shard_index(self) -> tuple[int, int]:
        """``(i, n)`` parsed from ``shard``; ``(0, 1)`` when unsharded."""
        if self.shard is None:
            return 0, 1
        try:
            i, n = (int(x) for x in str(self.shard).split("/"))
        except ValueError:
            raise ConfigError(f"--shard must look like i/n (e.g. 0/2), got {self.shard!r}.") from None
        if not 0 <= i < n:
            raise ConfigError(f"--shard {self.shard}: need 0 <= i < n.")
        return i, n
