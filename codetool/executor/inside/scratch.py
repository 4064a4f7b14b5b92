"""Sandbox side of :mod:`codetool.executor`, run by the family's root: copying a parent's scratch
directory for a fork, the map of the parent's open files for the copy (``inside.copy``), and
emptying a scratch directory. Standard library only.

A file is copied as it is stored: the holes of a sparse file stay holes (``SEEK_DATA``/``SEEK_HOLE``),
so a copy costs the blocks its parent's file uses, not its size.

The files belong to a principal whose processes may still be running (an ancestor's threads, when
a fork is made), so nothing is followed: every name is opened relative to its directory with
``O_NOFOLLOW``, links are copied as links, anything but directories, regular files and links is
left out, set-id bits are dropped.
"""

import os
import stat
import struct

MAX_COPY_DEPTH = 64


def copy_tree(source, target, uid, gid):
    """Copy the directory ``source`` into the existing ``target``: directories, regular files and
    symbolic links (as links), owned by ``uid``/``gid`` when given. Nothing is followed: every
    name is opened relative to its directory with ``O_NOFOLLOW``, so a link or a file swapped
    meanwhile by a process of the source's owner cannot make the root read or write elsewhere."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    src = os.open(source, flags)
    try:
        dst = os.open(target, flags)
        try:
            _copy_dir(src, dst, uid, gid, 0)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_dir(src, dst, uid, gid, depth):
    if depth > MAX_COPY_DEPTH:
        return
    for name in os.listdir(src):
        try:
            info = os.stat(name, dir_fd=src, follow_symlinks=False)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode) & 0o777
        try:
            if stat.S_ISDIR(info.st_mode):
                os.mkdir(name, 0o700, dir_fd=dst)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                sub_src, sub_dst = os.open(name, flags, dir_fd=src), os.open(name, flags, dir_fd=dst)
                try:
                    _copy_dir(sub_src, sub_dst, uid, gid, depth + 1)
                    _own(sub_dst, uid, gid, mode)
                finally:
                    os.close(sub_src)
                    os.close(sub_dst)
            elif stat.S_ISREG(info.st_mode):
                _copy_file(name, src, dst, uid, gid, mode)
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
                if uid is not None:
                    os.chown(name, uid, gid if gid is not None else uid, dir_fd=dst, follow_symlinks=False)
        except OSError:
            continue  # a name that vanished or cannot be copied is left out


def _copy_file(name, src, dst, uid, gid, mode):
    fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    try:
        info = os.fstat(fin)
        if not stat.S_ISREG(info.st_mode):
            return
        fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
        try:
            _copy_data(fin, fout, info.st_size)
            _own(fout, uid, gid, mode)
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _copy_data(fin, fout, size):
    """The data ranges of ``fin`` into ``fout`` at the same offsets; holes stay holes."""
    os.ftruncate(fout, size)
    position = 0
    while position < size:
        try:
            start = os.lseek(fin, position, os.SEEK_DATA)
            end = os.lseek(fin, start, os.SEEK_HOLE)
        except OSError:  # ENXIO: only a hole is left
            return
        while start < end:
            os.lseek(fout, start, os.SEEK_SET)
            sent = os.sendfile(fout, fin, start, min(end - start, 1 << 24))
            if sent <= 0:
                return
            start += sent
        position = end


def _own(fd, uid, gid, mode):
    if uid is not None:
        os.fchown(fd, uid, gid if gid is not None else uid)
    os.fchmod(fd, mode)


def remove_tree(path):
    """Remove a scratch directory that is not a mount (the code cannot make the root follow a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        _empty_dir(fd, 0)
    finally:
        os.close(fd)


def _empty_dir(fd, depth):
    for name in os.listdir(fd):
        try:
            os.unlink(name, dir_fd=fd)
            continue
        except IsADirectoryError:
            pass
        except OSError:
            continue
        if depth >= MAX_COPY_DEPTH:
            continue
        try:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            continue
        try:
            _empty_dir(sub, depth + 1)
        finally:
            os.close(sub)
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            pass




# ------------------------------------------------------------------- the map of open files
RECORD = struct.Struct(">iBH")  # as inside.copy.RECORD
SCRATCH, OUTSIDE, DELETED, NULL = 0, 1, 2, 3
KEEPER_FDS = 6  # descriptors 0-5 are the worker's own (stdio, control socket, scratch parent)


def descriptor_map(pid, scratch):
    """What the fork copy of worker ``pid`` (idle) must do with each descriptor it inherits, as
    ``inside.copy.reopen`` reads it; ``scratch`` is the worker's scratch directory."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return b""
    prefix = scratch.rstrip("/") + "/"
    out = []
    for name in names:
        if not name.isdigit() or int(name) < KEEPER_FDS:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        deleted = target.endswith(" (deleted)")
        path = target[:-len(" (deleted)")] if deleted else target
        if not path.startswith("/"):
            kind, path = NULL, ""  # pipe:[...], socket:[...], anon_inode:...
        elif path == scratch.rstrip("/") or path.startswith(prefix):
            kind = DELETED if deleted else SCRATCH
            path = "." + path[len(scratch.rstrip("/")):] if not deleted else ""
        else:
            kind = NULL if deleted else OUTSIDE
        data = path.encode("utf-8", "surrogateescape")[:65535]
        out.append(RECORD.pack(int(name), kind, len(data)) + data)
    return b"".join(out)


SMALL_FILES, SMALL_BYTES = 64, 1 << 20  # a scratch the root copies itself (no helper process)


def small_scratch(path):
    """Whether the scratch directory at ``path`` holds at most ``SMALL_FILES`` inodes and
    ``SMALL_BYTES`` of data (a tmpfs: its own counts; else a walk that stops early)."""
    try:
        info = os.statvfs(path)
        if info.f_files:  # a mount of its own (tmpfs)
            used_inodes = info.f_files - info.f_ffree
            return used_inodes <= SMALL_FILES and (info.f_blocks - info.f_bfree) * info.f_frsize <= SMALL_BYTES
    except OSError:
        return False
    seen, size = 0, 0
    for top, dirs, files in os.walk(path):
        seen += len(dirs) + len(files)
        for name in files:
            try:
                size += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
        if seen > SMALL_FILES or size > SMALL_BYTES:
            return False
    return True


def copy_for_fork(principals, principal, parent, parent_pid, out_fd):
    """Copy the parent's scratch into the copy's and map the parent's open files. In a helper
    process of the root (``out_fd`` given): join the copy's cgroup first (its pages are charged
    there), write the map (hex) to ``out_fd``, return the exit status (0: done). In the root itself
    (``out_fd`` is ``None``): return the map (hex), or 1 when the copy failed."""
    try:
        if principal.cgroup and out_fd is not None:
            with open(os.path.join(principal.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        copy_tree(parent.scratch, principal.scratch, principal.uid, principals.gid)
        text = (descriptor_map(parent_pid, parent.scratch) if parent_pid else b"").hex()
        if out_fd is None:
            return text
        data = text.encode("ascii")
        while data:
            data = data[os.write(out_fd, data):]
        return 0
    except BaseException:  # noqa: B036 - any failure is the copy's exit status
        return 1
