"""One machine-readable line per benchmark, which ``benchmarks/run_all.py`` collects.

Each benchmark prints its own human table, then ``emit(...)`` prints ``BENCH-RESULT {json}``.
"""

from __future__ import annotations

import json

PREFIX = "BENCH-RESULT "


def emit(**metrics) -> None:
    """Print ``metrics`` (numbers, strings) as one ``BENCH-RESULT`` JSON line."""
    print(PREFIX + json.dumps(metrics, default=float), flush=True)
