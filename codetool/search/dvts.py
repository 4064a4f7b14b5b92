"""Diverse verifier tree search (``search.strategy: dvts``) over code steps.

Beam search keeps the B best children of *all* beams, so a few high-scored parents can fill every
place and the beams collapse onto one line of work. DVTS (Beeching et al., HF search-and-learn,
"Scaling test-time compute with open models", 2024) splits the paths into independent subtrees
instead: ``search.n / search.beam_width`` subtrees, each a beam search of width w =
``search.beam_width`` (K = ``search.k`` children per beam, ranked by the PRM), that never compete
with each other; the answer is the best-scored (or voted, ``search.vote``) of every subtree's
finished beams. At equal ``n`` and ``k`` it samples as many candidates per step as beam search with
B = n. Search-and-learn's DVTS(n, m) (n/m subtrees, one path each, m candidates per step) is
``dvts`` with ``n = n/m``, ``beam_width = 1``, ``k = m``.

The first step samples ``n/w x k`` candidates of the query in one request and deals k to each
subtree; every child runs in its own executor fork, dropped children's forks and expanded parents'
are closed as soon as each step's pick is made (:func:`codetool.search.beam.grow`). The trajectory
carries the compute of every subtree and ``strategy = {"name": "dvts", "n", "subtrees",
"beam_width", "k", "kept" (per subtree), "scores", "subtree_of", "chosen", ...}``.
"""

from __future__ import annotations

from collections.abc import Iterable

from codetool.search.beam import grow
from codetool.search.config import SearchConfig
from codetool.search.episode import Episodes, Hook, SearchParts, each_query
from codetool.search.records import Trajectory
from codetool.search.rollout import rollout_value
from codetool.search.search import SearchTask


def dvts(tasks: Iterable[SearchTask], parts: SearchParts, cfg: SearchConfig,
         on_done: Hook | None = None) -> list[Trajectory]:
    """DVTS for every task (see the module docstring). Under continuous scheduling queries run
    side by side, each with its n x k children in flight; ``on_done`` sees each final trajectory.

    Raises:
        ConfigError: settings the parts cannot run (``codetool.search.episode.check``).
    """
    episodes = Episodes(parts, cfg, rollout=rollout_value)
    subtrees = cfg.n // cfg.beam_width
    return each_query(episodes, lambda task: grow(episodes, task, subtrees, "dvts"), tasks, cfg.n * cfg.k, on_done)
