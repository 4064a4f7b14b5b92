"""The host's end of a sandbox root's control channel (``inside.root``).

Requests are numbered; the root answers those that ask for it with a frame carrying the same
``id``, in its own time (the answer to ``expect`` comes when the fork copy became its own
principal). Any thread may send while another waits, and each waiting thread gets its own reply:
one of them reads the socket at a time and files what it reads by ``id``. The root is trusted
code, but a frame it sends is still parsed with the channel's checks (``channel.Conn``).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
import time

from codetool.executor.host.channel import HEADER, Conn, ProtocolError

SEND_TIMEOUT_S = 10.0


class RootLink:
    """Numbered requests to a sandbox root, and their replies.

    Args:
        sock (`socket.socket`): the host end of the control ``socketpair``.
    """

    def __init__(self, sock: socket.socket):
        self.conn = Conn(sock, receive_fds=True)  # the reading side (non-blocking)
        self._tx = socket.socket(fileno=os.dup(sock.fileno()))  # the sending side, its own timeout
        self._tx.settimeout(SEND_TIMEOUT_S)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._wanted: set[int] = set()
        self._reading = False
        self._ids = itertools.count(1)
        self.closed = False

    @property
    def eof(self) -> bool:
        return self.conn.eof or self.closed

    def send(self, frame: dict, fds: list[int] | None = None, reply: bool = False) -> int:
        """Send ``frame`` (with file descriptors attached when given); returns its id.

        Raises:
            EOFError: the root is gone or does not read (after ``SEND_TIMEOUT_S``).
        """
        rid = next(self._ids)
        data = json.dumps(dict(frame, id=rid, reply=reply)).encode("ascii")
        data = HEADER.pack(len(data)) + data
        if reply:
            with self._cond:
                self._wanted.add(rid)
        try:
            with self._send_lock:
                if fds:
                    sent = socket.send_fds(self._tx, [data], fds)
                    if sent < len(data):
                        self._tx.sendall(data[sent:])
                else:
                    self._tx.sendall(data)
        except OSError as exc:  # socket.timeout included
            with self._cond:
                self._wanted.discard(rid)
            raise EOFError(f"the sandbox root does not take requests ({exc})") from None
        return rid

    def wait(self, rid: int, timeout: float, keep: bool = False) -> dict:
        """The reply to request ``rid``.

        Args:
            keep (`bool`, *optional*, defaults to `False`): on a timeout, still take the reply when
                it comes (the caller waits again, or calls :meth:`forget`).
        Raises:
            EOFError: the root is gone. TimeoutError: no reply within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                if rid in self._replies:
                    self._wanted.discard(rid)
                    return self._replies.pop(rid)
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    if self.eof or not keep:
                        self._wanted.discard(rid)
                    if self.eof:
                        raise EOFError("the sandbox root closed its channel")
                    raise TimeoutError("the sandbox root did not answer in time")
                if self._reading:
                    self._cond.wait(min(left, 0.05))
                    continue
                self._reading = True
            frames: list[dict] = []
            try:
                poller = select.poll()
                poller.register(self.conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
                if poller.poll(min(left, 0.05) * 1000):
                    try:
                        self.conn.read()
                    except ProtocolError:
                        self.closed = True
                frames = list(self.conn.frames)
                self.conn.frames.clear()
            finally:
                with self._cond:
                    for frame in frames:
                        if frame.get("id") in self._wanted:
                            self._replies[frame["id"]] = frame
                    self._reading = False
                    self._cond.notify_all()

    def forget(self, rid: int) -> None:
        """Drop the reply to ``rid`` (now or when it comes)."""
        with self._cond:
            self._wanted.discard(rid)
            self._replies.pop(rid, None)

    def take_fd(self) -> int | None:
        """The next file descriptor the root sent along with a reply (in the order sent)."""
        with self._cond:
            return self.conn.fds.popleft() if self.conn.fds else None

    def close(self) -> None:
        self.closed = True
        for fd in self.conn.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.conn.close()
        try:
            self._tx.close()
        except OSError:
            pass
