"""What the kernel says about processes and memory cgroups, read from ``/proc`` and cgroup files:
the facts both sides decide a principal's fate from (the sandbox root, ``inside/principals.py``,
and the host, ``host/adoption.py`` and ``host/step.py``). Standard library only.

Every function returns an empty value (``None``, ``[]``, ``0``) when the process or cgroup is gone
or unreadable, never raises: the caller treats that as "nothing there".
"""

import os


def oom_kills(directory, version):
    """``oom_kill`` of a memory cgroup: processes the kernel killed at its limit so far."""
    name = "memory.oom_control" if version == 1 else "memory.events"
    try:
        with open(os.path.join(directory, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0] == "oom_kill":
                    return int(parts[1])
    except (OSError, ValueError):
        pass
    return 0


def cgroup_pids(directory):
    """The pids in a cgroup (``cgroup.procs``; ``[]`` when it is gone)."""
    try:
        with open(os.path.join(directory, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def status(pid):
    """``/proc/<pid>/status`` as a dict (``None`` when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    except OSError:
        return None


def real_uid(fields):
    """The real uid in the fields of :func:`status` (``None`` when unreadable)."""
    parts = fields.get("Uid", "").split()
    return int(parts[0]) if parts and parts[0].isdigit() else None


def state_of(pid):
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``Z``...; ``None`` when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def start_time(pid):
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), as
    text; ``None`` when the process does not exist. With the pid it names one process for good: a
    recycled pid has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_alive(pid, start):
    """Whether process ``pid`` that started at ``start`` (:func:`start_time`; ``"0"``: unknown) is
    still running (the owner of a scratch directory or cgroup named after it)."""
    if start != "0" and os.path.isdir("/proc/self"):
        return start_time(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


LIMIT_ROWS = {"as": "Max address space", "data": "Max data size", "cpu": "Max cpu time", "fsize": "Max file size",
              "nofile": "Max open files", "nproc": "Max processes"}


def soft_limits(pid):
    """The soft rlimits of process ``pid`` by the sandbox's names (``as``, ``data``, ``cpu``, ``fsize``,
    ``nofile``, ``nproc``: ``/proc/<pid>/limits``; ``None`` for unlimited; ``{}`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for name, row in LIMIT_ROWS.items():
        for line in lines:
            if line.startswith(row + " "):
                soft = line[len(row):].split()[:1]
                if soft and (soft[0] == "unlimited" or soft[0].isdigit()):
                    found[name] = None if soft[0] == "unlimited" else int(soft[0])
    return found
