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
  ``world:<split>[:<n>]`` or ``world:<split>:<offset>:<n>`` as ``build-trees --queries``
  (:func:`parse_spec`);
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


_SPLIT = f"<{'|'.join(SPLITS)}>"
SPEC_FORMS = (f"world:{_SPLIT} (the split's first 40), world:{_SPLIT}:<n> (queries 0 to n-1) or "
              f"world:{_SPLIT}:<offset>:<n> (queries offset to offset+n-1)")


def parse_spec(text: str) -> tuple[str, int, int | None] | None:
    """A world query spec -> ``(split, offset, n)``; ``None`` when ``text`` is no world spec.

    Three forms, ``<split>`` being ``train`` or ``heldout``: ``world:<split>`` (the split's default
    number of queries from query 0: ``n`` is ``None``), ``world:<split>:<n>`` (queries 0 to n-1) and
    ``world:<split>:<offset>:<n>`` (queries offset to offset+n-1, e.g. ``world:train:96:12``: past the
    96 the warm-started policy was demonstrated on). Query ``i`` of a split is the same in every form
    (:func:`generate`).

    Args:
        text (`str`): what was given (``build-trees --queries``).

    Returns:
        `tuple[str, int, int | None] | None`: the split, the offset (0 unless given) and the count.

    Raises:
        ValueError: a world spec of another shape, an unknown split, an offset that is not an integer
            >= 0 or a count that is not an integer >= 1 (the message names what was received and the
            accepted forms).
    """
    if not str(text).startswith("world:"):
        return None
    parts = str(text).split(":")[1:]
    numbers = parts[1:]
    if (not 1 <= len(parts) <= 3 or parts[0] not in SPLITS or not all(x.isdigit() for x in numbers)
            or (numbers and int(numbers[-1]) < 1)):
        raise ValueError(f"world query spec {text!r} not understood: accepted forms are {SPEC_FORMS}, "
                         "<offset> an integer >= 0, <n> an integer >= 1.")
    if len(numbers) == 2:
        return parts[0], int(numbers[0]), int(numbers[1])
    return parts[0], 0, int(numbers[0]) if numbers else None
