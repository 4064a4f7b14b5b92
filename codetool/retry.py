"""The one retry policy of every HTTP client: how many retries, how long to wait before each.

A failed attempt that is worth repeating (the caller decides which are: a connection error, a
timeout, HTTP 429 or a 5xx) is retried up to ``retries`` times; the wait before retry ``k``
(``k = 1, 2, ...``) is ``backoff_s * 2**(k - 1)``, at most ``max_backoff_s``; a server's
``Retry-After`` (seconds or an HTTP date) replaces it, capped alike.

Users: :class:`codetool.models.remote.RemoteClient` (the policy, the PRM client and the judge,
which adds endpoint failover and a shorter budget before a server has ever answered) and
:class:`codetool.tools.clients.StableToolBenchClient`. Why not a library: ``tenacity`` would be a
new dependency whose callbacks would have to read the client's failover and reachability state
mid-loop, and httpx's transport retries repeat connection failures only, at once, without
backoff, status codes or ``Retry-After`` (docs/ARCHITECTURE.md section 6).
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Retries and waits (module docstring).

    Args:
        retries (`int`): further attempts after the first, >= 0.
        backoff_s (`float`): wait before the first retry, doubling with each one.
        max_backoff_s (`float`, *optional*, defaults to 60): longest wait, a ``Retry-After`` included.
    """

    retries: int
    backoff_s: float
    max_backoff_s: float = 60.0

    def wait_s(self, retry: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first), given the failed
        answer's ``Retry-After`` header, if any."""
        asked = retry_after_s(retry_after)
        wait = self.backoff_s * 2 ** (retry - 1) if asked is None else asked
        return min(wait, self.max_backoff_s)


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number or an HTTP date), or ``None``."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
