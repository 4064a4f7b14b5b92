"""Sandbox side of :mod:`codetool.executor`: the worker's channel to the host and its output.
Standard library only (it runs inside the sandbox, installed from its source like
``inside.worker``, see ``codetool.executor.host.launch.BOOTSTRAP``).

- :class:`Channel`: frames on a Unix stream socket, a 4-byte big-endian length then JSON (nothing
  is ever pickled): the tool calls of one step, ``finish``/``give_up`` and the step's own report.
  The socket is made for one step and closed after it, so nothing an earlier step left behind can
  write into a later step's channel. The host checks every frame; nothing here is trusted.
- :class:`Output`: ``sys.stdout``/``sys.stderr`` of a step, written to fd 1 (a pipe the host reads
  and caps), keeping at most a limit of characters so a print flood costs no I/O once capped.
"""

import io
import json
import os
import socket
import struct
import threading
from json import dumps as _dumps
from json import loads as _loads  # bound now: a step that patches the json module keeps its channel

HEADER = struct.Struct(">I")


# ---------------------------------------------------------------------------------------- frames
class Channel:
    """Blocking frame I/O on a Unix stream socket (one per step, see the module docstring)."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.buf = bytearray()
        self.lock = threading.Lock()  # threads of the code may call tools or finish at once

    def send(self, obj):
        data = _dumps(obj).encode("ascii")
        with self.lock:
            self.sock.sendall(HEADER.pack(len(data)) + data)

    def recv(self):
        while True:
            if len(self.buf) >= 4:
                size = HEADER.unpack_from(self.buf)[0]
                if len(self.buf) >= 4 + size:
                    frame = bytes(self.buf[4:4 + size])
                    del self.buf[:4 + size]
                    return _loads(frame)
            data = self.sock.recv(1 << 18)
            if not data:
                raise EOFError
            self.buf += data

    def detach(self):
        """Forget the descriptor (the keeper closes it): a later garbage collection of this object
        must not close whatever descriptor reuses the number."""
        try:
            self.sock.detach()
        except OSError:
            pass


class RootChannel:
    """The sandbox root's end of its control channel to the host: frames as above, read without
    blocking the root's loop (:meth:`fill` when the socket is readable, then :meth:`buffered`);
    file descriptors sent with a frame are queued in :attr:`fds` (close-on-exec)."""

    def __init__(self, fd):
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        self.buf = bytearray()
        self.fds = []

    def send(self, obj):
        data = json.dumps(obj).encode("ascii")
        self.sock.sendall(HEADER.pack(len(data)) + data)

    def buffered(self):
        """The next whole frame already received, or ``None``."""
        if len(self.buf) >= 4:
            size = HEADER.unpack_from(self.buf)[0]
            if len(self.buf) >= 4 + size:
                frame = bytes(self.buf[4:4 + size])
                del self.buf[:4 + size]
                return json.loads(frame)
        return None

    def fill(self):
        """One ``recv`` (blocking); raises ``EOFError`` at the end of the stream."""
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 18, 4)
        for fd in fds:
            os.set_inheritable(fd, False)
        self.fds.extend(fds)
        if not data:
            raise EOFError
        self.buf += data


def close_fd(fd):
    try:
        os.close(fd)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------- output
class Output(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a step: writes to fd 1 (a pipe the host reads), keeping at
    most ``limit`` characters and counting the rest, so a print flood costs no I/O once capped."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit):
        self.limit = limit
        self.used = 0
        self.dropped = 0
        self.pending = []
        self.pending_size = 0
        self.buffer = _BinaryOutput(self)

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        """fd 1, the same pipe (so ``subprocess.run(..., stdout=sys.stdout)`` works, in order)."""
        self.flush()
        return 1

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        kept = self._keep(text)
        if kept:
            self._add(kept.encode("utf-8", "replace"))
        return len(text)

    def _keep(self, data):
        """The part of ``data`` (str: characters, bytes: bytes) that fits under the limit."""
        room = self.limit - self.used
        if len(data) > room:
            self.dropped += len(data) - max(room, 0)
            data = data[:max(room, 0)]
        self.used += len(data)
        return data

    def _add(self, data):
        self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size >= 8192:
            self.flush()

    def flush(self):
        data, self.pending, self.pending_size = b"".join(self.pending), [], 0
        while data:
            try:
                data = data[os.write(1, data):]
            except InterruptedError:
                continue
            except OSError:
                return


class _BinaryOutput(io.RawIOBase):
    """``sys.stdout.buffer``: bytes pass through unchanged (the host decodes with replacement)."""

    def __init__(self, text):
        self.text = text

    def writable(self):
        return True

    def write(self, data):
        view = memoryview(data).cast("B")
        kept = self.text._keep(view)
        if len(kept):
            self.text._add(bytes(kept))
        return view.nbytes

    def flush(self):
        self.text.flush()
