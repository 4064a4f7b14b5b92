"""Decide first (When2Tool): one short question before the search, and its benchmark.

- ``stage``: the decision (which function first, or ``NONE``) with the model's own confidence.
- ``router``: routes a decision to a direct answer, a one-step fast path or the full search
  (``codetool run --router``).
- ``labelled``: the labelled set (StableToolBench queries mixed with packaged tool-free ones).
- ``metrics``: When2Tool-style metrics, routing at thresholds, the always-search baseline.
- ``report``: ``report.json``, ``report.md`` and the threshold-sweep plot.
- ``benchmark``: ``codetool eval-decision``, which runs the above on the labelled set.
- ``probe``: When2Tool's hidden-state probe of tool necessity (features, fit, saved format);
  ``necessity``: its labels from a run without tools; ``when2tool``: the loader of When2Tool's
  task files; ``tradeoff``: accuracy against tool calls and the prompt-only baselines;
  ``compare``: probe, verbalised and log-prob confidence side by side in ``eval-decision``.
  ``codetool train-probe`` (``codetool/commands/train_probe.py``) trains the probe.

Layering: this package builds on ``search`` (the router hands uncertain queries to the stepwise
search); nothing below it imports it except the ``run`` command (see ``tests/test_layering.py``).
"""
