"""The host's side of a family's principals when the host may use a memory cgroup per principal:
the seccomp listeners that decide each fork copy's one ``setresuid``, and the sweep and kill of a
principal's processes, found through its cgroup.

Doing this here rather than in the sandbox root keeps the root off the critical path of a fork
and of a run's end (on a busy machine every extra process that must be scheduled costs up to a
few milliseconds): a fork waits for the copy's own call, answered by the thread that forked; a
run's end reads one ``cgroup.procs`` file and signals what it lists. Processes are signalled
through pidfds opened after checking their uid, so a pid recycled meanwhile is never touched.

Without a cgroup (or without a uid per principal) the sandbox root does all of it instead
(``inside.principals``).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from dataclasses import dataclass

from codetool.executor.kernel import calls as kernel
from codetool.executor.kernel.procs import cgroup_pids, oom_kills, real_uid, state_of, status

SWEEP_WAIT_S = 0.5  # how long a sweep waits for the processes it killed to die


def signal_if(pid: int, uid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` if it is (still) a process of ``uid``; through a pidfd, so a pid that
    was recycled between the check and the signal is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        fields = status(pid)
        if fields is None or real_uid(fields) != uid:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@dataclass
class _Expected:
    parent_pid: int  # host pid of the worker that forks
    parent_uid: int
    cgroup: str  # the new principal's cgroup directory
    prepared: bool = False  # the root made its scratch and cgroup


class Principals:
    """The host's view of one family's principals (see the module docstring).

    Args:
        cgroup_dir (`str`): the family's cgroup directory (``codetool.executor.kernel.cgroups``).
        setresuid_nr (`int`): the syscall number the filters hand over.
    """

    def __init__(self, cgroup_dir: str, setresuid_nr: int):
        self.cgroup_dir, self.setresuid_nr = cgroup_dir, setresuid_nr
        self.listeners: list[int] = []
        self._expected: dict[int, _Expected] = {}
        self._adopted: dict[int, int] = {}
        self._pending: list[tuple[int, kernel.Notification]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._reader: threading.Thread | None = None

    def cgroup_of(self, key: int) -> str:
        return os.path.join(self.cgroup_dir, f"c{key}")

    def add_listener(self, fd: int) -> None:
        os.set_blocking(fd, False)
        with self._cond:
            self.listeners.append(fd)
            if self._reader is None:  # one thread per family answers every call at once
                self._reader = threading.Thread(target=self._serve, name="codetool-sandbox-listener", daemon=True)
                self._reader.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            fds, self.listeners, self._pending = self.listeners, [], []
            self._cond.notify_all()
        for fd in fds:
            kernel.close(fd)

    # ------------------------------------------------------------------------------ adoption
    def expect(self, key: int, parent_pid: int, parent_uid: int) -> None:
        with self._cond:
            self._expected[key] = _Expected(parent_pid, parent_uid, self.cgroup_of(key))

    def prepared(self, key: int) -> None:
        with self._cond:
            if key in self._expected:
                self._expected[key].prepared = True
            self._cond.notify_all()

    def forget(self, key: int) -> None:
        with self._cond:
            self._expected.pop(key, None)
            self._adopted.pop(key, None)

    def wait(self, key: int, deadline: float) -> int:
        """The host pid of the copy that became principal ``key``, once the kernel has made the
        change.

        Raises:
            TimeoutError: it did not ask for its uid by ``deadline`` (``time.monotonic()``).
        """
        with self._cond:
            while key not in self._adopted:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    self._expected.pop(key, None)
                    raise TimeoutError("the copy did not ask for its uid in time")
                self._cond.wait(left)
            pid = self._adopted.pop(key)
        while time.monotonic() < deadline:  # let through: the change happens when it runs again
            fields = status(pid)
            if fields is None or real_uid(fields) == key:
                break
            time.sleep(0.0001)
        return pid

    def _serve(self) -> None:
        """Read the listeners and answer what can be answered (see :meth:`_decide`)."""
        while True:
            with self._cond:
                if self._closed:
                    return
                fds = list(self.listeners)
                waiting = bool(self._pending)
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            try:
                events = poller.poll(5 if waiting else 200)
            except OSError:
                events = []
            for fd, mask in events:
                if mask & select.POLLIN:
                    note = kernel.receive_notification(fd)
                    if note is not None:
                        with self._cond:
                            self._pending.append((fd, note))
                elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    with self._cond:
                        if fd in self.listeners:  # every worker of that lineage is gone
                            self.listeners.remove(fd)
                            kernel.close(fd)
            self._decide()

    def _decide(self) -> None:
        """Let an expected copy's own call through (once its scratch is ready); fail any other
        with ``EPERM`` at once; a copy whose scratch is not ready yet waits a little (its thread
        is blocked in the kernel meanwhile)."""
        with self._cond:
            pending, self._pending = self._pending, []
        waiting = []
        for fd, note in pending:
            verdict = self._verdict(note)
            if verdict == "wait" and kernel.notification_alive(fd, note.id):
                waiting.append((fd, note))
                continue
            allow = False
            if isinstance(verdict, tuple) and kernel.notification_alive(fd, note.id):
                key, expected = verdict
                try:
                    with open(os.path.join(expected.cgroup, "cgroup.procs"), "w") as f:
                        f.write(str(note.pid))
                    allow = True
                except OSError:
                    allow = False
                if allow:
                    with self._cond:
                        self._adopted[key] = note.pid
                        self._expected.pop(key, None)
            kernel.answer_notification(fd, note.id, allow)
            if allow:
                with self._cond:
                    self._cond.notify_all()
        if waiting:
            with self._cond:
                self._pending.extend(waiting)

    def _verdict(self, note: kernel.Notification):
        uids = note.args[:3]
        if note.nr != self.setresuid_nr or not uids[0] == uids[1] == uids[2]:
            return None
        key = uids[0] & 0xFFFFFFFF
        with self._cond:
            expected = self._expected.get(key)
        if expected is None:  # the host registers a fork before the worker hears of it
            return None
        fields = status(note.pid)
        if (fields is None or fields.get("PPid") != str(expected.parent_pid) or fields.get("Tgid") != str(note.pid)
                or fields.get("Threads") != "1" or real_uid(fields) != expected.parent_uid):
            return None
        return (key, expected) if expected.prepared else "wait"

    # ------------------------------------------------------------------------- sweep, kill
    def sweep(self, key: int, uid: int, spare: int | None, wait: bool = True) -> None:
        """Kill every process of principal ``key`` but ``spare``; with ``wait``, until they died (a
        moment at most), else until none is left that was not killed (a killed process cannot
        fork any more)."""
        directory = self.cgroup_of(key)
        killed: set[int] = set()
        end = time.monotonic() + SWEEP_WAIT_S
        while time.monotonic() < end:
            victims = [pid for pid in cgroup_pids(directory) if pid != spare and pid not in killed]
            for pid in victims:
                if signal_if(pid, uid, signal.SIGKILL):
                    killed.add(pid)
                elif state_of(pid) in (None, "Z", "X"):
                    killed.add(pid)
            if not victims:
                if not wait or not any(state_of(pid) not in (None, 'Z', 'X') for pid in killed):
                    return
                time.sleep(0.0002)

    def oom_kills(self, key: int, version: int) -> int:
        """Processes of principal ``key`` the kernel killed at its memory limit so far."""
        return oom_kills(self.cgroup_of(key), version)
