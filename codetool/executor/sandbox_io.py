"""Sandbox side of :mod:`codetool.executor`: the worker's channel to the host and its output.
Standard library only (it runs inside the sandbox, installed from its source like
``sandbox_worker``, see ``codetool.executor.launch.BOOTSTRAP``).

- :class:`Channel`: frames on a Unix stream socket, a 4-byte big-endian length then JSON (nothing
  is ever pickled); each frame sent carries the current run's nonce and its sequence number, and
  a thread of an earlier step can only send a frame the host rejects. Received file descriptors
  are close-on-exec.
- :class:`Output`: ``sys.stdout``/``sys.stderr`` of a step, written to fd 1 (a pipe the host reads
  and caps), keeping at most a limit of characters so a print flood costs no I/O once capped.
"""

import io
import json
import os
import socket
import struct
import threading

HEADER = struct.Struct(">I")


# ---------------------------------------------------------------------------------------- frames
class Channel:
    """Blocking frame I/O on a Unix stream socket; file descriptors sent with a frame are queued.
    Each frame sent is stamped with the current run's ``nonce`` and the next ``seq``."""

    def __init__(self, fd):
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        self.buf = bytearray()
        self.fds = []
        self.nonce = ""
        self.seq = 0
        self.old_threads = set()  # threads of earlier steps: their frames carry no valid nonce
        self.lock = threading.Lock()  # threads of the code may call tools or finish at once

    def begin(self, nonce, old_threads=()):
        with self.lock:
            self.nonce, self.seq, self.old_threads = nonce, 0, set(old_threads)

    def send(self, obj):
        with self.lock:
            if threading.get_ident() in self.old_threads:  # the host rejects it (and the step)
                data = json.dumps(dict(obj, nonce="stale", seq=0)).encode("ascii")
                self.sock.sendall(HEADER.pack(len(data)) + data)
                return
            self.seq += 1
            data = json.dumps(dict(obj, nonce=self.nonce, seq=self.seq)).encode("ascii")
            self.sock.sendall(HEADER.pack(len(data)) + data)

    def recv(self):
        while True:
            frame = self.buffered()
            if frame is not None:
                return frame
            self.fill()

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

    def close(self):
        self.sock.close()
        for fd in self.fds:
            close_fd(fd)
        self.fds = []


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
