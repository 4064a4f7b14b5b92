"""Host end of a sandbox channel: length-prefixed JSON frames over a non-blocking Unix socket.

Everything that comes from the sandbox is untrusted data: frames are parsed with ``json.loads``
only (never unpickled), must be JSON objects with a string ``op``, and may not exceed
``max_frame`` bytes; anything else raises :class:`ProtocolError`. Strings are made encodable
(lone surrogates replaced) by :func:`clean_text` before they leave the executor.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from collections import deque
from typing import Any

HEADER = struct.Struct(">I")
POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR


class ProtocolError(Exception):
    """The sandbox sent something that is not a valid frame."""


def clean_text(value: Any, limit: int | None = None) -> str | None:
    """``value`` as UTF-8-encodable text (lone surrogates replaced), cut to ``limit`` characters."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


class Conn:
    """One host-side channel. ``queue`` + ``flush`` write, ``read`` returns whole frames.

    Args:
        sock (`socket.socket`): the host end of a ``socketpair``; set non-blocking here.
        max_frame (`int`): largest frame accepted from the sandbox, in bytes.
    """

    def __init__(self, sock: socket.socket, max_frame: int = 4 << 20):
        sock.setblocking(False)
        self.sock = sock
        self.max_frame = max_frame
        self.inbuf = bytearray()
        self.out = bytearray()
        self.out_pos = 0
        self.frames: deque[dict] = deque()
        self.eof = False

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

    def read(self) -> None:
        """Read what is available into :attr:`frames` (sets :attr:`eof` at end of stream)."""
        while True:
            try:
                data = self.sock.recv(1 << 18)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            self.inbuf += data
        while len(self.inbuf) >= 4:
            size = HEADER.unpack_from(self.inbuf)[0]
            if size > self.max_frame:
                raise ProtocolError(f"frame of {size} bytes (limit {self.max_frame})")
            if len(self.inbuf) < 4 + size:
                break
            body = bytes(self.inbuf[4:4 + size])
            del self.inbuf[:4 + size]
            try:
                frame = json.loads(body)
            except (ValueError, RecursionError):
                raise ProtocolError("a frame is not JSON") from None
            if not isinstance(frame, dict) or not isinstance(frame.get("op"), str):
                raise ProtocolError("a frame is not an object with an 'op'")
            self.frames.append(frame)

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
    chunks, size = [], 0
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
