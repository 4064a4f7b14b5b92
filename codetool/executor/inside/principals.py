"""Sandbox side of :mod:`codetool.executor`, run by the family's **root**: the *principals* of a
family. Standard library only.

A principal is one executor (one candidate): its worker and every process the worker starts.
When the host runs as root, each principal has its own uid, picked by the host at random for every
spawn and every fork, so the kernel itself keeps siblings apart: a process cannot signal, trace,
read the ``/proc`` files of, or lower the limits of another uid's process, and ``RLIMIT_NPROC``
counts per uid. A fork copy becomes its own principal with one ``setresuid`` call, which the
seccomp filter hands to the root (``kernel/calls.py``): the root lets it through only for the
copy it was told to expect (the child of the expected worker, single-threaded, still the parent's
uid), and only once.

Each principal also has its own scratch directory (its cwd, HOME and TMPDIR; mode 0700): a tmpfs
of ``scratch_bytes`` and ``scratch_inodes`` when the root may mount, so that a full scratch costs
only its owner. A fork's scratch starts as a copy of its parent's (made by the root, or for a big
scratch by a helper of the root in the copy's cgroup, so the copy is charged to it; holes of
sparse files stay holes; no link the code left there is followed). Memory is bounded per
principal, for all its processes together: by a memory cgroup when the host delegated one
(kernel memory included), else by polling the principals that are running (resident memory of
their processes, plus their scratch use), once more at each step's end, and killing one that
passes ``memory_bytes``; between steps nothing of a principal runs, so its memory cannot grow.

Without per-principal uids (host not root), principals are told apart by the process tree: a
process belongs to the nearest worker above it, and a detached process to nobody (it is killed
at the next sweep of any principal).
"""

import os
import signal
import time

try:
    import sandbox_kernel as kernel
    from sandbox_procs import cgroup_pids, oom_kills, real_uid, state_of, status
    from sandbox_scratch import copy_tree, remove_tree
except ImportError:  # imported on the host (tests, documentation tools): the package's copies
    from codetool.executor.inside.scratch import copy_tree, remove_tree
    from codetool.executor.kernel import calls as kernel
    from codetool.executor.kernel.procs import cgroup_pids, oom_kills, real_uid, state_of, status

EXPECT_TIMEOUT_S = 5.0  # a fork copy must ask for its uid within this (the host may give more)
DEFER_S = 0.2  # how long a setresuid that no expectation matches yet may wait for one
POLL_S = 0.01  # memory polling period while a principal runs (no cgroup)
INODE_BYTES = 1024  # kernel memory counted per scratch inode by the polling fallback


class Principal:
    """One executor's principal: ``key`` (its uid when uids are per principal), the worker's
    ``pid``, its ``scratch`` directory, its cgroup directory, whether a step of it is running."""

    __slots__ = ("key", "uid", "pid", "scratch", "cgroup", "active", "reason", "oom_seen", "mounted", "spawned")

    def __init__(self, key, uid, scratch):
        self.key, self.uid, self.scratch = key, uid, scratch
        self.pid = None
        self.cgroup = None
        self.active = False
        self.reason = None  # why the root killed it ("memory")
        self.oom_seen = 0
        self.mounted = False
        self.spawned = False  # its worker is the root's child (a spawn, not a fork)


class Expectation:
    __slots__ = ("key", "parent", "request", "deadline", "fdmap", "ready")

    def __init__(self, key, parent, request, timeout):
        self.key, self.parent, self.request = key, parent, request
        self.fdmap = ""  # (hex) the parent's descriptor map, for the copy
        self.ready = False  # its scratch is copied: its setresuid may go through
        self.deadline = time.monotonic() + timeout


