"""CodeTool's greedy step choice (``search.strategy: greedy``, the default).

Per step, the best of K candidates is kept and the search never looks back (Lu et al., ACL 2025,
§3); the episodes of many queries run side by side (:meth:`codetool.search.episode.Episodes.run`:
batched rounds for a local policy, continuous scheduling for a server).
"""

from __future__ import annotations

from collections.abc import Iterable

from codetool.search.config import SearchConfig
from codetool.search.episode import Episodes, Hook, SearchParts
from codetool.search.records import Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.search import SearchTask


def greedy(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
           on_done: Hook | None = None) -> list[Trajectory]:
    """Solve every task, ``cfg.concurrency`` episodes at a time, keeping the best candidate per step.

    Args:
        tasks (`Iterable[SearchTask]`): the queries.
        parts (`SearchParts`): policy, PRM scorer, executors and config hash.
        cfg (`SearchConfig`): the settings (``latent: rollout`` values candidates by rollouts).
        on_done (`Callable[[Trajectory], None]`, *optional*): sees each finished trajectory (e.g. to
            append it to a JSONL file) as soon as its episode ends.
    Returns:
        The trajectories, in the order their episodes ended.
    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    finished: list[Trajectory] = []

    def land(traj: Trajectory) -> None:
        finished.append(traj)
        if on_done:
            on_done(traj)

    episodes.run(tasks, land)
    return finished
