"""Host end of a sandbox channel: length-prefixed JSON frames over a non-blocking Unix socket.

Everything that comes from the sandbox is untrusted data: frames are parsed with ``json.loads``
only (never unpickled), must be JSON objects with a string ``op``, may not exceed ``max_frame``
bytes, nest deeper than ``MAX_DEPTH`` or hold a non-finite number (``NaN``, ``Infinity``) or an
integer beyond 64 bits; anything else raises :class:`ProtocolError`, never ``RecursionError`` or
``OverflowError``. Strings are made encodable (lone surrogates replaced) by :func:`clean_text`
before they leave the executor, :func:`clean_output` removes terminal control sequences (ANSI
escapes, carriage returns, bidirectional overrides) from what a step printed, and :func:`log_safe`
escapes control characters of anything sandbox-made before it reaches a log line.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import socket
import struct
import time
from collections import deque
from typing import Any, overload

HEADER = struct.Struct(">I")
POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR
MAX_DEPTH = 32  # nesting of lists/dicts in one frame (tool arguments included)
MAX_INT = 1 << 63
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# ESC sequences: CSI (colours, cursor moves), OSC (titles, hyperlinks), DCS/SOS/PM/APC strings,
# then two-character escapes; what is left of C0/C1 controls (but tab and newline) and the
# bidirectional overrides that reorder text on screen are dropped too.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"
                      r"|[\x1b][\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -/]*[0-~]?")
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


class ProtocolError(Exception):
    """The sandbox sent something that is not a valid frame."""


@overload
def clean_text(value: str, limit: int | None = None) -> str: ...


@overload
def clean_text(value: Any, limit: int | None = None) -> str | None: ...


def clean_text(value: Any, limit: int | None = None) -> str | None:
    """``value`` as UTF-8-encodable text (lone surrogates replaced), cut to ``limit`` characters."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


def clean_output(text: str) -> str:
    """What a step printed, as text for a record or a prompt: terminal control sequences removed
    (a program cannot recolour, move the cursor, overwrite or reorder what is shown), ``\\r\\n``
    and a lone ``\\r`` made newlines (nothing printed is hidden behind what follows it), line and
    paragraph separators made newlines."""
    if not text:
        return text
    text = _ESCAPES.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    return _INVISIBLE.sub("", text)


def log_safe(value: Any, limit: int = 200) -> str:
    """Sandbox-made text for a log line: control characters escaped (``\\x1b``, ``\\n``), cut."""
    text = clean_text(value, limit) or ""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _reject_constant(name: str):
    raise ProtocolError(f"a frame holds the non-finite number {name}")


