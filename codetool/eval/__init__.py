"""Evaluation: StableToolBench pass and win rates, RestBench path metrics, run metrics, reports.

- ``stabletoolbench``, ``preference``: SoPR / SoWR bookkeeping, as StableToolBench's evaluator does it
  (the judge itself is :mod:`codetool.judge`).
- ``convert``: trajectories to and from StableToolBench's converted-answer layout.
- ``restbench``: correct path rate and solution-length delta on RestBench-TMDB.
- ``metrics``: SCEP, steps, tokens, seconds, tool cost, how episodes ended.
- ``report`` (``codetool eval``), ``markdown`` and ``plots``: report.json, report.md, PNGs.
"""
