"""Memory cgroups for the sandbox, where the host may create them (``ExecutorConfig.cgroup``).

A family gets one directory under the host process's own memory cgroup,
``codetool-<host pid>-<start>-<random>`` (mode 0700, so the code cannot even read it), with one
child per principal (``c<key>``, created, limited and removed by the sandbox root) and ``root``
for the sandbox root itself. The memory limit of a principal then holds for all its processes
together, kernel memory included (inodes, page tables, file locks...), and is enforced by the
kernel. Two layouts are supported:

- **cgroup v1** with a writable ``memory`` hierarchy (e.g. containers that mount it read-write);
- **cgroup v2** when the host sits at the root of its cgroup namespace and ``memory`` is available
  there (e.g. a container with a private cgroup namespace). A v2 cgroup below that would need the
  host to move itself first, which this module never does.

Anything else (no permission, systemd-managed v2 without delegation, a rootless host) gives
``None``, and the root polls memory instead (``inside.principals``). Directories left by a host
that was killed are removed at the next start (:func:`reclaim`).
"""

from __future__ import annotations

import logging
import os
import secrets

from codetool.executor.kernel.procs import owner_alive, start_time

logger = logging.getLogger(__name__)

PREFIX = "codetool-"


def _mounts() -> list[tuple[str, str, str, str]]:
    """``(root, mount point, fstype, super options)`` of every cgroup mount (``/proc/self/mountinfo``)."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts, tail = left.split(), right.split()
                if len(parts) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                    found.append((parts[3], parts[4], tail[0], tail[2]))
    except OSError:
        pass
    return found


def _own_paths() -> dict[str, str]:
    """``{"memory": path}`` (v1) and ``{"": path}`` (v2) from ``/proc/self/cgroup``."""
    paths = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for name in controllers.split(","):
                    paths[name] = path
    except (OSError, ValueError):
        pass
    return paths


def memory_base() -> tuple[str, int] | None:
    """Where this process may create memory cgroups: ``(directory, version)`` or ``None``."""
    paths = _own_paths()
    for root, point, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in paths:
            own = paths["memory"]
            relative = own[len(root):] if root != "/" and own.startswith(root) else own
            base = os.path.join(point, relative.lstrip("/"))
            if os.path.isfile(os.path.join(base, "memory.limit_in_bytes")) and os.access(base, os.W_OK):
                return base, 1
    for root, point, fstype, _ in _mounts():
        if fstype == "cgroup2" and paths.get("") == "/" and root == "/":
            try:
                with open(os.path.join(point, "cgroup.controllers")) as f:
                    available = f.read().split()
            except OSError:
                continue
            if "memory" in available and os.access(point, os.W_OK):
                return point, 2
    return None


def family_cgroup() -> tuple[str, int] | None:
    """A fresh family directory ``(path, version)``, or ``None`` where none can be made here."""
    found = memory_base()
    if found is None:
        return None
    base, version = found
    reclaim(base)
    pid = os.getpid()
    path = os.path.join(base, f"{PREFIX}{pid}-{start_time(pid) or 0}-{secrets.token_hex(4)}")
    try:
        if version == 2:
            _enable_memory(base)
        os.mkdir(path)
        if version == 2:
            _enable_memory(path)
        os.mkdir(os.path.join(path, "root"))
        os.chmod(path, 0o700)
    except OSError as exc:
        logger.debug("no memory cgroup for the sandbox here (%s)", exc)
        remove(path)
        return None
    return path, version


def _enable_memory(path: str) -> None:
    with open(os.path.join(path, "cgroup.subtree_control")) as f:
        if "memory" in f.read().split():
            return
    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
        f.write("+memory")


def move_tree(pid: int, path: str) -> bool:
    """Move ``pid`` and all its descendants (host pids) into the cgroup ``path``."""
    frontier, moved = [pid], False
    while frontier:
        current = frontier.pop()
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(current))
            moved = True
        except OSError:
            continue
        try:
            tids = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    frontier.extend(int(x) for x in f.read().split())
            except (OSError, ValueError):
                pass
    return moved


def remove(path: str | None) -> bool:
    """Remove a family directory and its (empty) children; ``False`` if some are still busy."""
    if not path or not os.path.isdir(path):
        return True
    done = True
    for name in os.listdir(path):
        child = os.path.join(path, name)
        if os.path.isdir(child):
            try:
                os.rmdir(child)
            except OSError:
                done = False
    try:
        os.rmdir(path)
    except OSError:
        return False
    return done


def reclaim(base: str) -> None:
    """Remove family directories under ``base`` whose host process is gone."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid, _, rest = name[len(PREFIX):].partition("-")
        start = rest.partition("-")[0]
        if pid.isdigit() and start.isdigit() and not owner_alive(int(pid), start):
            remove(os.path.join(base, name))
