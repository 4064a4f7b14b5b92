"""Who a request to a codetool server belongs to, and whose turn it is (issue 39).

Every local client is 127.0.0.1, and one machine can speak from 16 million loopback addresses, so
the servers of :mod:`codetool.serving` no longer take an address for a client:

- **Client** (:func:`identify`): the API key the request was sent with, when the server holds
  several keys (one per client: ``CODETOOL_PRM_API_KEY=key1,key2``); otherwise the connection (its
  address and port). A client is what the server is fair between.
- **Group** (:func:`address_group`): the address prefix (an IPv4 /24, an IPv6 /64; all of loopback
  is one group), the second line: caps on connections and large bodies per group bound what many
  addresses of one network hold, without telling apart the clients inside it.
- **Turns** (:class:`FairTurns`): at most ``slots`` requests are worked on at once, and waiting
  ones are admitted in start-time fair queuing order over clients, each request weighted by its
  cost (body bytes): a client's short request goes before the long ones another client keeps
  queued, however many connections that client opens. A client that sends requests as small as
  another's from many connections is, to the server, many clients; give each client its own key
  to make it one.
- **Bodies** (:func:`loads_without_stalling`): a large JSON body is parsed in pieces, the largest
  containers element by element, so the thread parsing it lets the event loop run every few
  milliseconds (``json.loads`` of a 3.9 MB object of 300,000 keys held the interpreter for 1.5-3 s,
  and ``/health`` with it); :func:`json_members` counts the values of a body in one vectorised
  pass, so a server can refuse a body of too many before parsing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import ipaddress
import itertools
import json
from dataclasses import dataclass

LOOPBACK_GROUP = "loopback"
PIECE_BYTES = 65_536  # containers larger than this are parsed element by element


def address_group(host: str) -> str:
    """The address prefix a client address belongs to: ``a.b.c.0/24`` for IPv4, its /64 for IPv6,
    ``loopback`` for every loopback address (127.0.0.0/8, ``::1``, IPv4-mapped loopback); the
    address itself when it does not parse."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    if address.is_loopback:
        return LOOPBACK_GROUP
    prefix = 24 if address.version == 4 else 64
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


@dataclass(frozen=True)
class Client:
    """The identity of a request: ``id`` (``key:<n>`` or ``conn:<address>:<port>``), its address
    and its address group."""

    id: str
    address: str
    group: str


def identify(scope: dict, key_index: int | None = None) -> Client:
    """The :class:`Client` of an ASGI ``scope``: by its API key when ``key_index`` (the key's
    position among the server's keys) is given, else by its connection."""
    host, port = (scope.get("client") or ("?", 0))[:2]
    client_id = f"key:{key_index}" if key_index is not None else f"conn:{host}:{port}"
    return Client(client_id, host, address_group(host))


class FairTurns:
    """At most ``slots`` holders at once; the others wait, admitted in start-time fair queuing
    order: a request's tag is ``max(virtual time, its client's last tag) + cost``, the smallest
    tag goes first, and the virtual time is the start of the last request admitted. A client's
    requests are thus served in proportion to their cost among the clients waiting, and a short
    request of an idle client overtakes the queued long ones of a busy client. For one event
    loop (not thread-safe).

    Example:
        ```python
        turns = FairTurns(slots=4)
        async with turns.turn(client.id, cost=len(body)):
            answer = await asyncio.to_thread(work, body)
        ```
    """

    def __init__(self, slots: int):
        self.slots, self.busy, self.vtime = max(1, int(slots)), 0, 0.0
        self._last: dict[str, float] = {}  # client -> the finish tag of its last request
        self._waiting: list[tuple[float, int, float, asyncio.Future]] = []
        self._order = itertools.count()

    def tag(self, client: str, cost: float) -> tuple[float, float]:
        """``(start, finish)`` tags of a new request of ``client`` costing ``cost`` (recorded)."""
        start = max(self.vtime, self._last.get(client, 0.0))
        finish = self._last[client] = start + max(float(cost), 1.0)
        if len(self._last) > 4096:  # clients whose tags the virtual time passed are like new ones
            self._last = {c: f for c, f in self._last.items() if f > self.vtime}
        return start, finish

    @contextlib.asynccontextmanager
    async def turn(self, client: str, cost: float = 1.0):
        start, finish = self.tag(client, cost)
        if self.busy < self.slots and not self._waiting:
            self.busy += 1
            self.vtime = max(self.vtime, start)
        else:
            granted = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (finish, next(self._order), start, granted))
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():  # admitted just as it was cancelled
                    self._release()
                else:
                    granted.cancel()  # left in the heap, skipped when its turn comes
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self.busy -= 1
        while self._waiting and self.busy < self.slots:
            _, _, start, granted = heapq.heappop(self._waiting)
            if granted.done():  # its request gave up waiting
                continue
            self.busy += 1
            self.vtime = max(self.vtime, start)
            granted.set_result(None)


