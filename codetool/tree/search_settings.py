"""The ``search:`` of ``build-trees`` (:class:`TreeSearch`), and where each search key it lacks belongs.

A tree samples ``branching`` candidates at every node down to ``max_depth`` and labels them all: of
the search's config groups (:mod:`codetool.search.config`) it reads one candidate step
(:class:`~codetool.search.config.CandidateGroup`, through ``expand_each``, ``step_constraint`` and
the tree records), the sampling (:class:`~codetool.search.config.SamplingGroup`) and the schedule
(:class:`~codetool.search.config.ScheduleGroup`), and :class:`TreeSearch` composes those three
only. Any other key of the search is not a field there; :data:`TREE_SEARCH` (the fields of
:class:`~codetool.search.config.SearchConfig` that :class:`TreeSearch` lacks, computed, no hand
list) makes :func:`codetool.config.from_dict` refuse it in one line naming ``build-trees`` and the
place it belongs (``trees.search.k``: set ``trees.branching``; ``trees.search.w_latent``: a setting
of the search over queries, ``search:``).
"""

from __future__ import annotations

import dataclasses

from codetool.config import Unread
from codetool.config_groups import group_values, with_defaults
from codetool.search.config import CandidateGroup, SamplingGroup, ScheduleGroup, SearchConfig


@with_defaults(max_new_tokens=192)
class TreeSearch(ScheduleGroup, CandidateGroup, SamplingGroup):
    """``build-trees``' ``search:``: one candidate step, its sampling and the schedule (192 tokens
    per candidate unless told otherwise). The builder hands it to the search's sampling as a
    :class:`~codetool.search.config.SearchConfig` with ``k = branching`` and ``max_steps =
    max_depth`` (:meth:`search_config`)."""

    def search_config(self, *, k: int, max_steps: int) -> SearchConfig:
        """This group as the search's settings that ``expand_each`` reads, ``k`` candidates a node,
        ``max_steps`` deep (``method`` is ``tree`` in the records; the rest keep the search's defaults,
        which nothing in a tree reads)."""
        return SearchConfig(**group_values(self, TreeSearch), method="tree", k=k, max_steps=max_steps)


TREE_READS = tuple(f.name for f in dataclasses.fields(TreeSearch))

# Keys the builder replaces by a setting of its own (k and max_steps come from branching and max_depth).
_OWN = {"k": ("branching", "candidates sampled per node"), "max_steps": ("max_depth", "the depth of a tree"),
        "seed": ("seed", "each tree's seed"), "alpha": ("alpha", "the latent reward's alpha"),
        "beta": ("beta", "the latent reward's beta"), "max_len": ("max_len", "the latent reward's L")}


def _home(key: str) -> str:
    if key in _OWN:
        name, what = _OWN[key]
        return f"The trees take {what} from {{group}}{name}: set that instead."
    return (f"{key} is a setting of the search over queries: set it under search: of a pipeline recipe, "
            f"or pass --search.{key} to codetool run.")


TREE_SEARCH = Unread(
    reader="build-trees",
    reads=TREE_READS,
    homes={f.name: _home(f.name) for f in dataclasses.fields(SearchConfig) if f.init and f.name not in TREE_READS},
)