def _check_value(value: Any) -> None:
    """Raise :class:`ProtocolError` for data too deep or numbers out of range (iterative: a
    deep structure cannot exhaust the host's stack)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise ProtocolError(f"a frame nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, int) and not isinstance(item, bool) and not -MAX_INT <= item < MAX_INT:
            raise ProtocolError("a frame holds an integer beyond 64 bits")


def parse_frame(body: bytes) -> dict:
    """One frame from the sandbox, validated (see the module docstring)."""
    try:
        frame = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # includes integers of more than 4300 digits
        raise ProtocolError("a frame is not JSON") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
        raise ProtocolError("a frame is not an object with an 'op'")
    _check_value(frame)
    return frame


class Conn:
    """One host-side channel. ``queue`` + ``flush`` write, ``read`` returns whole frames.

    Args:
        sock (`socket.socket`): the host end of a ``socketpair``; set non-blocking here.
        max_frame (`int`): largest frame accepted from the sandbox, in bytes.
    """

    def __init__(self, sock: socket.socket, max_frame: int = 4 << 20, receive_fds: bool = False):
        sock.setblocking(False)
        self.sock = sock
        self.max_frame = max_frame
        self.receive_fds = receive_fds  # (the root's channel only) descriptors sent along, in order
        self.fds: deque[int] = deque()
        self.inbuf = bytearray()
        self.out = bytearray()
        self.out_pos = 0
        self.frames: deque[dict] = deque()
        self.eof = False
        self.bytes_in = 0  # bytes of whole frames received so far

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending_output(self) -> bool:
        return self.out_pos < len(self.out)

    def queue(self, obj: dict) -> None:
        data = json.dumps(obj).encode("ascii")
        self.out += HEADER.pack(len(data)) + data

    def flush(self) -> None:
        """Send what the socket takes now; raises ``EOFError`` if the sandbox end is gone."""
        view = memoryview(self.out)
        try:
            while self.out_pos < len(self.out):
                self.out_pos += self.sock.send(view[self.out_pos:])
        except BlockingIOError:
            pass
        except OSError as exc:
            raise EOFError(str(exc)) from None
        finally:
            view.release()
        if self.out_pos >= len(self.out):
            self.out.clear()
            self.out_pos = 0
        elif self.out_pos > (1 << 20):
            del self.out[:self.out_pos]
            self.out_pos = 0

    def send_with_fds(self, obj: dict, fds: list[int], timeout: float = 5.0) -> None:
        """Send one small frame with file descriptors attached (``SCM_RIGHTS``)."""
        data = json.dumps(obj).encode("ascii")
        frame = HEADER.pack(len(data)) + data
        self.flush_blocking(timeout)
        self.sock.settimeout(timeout)
        try:
            sent = socket.send_fds(self.sock, [frame], fds)
            if sent < len(frame):
                self.sock.sendall(frame[sent:])
        except OSError as exc:
            raise EOFError(str(exc)) from None
        finally:
            self.sock.setblocking(False)

    def flush_blocking(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT)
        while self.pending_output:
            self.flush()
            if self.pending_output:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the sandbox does not read its channel")
                poller.poll(min(remaining, 0.05) * 1000)

    def read(self, limit: int = 1 << 20) -> None:
        """Read what is available, at most about ``limit`` bytes, into :attr:`frames` (sets
        :attr:`eof` at end of stream). Frames are parsed as they complete, so the buffer never
        holds more than one frame (``max_frame``) plus one read."""
        taken = 0
        while taken < limit:
            try:
                if self.receive_fds:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 18, 4)
                    self.fds.extend(fds)
                else:
                    data = self.sock.recv(1 << 18)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            taken += len(data)
            self.inbuf += data
            self._parse()

    def _parse(self) -> None:
        while len(self.inbuf) >= 4:
            size = HEADER.unpack_from(self.inbuf)[0]
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes (limit {self.max_frame})")
            if len(self.inbuf) < 4 + size:
                break
            body = bytes(self.inbuf[4:4 + size])
            del self.inbuf[:4 + size]
            self.bytes_in += 4 + size
            self.frames.append(parse_frame(body))

    @property
    def held(self) -> int:
        """Bytes this end holds: frames parsed and not handled, partial input, unsent output."""
        return len(self.inbuf) + len(self.out) - self.out_pos

    def wait_frame(self, timeout: float) -> dict:
        """The next frame; raises ``EOFError`` (closed), ``TimeoutError`` or ``ProtocolError``."""
        end = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.sock.fileno(), POLL_IN)
        while not self.frames:
            if self.eof:
                raise EOFError("the sandbox closed the channel")
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the sandbox did not answer in time")
            if poller.poll(remaining * 1000):
                self.read()
        return self.frames.popleft()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def read_available(fd: int, limit: int = 1 << 20) -> bytes | None:
    """Read up to ``limit`` bytes that are ready on a non-blocking fd; ``None`` at end of file."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        except OSError:
            data = b""
        if not data:
            return b"".join(chunks) if chunks else None
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


# ------------------------------------------------------------- a keeper's control socket
_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_CREDS_SPACE = socket.CMSG_SPACE(_CREDS.size)
CONTROL_BUFFER = 16 << 20  # the largest message the host sends (a step's source)


def control_pair() -> tuple[socket.socket, socket.socket]:
    """A Unix ``SOCK_SEQPACKET`` pair for a keeper's control channel (``inside.keeper``):
    ``(host end, worker end)``. The host end is non-blocking and receives the sender's credentials
    with every message (``SO_PASSCRED``: its pid as the kernel sees it, in the host's namespace)."""
    host, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    for option in (getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF):
        try:
            host.setsockopt(socket.SOL_SOCKET, option, CONTROL_BUFFER)
            break
        except OSError:
            continue
    host.setblocking(False)
    return host, worker


def send_message(sock: socket.socket, data: bytes, fds: list[int] | tuple = (), timeout: float = 10.0) -> None:
    """One message on a control socket, with descriptors attached.

    Raises:
        EOFError: the worker's end is gone, does not read, or the message is too big for the socket.
    """
    sock.settimeout(timeout)
    try:
        if fds:
            socket.send_fds(sock, [data], list(fds))
        else:
            sock.send(data)
    except OSError as exc:  # socket.timeout included
        if exc.errno == errno.EMSGSIZE:
            raise EOFError(f"a message of {len(data)} bytes is more than the sandbox's socket takes") from None
        raise EOFError(str(exc)) from None
    finally:
        sock.setblocking(False)


def read_message(sock: socket.socket) -> tuple[bytes, int | None] | None:
    """The next message waiting on a control socket and the pid of its sender; ``None`` when none
    is waiting; ``(b"", None)`` at the end of the stream."""
    try:
        data, ancillary, _, _ = sock.recvmsg(1 << 16, _CREDS_SPACE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b"", None
    pid = None
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(raw) >= _CREDS.size:
            pid = _CREDS.unpack_from(raw)[0]
    return data, pid


def wait_message(sock: socket.socket, timeout: float) -> tuple[bytes, int | None]:
    """The next message on a control socket within ``timeout`` seconds.

    Raises:
        EOFError: the worker's end closed. TimeoutError: nothing came in time.
    """
    end = time.monotonic() + timeout
    poller = select.poll()
    poller.register(sock.fileno(), POLL_IN)
    while True:
        got = read_message(sock)
        if got is not None:
            if not got[0]:
                raise EOFError("the sandbox worker closed its channel")
            return got
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the sandbox worker did not answer in time")
        poller.poll(remaining * 1000)