class Principals:
    """The principals of one family (see the module docstring); driven by ``inside.root.Root``."""

    def __init__(self, config):
        self.uids = bool(config.get("principals"))
        self.gid = config.get("gid")
        self.parent = config["scratch_parent"]
        self.mount_scratch = bool(config.get("mount_scratch"))
        self.scratch_bytes = int(config.get("scratch_bytes") or 0)
        self.scratch_inodes = int(config.get("scratch_inodes") or 0)
        self.memory_bytes = int(config.get("memory_bytes") or 0)
        self.setresuid_nr = config.get("setresuid_nr")
        cgroup = config.get("cgroup") or {}
        self.cgroup_dir, self.cgroup_version = cgroup.get("path"), cgroup.get("version")
        self.by_key = {}
        self.expected = {}
        self.listeners = []
        self.pending = []  # (listener, notification, deadline): setresuid calls not answered yet
        self.leftover_paths = []  # scratch or cgroup directories to remove once empty
        self.next_poll = 0.0
        self.helpers = set()  # the root's own helper processes (scratch copies): nobody's to kill

    # ------------------------------------------------------------------------------- life cycle
    def prepare(self, key, parent_key=None, copy=True):
        """Create principal ``key``: its scratch (a copy of ``parent_key``'s when given, unless
        ``copy`` is false: the caller copies it) and its cgroup. Raises ``OSError`` when that
        cannot be done."""
        uid = key if self.uids else None
        path = os.path.join(self.parent, f"c{key}")
        principal = Principal(key, uid, path)
        os.mkdir(path, 0o700)
        try:
            if self.mount_scratch:
                options = f"size={self.scratch_bytes},nr_inodes={self.scratch_inodes},mode=0700"
                if uid is not None:
                    options += f",uid={uid},gid={self.gid if self.gid is not None else uid}"
                result = kernel.mount("tmpfs", path, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, options)
                if result < 0:
                    raise OSError(-result, f"cannot mount the scratch tmpfs at {path}")
                principal.mounted = True
            elif uid is not None:
                os.chown(path, uid, self.gid if self.gid is not None else uid)
            parent = self.by_key.get(parent_key)
            if parent is not None and copy:
                copy_tree(parent.scratch, path, uid, self.gid)
            if self.cgroup_dir:
                principal.cgroup = self._make_cgroup(key)
        except BaseException:
            self._remove_paths(principal)
            raise
        self.by_key[key] = principal
        return principal

    def expect(self, key, parent_key, request, timeout=EXPECT_TIMEOUT_S):
        """Wait (at most ``timeout`` seconds) for a fork copy of ``parent_key`` to ask for uid ``key``."""
        self.expected[key] = Expectation(key, parent_key, request, timeout)

    def release(self, key):
        """Kill every process of principal ``key`` and remove its scratch and cgroup."""
        principal = self.by_key.pop(key, None)
        self.expected.pop(key, None)
        if principal is None:
            return None
        self.kill(principal, spare=None, wait=False)  # dying processes keep no mount busy (lazy)
        self._remove_paths(principal)
        return principal

    def release_all(self):
        for key in list(self.by_key):
            self.release(key)

    def _remove_paths(self, principal):
        if principal.mounted:
            kernel.umount(principal.scratch)
            principal.mounted = False
        else:
            remove_tree(principal.scratch)
        for path in (principal.scratch, principal.cgroup):
            if path and not _rmdir(path):
                self.leftover_paths.append(path)

    # ---------------------------------------------------------------------------- the cgroup
    def _make_cgroup(self, key):
        assert self.cgroup_dir is not None  # called only with a cgroup
        path = os.path.join(self.cgroup_dir, f"c{key}")
        os.mkdir(path)
        if self.cgroup_version == 1:
            _write(path, "memory.limit_in_bytes", self.memory_bytes)
            _write(path, "memory.memsw.limit_in_bytes", self.memory_bytes, required=False)
        else:
            _write(path, "memory.max", self.memory_bytes)
            _write(path, "memory.swap.max", 0, required=False)
            _write(path, "memory.oom.group", 1, required=False)
        return path

    def attach(self, principal, pid):
        """Put ``pid`` in the principal's cgroup (before it runs any code of its own)."""
        if principal.cgroup:
            _write(principal.cgroup, "cgroup.procs", pid)

    def oom_kills(self, principal):
        """How many processes of the principal the kernel killed at its memory limit so far."""
        if not principal.cgroup:
            return 0
        return oom_kills(principal.cgroup, self.cgroup_version)

    # ---------------------------------------------------------------------- uid notifications
    def add_listener(self, fd):
        os.set_blocking(fd, False)
        self.listeners.append(fd)

    def drop_listener(self, fd):
        if fd in self.listeners:
            self.listeners.remove(fd)
            kernel.close(fd)

    def receive(self, listener):
        """Take one ``setresuid`` the filter handed over; it is answered by :meth:`decide`."""
        note = kernel.receive_notification(listener)
        if note is not None:
            self.pending.append((listener, note, time.monotonic() + DEFER_S))

    def decide(self):
        """Answer the pending ``setresuid`` calls: a copy's own one is let through, anything else
        fails with ``EPERM``. One that no expectation matches yet waits up to ``DEFER_S`` (the
        host's ``expect`` may still be in flight). Returns ``[(expectation, pid)]`` for the copies
        that became their own principal."""
        adopted, waiting = [], []
        now = time.monotonic()
        for listener, note, deadline in self.pending:
            verdict = self._verdict(note)
            early = verdict is not None and not verdict[0].ready  # its scratch is still being copied
            if (early or (verdict is None and now < deadline)) and kernel.notification_alive(listener, note.id):
                waiting.append((listener, note, deadline))
                continue
            allow = False
            if verdict is not None and kernel.notification_alive(listener, note.id):
                expectation, principal = verdict
                try:
                    self.attach(principal, note.pid)
                    allow = True
                except OSError:
                    allow = False
                if allow:
                    del self.expected[expectation.key]
                    principal.pid = note.pid
                    adopted.append((expectation, note.pid))
            kernel.answer_notification(listener, note.id, allow)
        self.pending = waiting
        return adopted

    def _verdict(self, note):
        """``(expectation, principal)`` when ``note`` is an expected copy asking for its uid."""
        uids = note.args[:3]
        if note.nr != self.setresuid_nr or not uids[0] == uids[1] == uids[2]:
            return None
        key = uids[0] & 0xFFFFFFFF
        expectation = self.expected.get(key)
        parent = self.by_key.get(expectation.parent) if expectation else None
        principal = self.by_key.get(key)
        if parent is None or principal is None or not self._is_copy(note.pid, parent):
            return None
        return expectation, principal

    def _is_copy(self, pid, parent):
        """A fresh fork of ``parent``'s worker: its child, single-threaded, still of its uid."""
        fields = status(pid)
        return (fields is not None and fields.get("PPid") == str(parent.pid) and fields.get("Tgid") == str(pid)
                and fields.get("Threads") == "1" and real_uid(fields) == parent.uid)

    def expired(self):
        """Expectations whose copy never asked in time (removed; the host is told)."""
        now = time.monotonic()
        late = [e for e in self.expected.values() if e.deadline <= now]
        for expectation in late:
            del self.expected[expectation.key]
        return late

    # -------------------------------------------------------------------- processes and memory
    def family(self, root_pid):
        """Every process below the root: ``[(pid, uid, rss_bytes, state, owner_key)]``. The owner is
        the principal of the process's uid, or (without uids) of the nearest worker above it."""
        workers = {p.pid: p.key for p in self.by_key.values() if p.pid}
        by_uid = {p.uid: p.key for p in self.by_key.values()} if self.uids else {}
        found, frontier = [], [(root_pid, None)]
        seen = set()
        while frontier:
            pid, owner = frontier.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if pid != root_pid:
                fields = status(pid)
                if fields is None:
                    continue
                uid = real_uid(fields)
                owner = by_uid.get(uid) if self.uids else workers.get(pid, owner)
                rss = fields.get("VmRSS", "0 kB").split()[0]
                found.append((pid, uid, int(rss) * 1024 if rss.isdigit() else 0,
                              fields.get("State", "?")[:1], owner))
            frontier.extend((child, owner) for child in _children(pid))
        return found

    def kill(self, principal, spare, root_pid=None, wait=True):
        """SIGKILL every process of ``principal`` but ``spare`` (its worker, when only its leftovers
        go), and processes that belong to nobody, until a walk of the family finds none that was
        not killed already (a killed process cannot fork any more). With ``wait``, until they are
        dead (zombies hold no memory, and their parent reaps them before its next fork)."""
        root_pid = root_pid or os.getpid()
        killed: set[int] = set()
        try:
            self._kill_loop(principal, spare, root_pid, killed)
        finally:
            end = time.monotonic() + (0.5 if wait else 0.0)
            for pid in killed:
                while time.monotonic() < end and state_of(pid) not in (None, "Z", "X"):
                    time.sleep(0.0002)

    def _kill_loop(self, principal, spare, root_pid, killed):
        for _ in range(200):
            victims = [pid for pid in self._members(principal, root_pid) if pid != spare and pid not in killed]
            if not victims:
                return
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            killed.update(victims)

    def _members(self, principal, root_pid):
        """The live processes of ``principal``: its cgroup's, exactly, wherever they are in the tree;
        else those the family walk attributes to it, and those that belong to nobody."""
        if principal.cgroup:
            return cgroup_pids(principal.cgroup)
        spared = (self._workers() - {principal.pid}) | self.helpers  # another principal's worker, the root's helpers
        return [pid for pid, _, _, state, owner in self.family(root_pid)
                if state not in ("Z", "X") and pid not in spared and (owner == principal.key or owner is None)]

    def _workers(self):
        return {p.pid for p in self.by_key.values() if p.pid}

    def poll_due(self):
        """Seconds until the next memory poll (``None``: nothing to poll)."""
        if self.cgroup_dir or not self.memory_bytes or not any(p.active for p in self.by_key.values()):
            return None
        return max(0.0, self.next_poll - time.monotonic())

    def poll_memory(self, root_pid):
        """Kill each running principal whose processes and scratch hold more than ``memory_bytes``;
        returns the principals killed."""
        self.next_poll = time.monotonic() + POLL_S
        active = {p.key: p for p in self.by_key.values() if p.active}
        used = dict.fromkeys(active, 0)
        for _, _, rss, _, owner in self.family(root_pid):
            if owner in used:
                used[owner] += rss
        killed = []
        for key, principal in active.items():
            if used[key] + _scratch_use(principal) > self.memory_bytes:
                principal.reason = "memory"
                principal.active = False
                self.kill(principal, spare=None, root_pid=root_pid)
                killed.append(principal)
        return killed

    def check_idle(self, principal, root_pid):
        """At a step's end, once its other processes are killed: kill the principal if its worker
        and its scratch hold more than ``memory_bytes`` (a step may end between two polls)."""
        fields = status(principal.pid) if principal.pid else None
        if fields is None:
            return self.poll_memory(root_pid)
        rss = fields.get("VmRSS", "0 kB").split()[0]
        if (int(rss) * 1024 if rss.isdigit() else 0) + _scratch_use(principal) > self.memory_bytes:
            principal.reason = "memory"
            self.kill(principal, spare=None, root_pid=root_pid)
        return []

    def tidy(self):
        """Retry removing directories that were busy."""
        self.leftover_paths = [p for p in self.leftover_paths if not _rmdir(p)]


# ------------------------------------------------------------------------------------ helpers
def _rmdir(path):
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _write(directory, name, value, required=True):
    try:
        with open(os.path.join(directory, name), "w") as f:
            f.write(str(value))
    except OSError:
        if required:
            raise


def _children(pid):
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return found


def _scratch_use(principal):
    """Bytes of the principal's scratch tmpfs in use, inodes counted at ``INODE_BYTES`` each."""
    if not principal.mounted:
        return 0
    try:
        info = os.statvfs(principal.scratch)
    except OSError:
        return 0
    return (info.f_blocks - info.f_bfree) * info.f_frsize + (info.f_files - info.f_ffree) * INODE_BYTES
