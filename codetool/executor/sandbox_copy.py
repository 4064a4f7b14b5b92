"""Sandbox side of :mod:`codetool.executor`: what a fork copy does to stop sharing anything with the
worker it was forked from, once it is its own principal. Standard library only.

``os.fork`` copies memory, but open file descriptions and ``MAP_SHARED`` mappings stay *shared*:
a file object of an earlier step would keep one offset for every sibling, and a shared mapping
(``mmap.mmap(-1, n)`` is shared by default) would be a channel between them. So the copy:

- re-opens every inherited file descriptor that is a regular file or a directory: one in the old
  scratch by the same relative name in its own scratch (the root copied the files there), one
  that was deleted as a fresh unnamed file with the same content, any other (read-only system
  files) by its path; each with its flags and offset. Any other descriptor (a pipe or socket an
  earlier step made) becomes ``/dev/null``;
- replaces each writable shared mapping by a private copy at the same address;
- moves its cwd, ``HOME``, ``TMPDIR`` and ``tempfile.tempdir`` to its own scratch.

Absolute paths into the parent's scratch that an earlier step stored in a variable keep pointing
there, and that directory belongs to another principal now: they fail with ``PermissionError``.
"""

import ctypes
import mmap
import os
import stat
import sys

O_TMPFILE = getattr(os, "O_TMPFILE", 0o20200000)
_KEEP_FLAGS = os.O_ACCMODE | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_DIRECT", 0) | getattr(os, "O_NOATIME", 0)


def become_independent(old_scratch, new_scratch, keep_fds, parent_fd=None):
    """Run in the copy right after it switched to its own uid (see the module docstring).
    ``parent_fd`` is a descriptor of the directory that holds every scratch directory: the copy
    enters its own through it, so no ancestor of that directory needs to be searchable by its uid."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = new_scratch
    if parent_fd is not None:
        os.chdir(parent_fd)
        os.chdir(os.path.basename(new_scratch.rstrip("/")))
    else:
        os.chdir(new_scratch)
    _reopen_descriptors(old_scratch, new_scratch, set(keep_fds))  # relative to the new scratch
    _privatize_shared_mappings()
    _move_directories(cwd, old_scratch, new_scratch)


def _inside(path, directory):
    return bool(directory) and (path == directory or path.startswith(directory.rstrip("/") + "/"))


def _relative(path, directory):
    """``path`` (inside ``directory``) relative to it, for use from the new scratch as cwd."""
    return "./" + path[len(directory.rstrip("/")):].lstrip("/") if path != directory else "."


def _reopen_descriptors(old_scratch, new_scratch, keep):
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd in keep:
            continue
        try:
            info = os.fstat(fd)
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
        try:
            replacement = _replacement(fd, info, target, old_scratch, new_scratch)
        except OSError:
            replacement = None
        if replacement is None:
            replacement = os.open(os.devnull, os.O_RDWR)
        if replacement != fd:
            os.dup2(replacement, fd, inheritable=os.get_inheritable(fd))
            os.close(replacement)


def _replacement(fd, info, target, old_scratch, new_scratch):
    """A new descriptor for what ``fd`` refers to, or ``fd`` itself when it can stay shared."""
    if stat.S_ISCHR(info.st_mode):
        return fd  # /dev/null, /dev/urandom...: no state between processes
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return None
    flags = _flags(fd)
    deleted = target.endswith(" (deleted)")
    path = target[: -len(" (deleted)")] if deleted else target
    if stat.S_ISDIR(info.st_mode):
        if _inside(path, old_scratch):
            path = _relative(path, old_scratch)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    offset = os.lseek(fd, 0, os.SEEK_CUR)
    if deleted and _inside(path, old_scratch):
        new = os.open(".", O_TMPFILE | os.O_RDWR, 0o600)
        _copy_content(fd, new, info.st_size)
        if flags & os.O_ACCMODE == os.O_RDONLY:  # keep it read-only, as it was
            reopened = os.open(f"/proc/self/fd/{new}", os.O_RDONLY)
            os.close(new)
            new = reopened
    elif _inside(path, old_scratch):
        new = os.open(_relative(path, old_scratch), flags & _KEEP_FLAGS)
    elif deleted:
        return None
    else:
        new = os.open(path, flags & _KEEP_FLAGS)
    os.lseek(new, offset, os.SEEK_SET)
    return new


def _flags(fd):
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _copy_content(source, target, size):
    position = 0
    while position < size:
        chunk = os.pread(source, min(1 << 20, size - position), position)
        if not chunk:
            break
        os.write(target, chunk)
        position += len(chunk)


def _privatize_shared_mappings():
    """Replace each writable ``MAP_SHARED`` mapping by a private copy at the same address."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    shared = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and len(parts[1]) == 4 and parts[1][3] == "s" and parts[1][1] == "w":
            start, end = (int(x, 16) for x in parts[0].split("-"))
            shared.append((start, end - start))
    if not shared:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    for start, length in shared:
        fresh = libc.mmap(None, length, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if fresh in (None, ctypes.c_void_p(-1).value):
            continue
        ctypes.memmove(fresh, start, length)
        # MREMAP_MAYMOVE | MREMAP_FIXED: the private copy takes the shared mapping's place
        libc.mremap(fresh, length, length, 3, start)


def _move_directories(cwd, old_scratch, new_scratch):
    """From the new scratch as cwd: into the same subdirectory the zygote was in."""
    if _inside(cwd, old_scratch) and cwd != old_scratch:
        try:
            os.chdir(_relative(cwd, old_scratch))
        except OSError:
            pass
    for name in ("HOME", "TMPDIR"):
        if _inside(os.environ.get(name, ""), old_scratch) or name not in os.environ:
            os.environ[name] = new_scratch
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None and (tempfile.tempdir is None or _inside(tempfile.tempdir, old_scratch)):
        tempfile.tempdir = new_scratch  # type: ignore[attr-defined]  # sys.modules holds a bare ModuleType
