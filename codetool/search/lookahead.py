"""Lookahead (``search.strategy: lookahead``): greedy, each candidate valued by a short rollout.

As HF search-and-learn's lookahead (after Snell et al. 2024), over code steps: every candidate is
scored through the rollout machinery (:mod:`codetool.search.rollout`, ``latent: rollout`` with one
rollout of depth d = ``search.lookahead_depth`` per candidate, sampled at
``search.rollout_temperature``), then CodeTool's greedy choice keeps the best.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from codetool.search.config import SearchConfig
from codetool.search.episode import Episodes, Hook, SearchParts
from codetool.search.greedy import greedy
from codetool.search.records import Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.search import SearchTask


def lookahead(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
              on_done: Hook | None = None) -> list[Trajectory]:
    """Greedy search of every task with rollout-valued candidates; each trajectory gets
    ``strategy = {"name": "lookahead", "depth": d}``; ``on_done`` sees each as it finishes.

    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    sub_cfg = replace(cfg, strategy="greedy", latent="rollout", rollouts=1,
                      rollout_max_steps=cfg.lookahead_depth, w_latent=cfg.w_latent)
    done: list[Trajectory] = []

    def stamp(traj: Trajectory) -> None:
        traj.strategy = {"name": "lookahead", "depth": cfg.lookahead_depth}
        traj.serving = traj.serving or episodes.serving()
        done.append(traj)
        if on_done:
            on_done(traj)

    greedy(tasks, episodes.parts, sub_cfg, stamp)
    return done
