"""Many machines on an engine that already runs them: Ray workers for ``run`` and ``build-trees``.

``codetool run --ray ADDRESS`` and ``codetool build-trees --ray ADDRESS`` keep the single-machine
job (resume plan, output lock, one JSONL writer) on the machine that starts the command and hand
whole units (a query's episode, a query's tree) to Ray workers: one actor per worker slot, each
with its own policy client or model, executor and tool environment
(:mod:`codetool.distributed.ray_cluster`). Slurm users run ``--shard i/n`` job arrays with the
templates in ``scripts/slurm/`` instead; nothing here is needed for that.
"""

from codetool.distributed.ray_cluster import ClusterConfig, RayStats, run_on_ray

__all__ = ["ClusterConfig", "RayStats", "run_on_ray"]
