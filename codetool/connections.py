"""The connection guards of every codetool server (:mod:`codetool.serving` builds uvicorn with
:func:`guarded_h11_protocol`): request heads on a deadline, connections capped per address, per
address prefix and in all, and new connections rate-limited per address (off loopback).

Over a cap, a new connection does not get refused while others idle: the connection that has
waited longest for a request head (an idle keep-alive connection, a head trickling in) is closed
to make room, taken from the address holding the most connections (:class:`_Connections`), so one
local process holding 64 keep-alive connections, or 1,200 trickling connections from 20
addresses, no longer shut another client out (issue 39). A 503 comes only when every connection
under the cap has a request in work. Clients notice nothing from a closed idle connection (HTTP
clients open a new one); a head that trickles in is closed anyway at its deadline.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from codetool.fairness import LOOPBACK_GROUP, address_group

MAX_CONNECTIONS_PER_CLIENT = 64  # per address
MAX_CONNECTIONS_PER_GROUP = 256  # per address prefix (codetool.fairness.address_group)
# New connections per second and address, sustained (the bucket holds one second's worth); not on
# loopback, where one process's connects would use up the budget of every other local client
# (and a local process shares this machine's CPU anyway).
NEW_CONNECTIONS_PER_S = 200


class _Connections:
    """The open connections of one server, by address and address prefix, and which one to close
    when a new one would pass a cap: of the connections under that cap that are waiting for a
    request head (idle keep-alive, or a head still trickling in), the one waiting longest, taken
    from the address holding the most connections. Busy connections (a request in work) are never
    closed; when all are busy, the newcomer is refused. Each address keeps its waiting connections
    in the order they began to wait, so choosing costs a pass over the addresses, not over the
    connections. Touched on the event loop only."""

    def __init__(self, per_address: int, per_group: int, total: int):
        self.caps = (per_address, per_group, total)
        self.count: dict[str, int] = {}  # address -> open connections
        self.waiting: dict[str, OrderedDict] = {}  # address -> its waiting connections, longest first
        self.addresses: dict[str, set[str]] = {}  # group -> its addresses
        self.total = 0

    def admit(self, conn) -> bool:
        """Count ``conn`` in (waiting), closing waiting connections where a cap is reached;
        ``False`` (not counted) when it cannot be made room for."""
        for scope, cap in zip(("address", "group", "all"), self.caps):
            while self._held(conn, scope) >= cap:
                victim = self._longest_waiting(conn, scope)
                if victim is None:
                    return False
                self.remove(victim)
                victim.evict()
        self.count[conn.address] = self.count.get(conn.address, 0) + 1
        self.addresses.setdefault(conn.group, set()).add(conn.address)
        self.total += 1
        self.set_waiting(conn, True)
        return True

    def set_waiting(self, conn, waiting: bool) -> None:
        """``conn`` began to wait for a request head (``True``) or has a request in work."""
        queue = self.waiting.setdefault(conn.address, OrderedDict())
        queue.pop(conn, None)
        if waiting:
            queue[conn] = None

    def remove(self, conn) -> None:
        left = self.count.get(conn.address, 1) - 1
        self.total -= 1
        self.waiting.get(conn.address, {}).pop(conn, None)
        if left > 0:
            self.count[conn.address] = left
        else:
            self.count.pop(conn.address, None)
            self.waiting.pop(conn.address, None)
            group = self.addresses.get(conn.group, set())
            group.discard(conn.address)
            if not group:
                self.addresses.pop(conn.group, None)

    def _in_scope(self, conn, scope: str):
        if scope == "address":
            return [conn.address] if conn.address in self.count else []
        return list(self.addresses.get(conn.group, ())) if scope == "group" else list(self.count)

    def _held(self, conn, scope: str) -> int:
        if scope == "all":
            return self.total
        return sum(self.count.get(a, 0) for a in self._in_scope(conn, scope))

    def _longest_waiting(self, conn, scope: str):
        for address in sorted(self._in_scope(conn, scope), key=lambda a: -self.count[a]):
            queue = self.waiting.get(address)
            if queue:
                return next(iter(queue))
        return None


def guarded_h11_protocol(header_timeout_s: float, max_per_client: int, max_per_group: int = MAX_CONNECTIONS_PER_GROUP,
                          max_total: int = 1000):
    """uvicorn's h11 protocol with more guards: a request head must be complete within
    ``header_timeout_s`` of the connection (or of the previous response), whatever arrives
    meanwhile (uvicorn's own timer is cancelled by the first byte, so a head trickled a line at a
    time kept a connection forever); connections are capped per address (``max_per_client``),
    per address prefix (``max_per_group``) and in all (``max_total``), a new one closing the
    longest-waiting idle one over a cap (:class:`_Connections`) and being refused with a 503
    only when all are busy; and new connections per address are rate-limited (off loopback)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    connections = _Connections(max_per_client, max_per_group, max_total)  # one per server (this class)
    opened_recently: dict[str, list[float]] = {}  # [tokens, time]: new connections per address

    class GuardedH11Protocol(H11Protocol):
        head_timer = None
        counted = False
        address = group = "?"

        def connection_made(self, transport):
            super().connection_made(transport)
            self.address = (self.client or ("?", 0))[0]
            self.group = address_group(self.address)
            now = time.monotonic()
            if self.group != LOOPBACK_GROUP and not self._rate_ok(now):  # an address opening connections
                transport.abort()  # faster than this gets no answer at all
                return
            if not connections.admit(self):
                body = b'{"error": "too many connections from this client, all of them busy"}'
                transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                transport.close()
                return
            self.counted = True
            self._arm_head_timer()

        def _rate_ok(self, now: float) -> bool:
            bucket = opened_recently.setdefault(self.address, [float(NEW_CONNECTIONS_PER_S), now])
            bucket[0] = min(float(NEW_CONNECTIONS_PER_S), bucket[0] + (now - bucket[1]) * NEW_CONNECTIONS_PER_S)
            bucket[1] = now
            if len(opened_recently) > 10_000:
                opened_recently.clear()
            if bucket[0] < 1.0:
                return False
            bucket[0] -= 1.0
            return True

        def evict(self) -> None:
            """Closed to make room for a newcomer (it was waiting for a request head)."""
            self.counted = False
            if not self.transport.is_closing():
                self.transport.close()

        def _arm_head_timer(self):
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _head_too_slow(self):
            self.head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def handle_events(self):
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a whole head arrived: a request in work
                if self.head_timer is not None:
                    self.head_timer.cancel()
                    self.head_timer = None
                if self.counted:
                    connections.set_waiting(self, False)

        def on_response_complete(self):
            if self.counted and not self.transport.is_closing():  # before a pipelined request starts
                connections.set_waiting(self, True)
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head_timer()  # the next request head, on a kept-alive connection

        def connection_lost(self, exc):
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            if self.counted:
                connections.remove(self)
                self.counted = False
            super().connection_lost(exc)

    return GuardedH11Protocol
