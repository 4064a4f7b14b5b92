"""How a long loop of a part reports progress to the command that runs it (only commands draw).

A part takes an optional ``progress`` (:data:`ProgressFactory`): it calls it once with the number of
units it is about to run and calls what that returns (:data:`Tick`) with each unit as it finishes
(a written record, a batch). The commands turn the factory into a ``rich`` bar
(``codetool.commands.progress_bar``); nothing below the commands imports ``rich`` or ``tqdm``
(``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Tick = Callable[[Any], None]
ProgressFactory = Callable[[int], Tick]


def ticker(progress: ProgressFactory | None, total: int) -> Tick:
    """``progress(total)``, or a tick that does nothing when there is no ``progress``."""
    return progress(total) if progress is not None else _no_tick


def _no_tick(unit: Any = None) -> None:
    return None
