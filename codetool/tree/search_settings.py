"""The keys of ``search:`` that ``build-trees`` reads, and where each of the others belongs.

``TreeConfig.search`` is typed as a whole :class:`~codetool.search.search.SearchConfig`, but a
tree samples ``branching`` candidates at every node down to ``max_depth`` and labels them: it
reads the sampling, step-format, observation and on-the-spot settings only (through
``expand_each``, ``step_constraint``, the schedule and the tree records). Every other key of the
group would be accepted and do nothing, so :data:`TREE_SEARCH` makes :func:`codetool.config.from_dict`
refuse it with the place it belongs (``trees.search.k``: set ``trees.branching``;
``trees.search.w_latent``: a setting of the search over queries, ``search:``).
"""

from __future__ import annotations

import dataclasses

from codetool.config import Unread
from codetool.search.config import SearchConfig

# What the tree builder reads of its search group (tests/test_configs_unread.py checks that these
# and the refused keys together are SearchConfig's fields).
TREE_READS = ("temperature", "top_p", "max_new_tokens", "step_format", "code_prefix", "constrain",
              "constrain_arguments", "constrain_first_tool", "constrain_last_finish", "observation_history",
              "max_observation_chars", "observation_cut", "tool_error_is_failure", "cost_table", "schedule")

# Keys the builder replaces by a setting of its own (k and max_steps are overwritten per tree).
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
