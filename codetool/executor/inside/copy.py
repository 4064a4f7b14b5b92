"""Sandbox side of :mod:`codetool.executor`: what a fork copy does to stop sharing open files with
the worker it was forked from, once it is its own principal. Standard library only; run by the
keeper (``inside.keeper``), so it follows the keeper's rules: every callable is a default argument
bound before any code of the state existed, and only values made by C functions are handled.

``os.fork`` copies memory, but open file descriptions stay *shared*: a file object of an earlier
step would keep one offset for every sibling, and a descriptor of a file in the zygote's scratch
would let a copy write a file of another principal. The sandbox root reads the zygote's
descriptors from ``/proc`` when it prepares the copy (the zygote is idle then) and the host sends
the copy this map (:data:`RECORD` records); :func:`reopen` then replaces each descriptor:

- a file or directory in the zygote's scratch (kind ``SCRATCH``): the same relative name in the
  copy's own scratch (the root copied the files there), with the same flags and offset;
- a file or directory outside it (``OUTSIDE``, read-only system files): reopened by its path;
- a deleted file of the scratch (``DELETED``): a fresh unnamed file in the copy's scratch with the
  same content (readable and writable: a worker has no ``/proc`` to reopen it read-only);
- anything else (``NULL``: a pipe or socket an earlier step made): ``/dev/null``.

Writable shared memory mappings cannot exist (the seccomp filter refuses ``MAP_SHARED``).
Absolute paths into the zygote's scratch that an earlier step stored in a variable keep pointing
there, and that directory belongs to another principal now: they fail with ``PermissionError``.
"""

import fcntl
import os
import stat
import struct

RECORD = struct.Struct(">iBH")  # descriptor, kind, length of the path (UTF-8, surrogate escapes)
SCRATCH, OUTSIDE, DELETED, NULL = 0, 1, 2, 3
O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
KEEP_FLAGS = os.O_ACCMODE | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_DIRECT", 0) | getattr(os, "O_NOATIME", 0)


def reopen(records, *, _unpack=RECORD.unpack_from, _size=RECORD.size, _len=len, _open=os.open, _fstat=os.fstat,
           _isdir=stat.S_ISDIR, _fcntl=fcntl.fcntl, _getfl=fcntl.F_GETFL, _lseek=os.lseek, _dup2=os.dup2,
           _close=os.close, _inheritable=os.get_inheritable, _pread=os.pread, _write=os.write, _oserror=OSError,
           _keep=KEEP_FLAGS, _tmpfile=O_TMPFILE | os.O_RDWR, _rdonly=os.O_RDONLY, _rdwr=os.O_RDWR,
           _directory=os.O_DIRECTORY, _cur=os.SEEK_CUR, _set=os.SEEK_SET, _min=min,
           _kinds=(SCRATCH, OUTSIDE, DELETED), _deleted=DELETED):
    """Replace the descriptors listed in ``records`` (see the module docstring)."""
    at = 0
    while at + _size <= _len(records):
        fd, kind, length = _unpack(records, at)
        path = records[at + _size:at + _size + length].decode("utf-8", "surrogateescape")
        at += _size + length
        new = -1
        try:
            info = _fstat(fd)
        except _oserror:
            continue  # (not open in the copy: the zygote held it for the request that forked it)
        try:
            if kind in _kinds:
                flags = _fcntl(fd, _getfl)
                offset = _lseek(fd, 0, _cur)
                if kind == _deleted:
                    new = _open(".", _tmpfile, 0o600)
                    position = 0
                    while position < info.st_size:
                        chunk = _pread(fd, _min(1 << 20, info.st_size - position), position)
                        if not chunk:
                            break
                        _write(new, chunk)
                        position += _len(chunk)
                elif _isdir(info.st_mode):
                    new = _open(path, _rdonly | _directory)
                else:
                    new = _open(path, flags & _keep)
                _lseek(new, offset, _set)
        except _oserror:
            if new >= 0:
                _close(new)
            new = -1
        if new < 0:
            try:
                new = _open("/dev/null", _rdwr)
            except _oserror:
                continue
        if new != fd:
            _dup2(new, fd, _inheritable(fd))
            _close(new)
