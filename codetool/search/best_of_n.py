"""Best-of-N (``search.strategy: best_of_n``): N independent greedy episodes per query.

The answer is the episode whose chosen steps score best (``search.aggregate``: the last step, the
product or the minimum of their values, :mod:`codetool.search.scores`), as HF search-and-learn's
best-of-N weighted by PRM scores (after Snell et al. 2024), or the vote of the N episodes
(``search.vote``: majority or PRM-weighted, :mod:`codetool.search.vote`). The returned trajectory
carries the compute of all N episodes and a ``strategy`` dict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import replace

from codetool.search.config import SearchConfig
from codetool.search.episode import Episodes, Hook, SearchParts, account, each_query
from codetool.search.greedy import greedy
from codetool.search.records import Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.scores import trajectory_score
from codetool.search.search import SearchTask
from codetool.search.vote import finished_record, vote


def best_of_n(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
              on_done: Hook | None = None) -> list[Trajectory]:
    """The best of ``cfg.n`` greedy episodes of every task (the N are batched together; under
    continuous scheduling queries run side by side, each with its N episodes in flight);
    ``on_done`` sees each final trajectory.

    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    return each_query(episodes, lambda task: _best_of(episodes, task), tasks, cfg.n, on_done)


def _best_of(search: Episodes, task: SearchTask) -> Trajectory:
    """N greedy episodes of ``task``; the best-scored one (ties: a finished answer first, then the
    earlier episode) with the compute of all N."""
    cfg, started = search.cfg, time.perf_counter()
    sub_cfg = replace(cfg, strategy="greedy", vote="none", concurrency=max(search.episodes, cfg.n)
                      if not search.continuous else cfg.n)
    subtasks = [replace(task, query_id=f"{task.query_id}#n{j}") for j in range(cfg.n)]
    trajs = sorted(greedy(subtasks, search.parts, sub_cfg), key=lambda t: int(t.query_id.rsplit("#n", 1)[1]))
    scores = [trajectory_score(t, cfg.aggregate) for t in trajs]
    ballot = vote(trajs, scores, cfg.vote)
    best = ballot.chosen
    out = replace(trajs[best], query_id=task.query_id, generated_tokens=0, prm_scored_tokens=0,
                  tool_calls=0, executor_forks=0)
    for t in trajs:
        account(out, t)
    out.wall_time_s = time.perf_counter() - started
    out.strategy = {"name": "best_of_n", "n": cfg.n, "aggregate": cfg.aggregate, "chosen": best,
                    "scores": [None if math.isinf(s) else round(s, 6) for s in scores],
                    "finish_types": [t.finish_type for t in trajs], "episode_tokens": [t.generated_tokens for t in trajs],
                    "finished": [finished_record(t, s) for t, s in zip(trajs, scores)], **ballot.record(cfg.vote)}
    return out
