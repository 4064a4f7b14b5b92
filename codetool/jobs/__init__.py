"""The unit runners of the long jobs (layer 3b, above :mod:`codetool.assemble`, below the commands):
:mod:`codetool.jobs.queries` searches queries (``codetool run``), :mod:`codetool.jobs.trees` builds
trees (``codetool build-trees``). Each opens its parts through ``assemble``, runs here or hands its
runner to :func:`codetool.distributed.run_on_ray`, and reports progress through a callback (only
commands draw progress bars)."""

from __future__ import annotations

# What a job is given to report progress (codetool.progress): called once with the number of units
# it will run; what it returns is called with each record once the record is written.
from codetool.progress import ProgressFactory

__all__ = ["ProgressFactory"]
