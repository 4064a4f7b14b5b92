"""A synthetic tool world with exact answers: the laptop testbed's environment (issue 41).

The method's effect can only be measured where success can be checked exactly. This package is a
small, deterministic world (cities, weather, companies, shop customers, hotels, flights) served
by 25 Python tools with typed arguments and realistic failures, and a generator of multi-step
queries whose answers are known, split into train and held-out *templates*. Its API, for the
search, trees, PRM, policy RL and any comparison that wants a world where success is exact:

- :func:`load_queries` ``(split, limit, offset=0, seed=0) -> list[BenchmarkQuery]``: queries of
  ``train`` or ``heldout`` templates (``benchmark="world"``, ``group`` the split,
  ``extra["answer"]`` the answer key); also ``benchmark: world`` with ``group: train|heldout`` in
  any query setting (``codetool run``, the pipeline's ``evals``, ``train-policy``'s sets), and
  ``world:<split>[:<n>]`` as ``build-trees --queries``;
- :class:`WorldBackend`: ``call(api, arguments) -> ToolResponse`` (``tools_backend: world``);
- :func:`check_answer` ``(key, answer) -> bool``: the outcome, exact and not gameable by listing
  candidates (:mod:`codetool.world.answers`);
- :func:`generate` ``(split, n, seed) -> list[WorldQuery]``: the queries with their scripted
  solutions (the calls) and demonstration answers, for warm-starting a policy
  (:mod:`codetool.policy.warmstart`) and for tests.

Layering: the world stands on :mod:`codetool.tools` (its specs and records) only; nothing here
imports the search, the executor or a model. Docs: docs/TESTBED.md.
"""

from codetool.world.answers import check_answer
from codetool.world.backend import WorldBackend, load_queries, to_benchmark_query, world_apis
from codetool.world.queries import SPLITS, TEMPLATES, WorldQuery, generate, templates

__all__ = ["SPLITS", "TEMPLATES", "WorldBackend", "WorldQuery", "check_answer", "generate", "load_queries",
           "templates", "to_benchmark_query", "world_apis"]


def parse_spec(text: str) -> tuple[str, int | None] | None:
    """``world:<split>[:<n>]`` -> ``(split, n)``; ``None`` when ``text`` is no world spec.

    Raises:
        ValueError: a world spec with an unknown split or a count that is not a positive integer.
    """
    if not str(text).startswith("world:"):
        return None
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or parts[1] not in SPLITS:
        raise ValueError(f"world query spec must be world:<{'|'.join(SPLITS)}>[:<n>], got {text!r}.")
    if len(parts) == 3 and (not parts[2].isdigit() or int(parts[2]) < 1):
        raise ValueError(f"world query spec {text!r}: the count must be a positive integer.")
    return parts[1], int(parts[2]) if len(parts) == 3 else None
