"""The unit runners of the long jobs (layer 3b, above :mod:`codetool.assemble`, below the commands):
:mod:`codetool.jobs.queries` searches queries (``codetool run``), :mod:`codetool.jobs.trees` builds
trees (``codetool build-trees``). Each opens its parts through ``assemble``, runs here or hands its
runner to :func:`codetool.distributed.run_on_ray`, and reports progress through a callback (only
commands draw progress bars)."""

from __future__ import annotations

from typing import Any

# What a job is given to report progress (codetool.progress): called once with the number of units
# it will run; what it returns is called with each record once the record is written.
from codetool.progress import ProgressFactory

__all__ = ["ProgressFactory", "client_rows", "stop_if_unreachable"]


def client_rows(clients: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows of remote clients (``{"policy": backend, ...}``, anything with
    ``stats()``, :meth:`codetool.models.remote.RemoteClient.stats`): requests, retries, failovers
    and timeouts; the faults retried, by kind (a server's transient faults: connection errors,
    timeouts, 429, 5xx, bodies that are not JSON); sequences in flight, peak and effective."""
    rows = []
    for name, client in clients.items():
        s = client.stats()
        rows.append((f"  {name} requests", f"{s['requests']} ({s['retries']} retries, {s['failovers']} failovers, "
                                           f"{s['timeouts']} timeouts)"))
        faults = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in (s.get("faults") or {}).items() if n)
        rows.append((f"  {name} faults retried", faults or "none"))
        rows.append((f"  {name} in flight", f"peak {s['in_flight_peak']} of {s['max_in_flight']}, effective "
                                            f"{s['in_flight_effective']:.1f} over {s['in_flight_busy_s']:.0f} s"))
    return rows


def stop_if_unreachable(parts: dict[str, object], units_left: str) -> None:
    """Stop the job when a server it needs cannot be reached: raise ``FatalError`` if one of
    ``parts`` (``{"policy": backend, "PRM": scorer}``) talks through a
    :class:`~codetool.models.remote.RemoteClient` whose last request spent all its retries unable
    to connect, and no request was answered since. Called after a unit failed, so a dead server
    costs one unit's retries, not every unit's; an error the server answered (HTTP 400) is that
    unit's own and the job goes on. ``units_left`` says what the rerun will do, for the message.

    Raises:
        FatalError: naming the server, what was tried and the fix.
    """
    from codetool.resume import FatalError

    for name, part in parts.items():
        message = getattr(getattr(part, "remote", None), "unreachable", None)
        if isinstance(message, str):
            raise FatalError(f"the {name} server cannot be reached ({message}); the run stops here instead of "
                             f"spending every retry on each query left: start the server (or fix the URL) and "
                             f"rerun: {units_left}")