def _scan(text: str | bytes):
    """Structural positions of JSON ``text`` outside strings, vectorised: ``(chars, outside)``
    where ``outside`` marks characters that are not inside a string literal. Bytes are scanned as
    they are (UTF-8 never puts a byte below 128 inside a multi-byte character), text by code point."""
    import numpy as np

    if isinstance(text, (bytes, bytearray)):
        chars = np.frombuffer(text, dtype=np.uint8)
    else:
        chars = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    backslash = chars == 92
    run = np.cumsum(backslash, dtype=np.int32)
    run = run - np.maximum.accumulate(np.where(backslash, 0, run))  # backslashes ending at each position
    escaped = np.zeros(len(chars), dtype=bool)
    escaped[1:] = (run[:-1] % 2) == 1
    quotes = (chars == 34) & ~escaped
    inside = np.logical_xor.accumulate(quotes) & ~quotes
    return chars, ~inside & ~quotes


def json_members(body: bytes | str) -> int:
    """About how many values a JSON body holds (commas and containers outside strings, plus one),
    counted in one vectorised pass that releases the interpreter for its long operations; invalid
    JSON is counted by its characters alone."""
    if not body:
        return 0
    chars, outside = _scan(body)
    import numpy as np

    structural = chars[outside]
    return int(np.count_nonzero(structural == 44) + np.count_nonzero((structural == 91) | (structural == 123)) + 1)


def loads_without_stalling(body: bytes | str, piece_bytes: int = PIECE_BYTES):
    """``json.loads(body)``, parsed so that no single call into the C parser takes more than
    about ``piece_bytes`` of text: containers larger than that are walked element by element
    (their small elements parsed whole), so a thread parsing a large body gives the interpreter
    back to the others between pieces. Same result and errors as ``json.loads`` (ValueError on
    invalid JSON, RecursionError on absurd nesting).
    """
    text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else body
    if len(text) <= piece_bytes:
        return json.loads(text)
    import numpy as np

    chars, outside = _scan(text)
    opens = outside & ((chars == 91) | (chars == 123))
    closes = outside & ((chars == 93) | (chars == 125))
    step = opens.astype(np.int32) - closes.astype(np.int32)
    depth = np.cumsum(step, dtype=np.int32)  # depth after each character
    positions = np.flatnonzero(opens | closes)
    level = np.where(opens[positions], depth[positions], depth[positions] + 1)
    order = np.lexsort((positions, level))
    paired = positions[order]
    if len(paired) % 2 or np.any(opens[paired[1::2]]) or np.any(closes[paired[0::2]]):
        return json.loads(text)  # unbalanced: let the parser say what is wrong
    starts, ends = paired[0::2], paired[1::2]
    big = (ends - starts) > piece_bytes
    large = dict(zip(starts[big].tolist(), ends[big].tolist()))
    decoder = json.JSONDecoder()
    ws = " \t\n\r"

    def skip(i: int) -> int:
        while i < len(text) and text[i] in ws:
            i += 1
        return i

    def value(i: int):
        i = skip(i)
        if i in large:
            return container(i, large[i]), large[i] + 1
        return decoder.raw_decode(text, i)

    def container(i: int, end: int):
        is_object = text[i] == "{"
        members: dict = {}
        items: list = []
        i = skip(i + 1)
        while i < end:
            if is_object:
                key, i = decoder.raw_decode(text, i)
                if not isinstance(key, str):
                    raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
                i = skip(i)
                if text[i] != ":":
                    raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
                item, i = value(i + 1)
                members[key] = item
            else:
                item, i = value(i)
                items.append(item)
            i = skip(i)
            if text[i] == ",":
                i = skip(i + 1)
                if i == end:
                    raise json.JSONDecodeError("Expecting value", text, i)
            elif i != end:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        return members if is_object else items

    result, end = value(0)
    if skip(end) != len(text):
        raise json.JSONDecodeError("Extra data", text, skip(end))
    return result
