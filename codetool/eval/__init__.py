"""Evaluation: StableToolBench pass and win rates, RestBench path metrics, run metrics, reports.

- ``judges``: the judge interface (LLM over an OpenAI-compatible server or a local model, cached).
- ``stabletoolbench``: SoPR / SoWR bookkeeping, as StableToolBench's evaluator does it.
- ``convert``: trajectories to and from StableToolBench's converted-answer layout.
- ``restbench``: correct path rate and solution-length delta on RestBench-TMDB.
- ``metrics``: SCEP, steps, tokens, seconds, tool cost, how episodes ended.
- ``report`` (``codetool eval``), ``markdown`` and ``plots``: report.json, report.md, PNGs.
"""
