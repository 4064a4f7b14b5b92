"""The requests an executor family makes of its root and its workers' keepers: ``spawn`` a worker
with an empty state (a new principal: a fork of the family's template, a fresh interpreter that
never runs a step), ``fork_worker`` (a copy of a worker's state in a new principal),
``begin``/``end`` of a step (its memory watched; then every process of its principal but its
worker killed), ``release_worker`` (the whole principal killed, its scratch removed).

A fork involves three processes: the root prepares the copy's principal (scratch copied, the
parent's open files mapped), the parent's keeper forks, the copy's keeper becomes the principal
(one ``setresuid``, let through by the host or the root) and says hello. Each wait has a deadline
that counts only time the machine gave the sandbox (:func:`starved`): a busy host makes a fork
slower, never a failure of the code. A fork that still does not complete is a
:class:`ForkFailed` of kind ``infra``; the executor retries it (``ExecutorConfig.infra_retries``).

The family itself (its root process, modes, restarts, principals' keys) is
:class:`codetool.executor.host.family.Family`; one step's protocol is ``codetool.executor.host.step``.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time

from codetool.executor.config import ExecutorConfig
from codetool.executor.host.channel import (
    control_pair,
    log_safe,
    read_available,
    send_message,
    wait_message,
)
from codetool.executor.host.family import REQUEST_TIMEOUT_S, Family, WorkerHandle
from codetool.executor.host.launch import ExecutorError, _warn_once
from codetool.executor.host.report import asleep_in_receive
from codetool.executor.host.root_link import RootLink
from codetool.executor.kernel.procs import cgroup_pids, soft_limits
from codetool.executor.kernel.schedstat import Watch

FORK = struct.Struct(">qH")  # as inside.keeper.FORK
HELLO = struct.Struct(">iq")  # as inside.keeper.HELLO
# the rlimits whose lowering can keep a fork or a step's thread from starting (not fsize, core)
STARTING_LIMITS = ("as", "data", "cpu", "nofile", "nproc")
ADDRESS_SPACE_ROOM = 32 << 20  # bytes under RLIMIT_AS a state must leave for its next step's thread


class ForkFailed(Exception):
    """A fork that did not give a working copy of the state.

    Args:
        kind (`str`): ``infra`` (a deadline on a busy or failing machine, a resource the host or the
            kernel refused, a lost worker: retried, then the step is not executed) or ``violation``
            (the state's keeper answered with something that is not part of the protocol).
        parent_lost (`bool`): the state's worker itself is gone or was killed.
    """

    def __init__(self, kind: str, message: str, parent_lost: bool):
        super().__init__(message)
        self.kind, self.parent_lost = kind, parent_lost


class Sandbox(Family):
    """The processes of one executor family (:class:`Family`) and the requests for its workers.

    Args:
        config (`ExecutorConfig`): limits and isolation mode.
        tool_names (`list[str]`): the tool functions a worker defines unless :meth:`spawn` is given
            its own (a family shared by executors of different tasks, ``codetool.executor.host.pool``).
    Raises:
        ExecutorError: when the requested isolation cannot start here.
    """

    def __init__(self, config: ExecutorConfig, tool_names: list[str]):
        self.tool_names = list(tool_names)
        self.counts = {"retries": 0, "recovered": 0, "not_executed": 0}  # infrastructure failures
        self._template: WorkerHandle | None = None  # the fresh worker that spawn forks
        self._template_lock = threading.Lock()
        self.applied_limits: set[str] = set()  # the rlimits the workers' spawn set (its hello says which)
        super().__init__(config)

    def spawn(self, tool_names: list[str] | None = None, timeout: float | None = None) -> WorkerHandle:
        """A worker with an empty state (a new principal) whose tool functions are ``tool_names``
        (default: the family's): a fork of the family's *template*, a fresh interpreter that never
        runs a step (started at the first spawn, again when it is gone); the copy defines its
        tools before its first step. A fork takes milliseconds where a fresh interpreter takes a
        tenth of a second or more (its imports).

        Raises:
            ExecutorError: the worker could not be started (a fresh template included) within
                ``timeout`` (fork: ``start_timeout_s``; fresh interpreter: 4 times as much).
        """
        tools = list(self.tool_names if tool_names is None else tool_names)
        with self._template_lock:
            template = self._template
            if template is not None and template.dead():
                self._template = None
                self.release_worker(template, wait=False)
                template.close()
                template = None
            if template is None:
                self._template = template = self._spawn_fresh([], timeout)
            try:
                return self.fork_worker(template, None, tools)
            except ForkFailed as exc:
                if exc.parent_lost:
                    self._template = None
                raise ExecutorError(f"a sandbox worker could not be started ({exc})") from None

    def _spawn_fresh(self, tools: list[str], timeout: float | None = None) -> WorkerHandle:
        """A fresh worker interpreter (a new principal) defining ``tools``."""
        timeout = timeout or max(REQUEST_TIMEOUT_S, 4 * self.config.start_timeout_s)
        key = self._new_key()
        host_end, worker_end = control_pair()
        read_fd, write_fd = os.pipe()
        try:
            reply = self._call({"op": "spawn", "key": key, "tools": tools, "grace": self.config.grace_s,
                                "max_output_chars": self.config.max_output_chars},
                               [worker_end.fileno(), write_fd])
            if reply.get("op") != "spawned":
                raise ExecutorError(f"a sandbox worker did not start: {log_safe(reply.get('error'), 300)}")
            if reply.get("listener") and self._link is not None:
                listener = self._link.take_fd()
                if listener is not None and self._host is not None:
                    self._host.add_listener(listener)
        except ExecutorError:
            host_end.close()
            os.close(read_fd)
            self._free_key(key)
            raise
        finally:
            worker_end.close()
            os.close(write_fd)
        handle = self._handshake(host_end, read_fd, key, timeout, reply.get("pid"))
        if self.principals and not handle.info.get("principal"):
            _warn_once("the kernel gives the sandbox no seccomp listener (Linux >= 5.5 needed): forks "
                       "share their parent's uid, so candidates are not separate principals")
            self.principals = False
            handle.uid = None
        if not self.isolation:
            self.isolation = self._describe(handle.info)
        self.applied_limits = set(handle.info.get("limits") or [])
        return handle

    def lowered_limits(self, worker: WorkerHandle) -> list[str]:
        """The rlimits this family set on its workers that ``worker`` now has lower: its state lowered
        them (``resource.setrlimit``), so a fork or a step that cannot start then is the state's
        failure, never the machine's (``[]`` when none is lower or the worker is gone). Only the
        limits that can keep a process or thread from starting count (``STARTING_LIMITS``)."""
        now = soft_limits(worker.pid)
        lowered = []
        for name, value in self._limits().items():
            soft = value[0] if isinstance(value, list) else value
            if name in STARTING_LIMITS and name in self.applied_limits and now.get(name) is not None and now[name] < soft:
                lowered.append(name)
        return lowered

    def address_space_full(self, worker: WorkerHandle) -> bool:
        """Whether ``worker``'s state holds (nearly) all the address space its ``RLIMIT_AS`` allows
        (less than ``ADDRESS_SPACE_ROOM`` left): a step that cannot start then failed by its
        state's doing (its thread died of ``MemoryError`` before it ran; red team, round 5), never
        the machine's. ``False`` when the limit is unset or the worker is gone."""
        limit = soft_limits(worker.pid).get("as")
        try:
            with open(f"/proc/{worker.pid}/status") as f:
                size = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return False
        return limit is not None and limit - size < ADDRESS_SPACE_ROOM

    def _handshake(self, host_end, read_fd: int, key: int, timeout: float, sandbox_pid) -> WorkerHandle:
        os.set_blocking(read_fd, False)
        try:
            data, pid = _wait_hello(host_end, timeout)
            _, uid = HELLO.unpack_from(data, 1)
            info = dict(json.loads(data[1 + HELLO.size:].decode("ascii") or "{}"), uid=uid)
        except (EOFError, TimeoutError, ValueError) as exc:
            detail = (read_available(read_fd) or b"").decode("utf-8", "replace").strip()[-500:]
            host_end.close()
            os.close(read_fd)
            self._tell({"op": "release", "key": key})
            self._free_key(key)
            raise ExecutorError(f"a sandbox worker did not start: {log_safe(detail or exc, 500)}") from None
        return self._track(WorkerHandle(ctl=host_end, output_fd=read_fd, pid=pid, key=key,
                                        uid=key if self.principals else None, scratch=self.scratch_of(key),
                                        sandbox_pid=sandbox_pid, info=info))

    @property
    def _cgroup_version(self) -> int:
        """The family cgroup's version (the host manages principals only inside one)."""
        assert self._cgroup is not None
        return self._cgroup[1]

    def fork_worker(self, parent: WorkerHandle, timeout: float | None = None,
                    tool_names: list[str] | None = None) -> WorkerHandle:
        """A new worker holding a copy of ``parent``'s state (``os.fork`` by its keeper), its own
        principal with a copy of ``parent``'s scratch and open files.

        Args:
            parent (`WorkerHandle`): an idle worker.
            timeout (`float`, *optional*): seconds the fork may take, counted as :func:`starved`
                allows (defaults to ``config.start_timeout_s``).
            tool_names (`list[str]`, *optional*): the copy's tool functions, in place of the
                parent's (a copy of the template, :meth:`spawn`).
        Raises:
            ForkFailed: the copy did not start (see its ``kind``).
            ExecutorError: the family's root is gone.
        """
        budget = timeout or self.config.start_timeout_s
        key = self._new_key()
        link = self._current_link()
        host = self._host
        watch = Watch([parent.pid] + ([self.root_pid] if self.root_pid else []))
        ctl_host, ctl_worker = control_pair()
        read_fd, write_fd = os.pipe()
        copy: WorkerHandle | None = None
        pid = None
        try:
            if host is not None:
                host.expect(key, *_managed(parent))
            try:
                rid = link.send({"op": "expect", "key": key, "parent": parent.key, "timeout": 2 * budget}, reply=True)
            except EOFError as exc:
                raise ExecutorError(f"the sandbox root process failed: {exc}") from None
            name = os.path.basename(self.scratch_of(key)).encode("ascii")
            request = b"F" + FORK.pack(key if self.principals else -1, len(name)) + name
            if tool_names is not None:
                request += json.dumps(list(tool_names)).encode("ascii")
            try:
                send_message(parent.ctl, request, [ctl_worker.fileno(), write_fd])
                reply = self._wait(budget, watch, lambda: wait_message(parent.ctl, 0.05)[0], "the state's worker",
                                   deaf=parent.pid)
            except EOFError as exc:
                raise ForkFailed("infra", f"the state's worker is gone ({exc})", True) from None
            if reply[:1] == b"x":
                raise ForkFailed("infra", f"the state's worker could not fork: {log_safe(reply[1:].decode('ascii', 'replace'))}",
                                 False)
            if reply[:1] != b"f" or len(reply) != 5:
                raise ForkFailed("violation", "the state's worker answered a fork with something else", True)
            pid = int.from_bytes(reply[1:5], "big", signed=True)
            prepared = self._fork_prepared(link, rid, budget, watch)
            if host is not None:
                host.prepared(key)
            if not self.principals:  # the root learns the copy's pid from its zygote (there is no setresuid)
                self._tell({"op": "adopt", "key": key, "pid": pid})
            send_message(ctl_host, b"M" + bytes.fromhex(prepared.get("fdmap") or ""))
            data, host_pid = self._wait(budget, watch, lambda: _wait_hello(ctl_host, 0.05), "the copy")
            if host is not None:
                host.wait(key, time.monotonic() + 1.0)
            os.set_blocking(read_fd, False)
            copy = self._track(WorkerHandle(ctl=ctl_host, output_fd=read_fd, pid=host_pid, key=key,
                                            uid=key if self.principals else None, scratch=self.scratch_of(key),
                                            sandbox_pid=prepared.get("pid") or pid))
            return copy
        except (ForkFailed, ExecutorError, EOFError) as exc:
            if copy is None:
                ctl_host.close()
                os.close(read_fd)
                if host is not None:
                    host.forget(key)
                self._tell({"op": "release", "key": key})
                self._free_key(key)
            if isinstance(exc, EOFError):
                raise ForkFailed("infra", f"the copy of the state did not start ({exc})", False) from None
            raise
        finally:
            ctl_worker.close()
            os.close(write_fd)

    def _wait(self, budget: float, watch: Watch, attempt, waiting_for: str, deaf: int | None = None):
        """Call ``attempt`` (which raises ``TimeoutError`` while nothing came) until it answers or
        ``budget`` seconds passed that the processes doing the work could run (:class:`Watch`),
        up to ``busy_backstop`` times ``budget`` in all. ``deaf``: the worker asked; one asleep in
        its receive once ``budget`` passed never saw the request (its state's doing: a violation)."""
        while True:
            try:
                return attempt()
            except TimeoutError:
                elapsed = time.monotonic() - watch.start
                if elapsed < budget:
                    continue
                if deaf is not None and asleep_in_receive(deaf):
                    try:
                        return attempt()  # (an answer it sent before it slept)
                    except TimeoutError:
                        raise ForkFailed("violation", "the state's worker never received the fork request (its "
                                                      "state changed its control channel, fd 3)", True) from None
                if elapsed - watch.starved() < budget and elapsed < budget * self.config.busy_backstop:
                    continue
                raise ForkFailed("infra", f"the copy of the state did not start within {budget:g} s ({waiting_for} "
                                          f"did not answer; its processes waited {watch.starved():.1f} s of "
                                          f"{elapsed:.1f} s for a CPU)", False) from None

    def _fork_prepared(self, link: RootLink, rid: int, budget: float, watch: Watch) -> dict:
        """The root's answer to ``expect``: the new principal is ready (or its copy adopted)."""
        def ask():
            try:
                return link.wait(rid, 0.05, keep=True)
            except EOFError as exc:
                raise ExecutorError(f"the sandbox root process failed: {exc}") from None

        try:
            prepared = self._wait(budget, watch, ask, "the sandbox root")
        finally:
            link.forget(rid)
        if prepared.get("op") not in ("adopted", "prepared"):
            raise ForkFailed("infra", f"the copy of the state did not start: {log_safe(prepared.get('error'))}", False)
        return prepared

    def principal_pids(self, worker: WorkerHandle) -> list[int]:
        """The other processes of ``worker``'s principal on the host (its cgroup's, else by its uid)."""
        if self._host is not None:
            return [pid for pid in cgroup_pids(self._host.cgroup_of(worker.key)) if pid != worker.pid]
        if worker.uid is None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == worker.pid:
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == worker.uid:
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def begin(self, worker: WorkerHandle) -> None:
        """A step of ``worker`` starts: without a memory cgroup, the root watches its memory."""
        if self._host is None:
            self._tell({"op": "begin", "key": worker.key})

    def end(self, worker: WorkerHandle) -> dict:
        """A step of ``worker`` ended: every process of its principal but the worker is killed.
        Returns ``{"reason": str | None, "oom": int}`` (``reason`` is ``memory`` when the root killed
        the principal at its memory budget; ``oom`` counts the processes the kernel killed at the
        cgroup's limit during the step)."""
        host = self._host
        if host is None:
            try:
                return self._call({"op": "end", "key": worker.key})
            except ExecutorError:
                return {}
        host.sweep(worker.key, _managed(worker)[1], spare=worker.pid)
        seen = host.oom_kills(worker.key, self._cgroup_version)
        oom, worker.oom_seen = seen - worker.oom_seen, seen
        return {"oom": oom}

    def release_worker(self, worker: WorkerHandle, wait: bool = True) -> dict | None:
        """Kill ``worker``'s whole principal and remove its scratch. With ``wait``, returns how the
        worker ended (``{"signal": n}`` / ``{"exit": n}`` when the root is its parent) and why it
        was killed (``reason``, ``oom``), else ``None`` at once."""
        frame = {"op": "release", "key": worker.key}
        self._free_key(worker.key)
        oom = 0
        if self._host is not None:
            oom = self._host.oom_kills(worker.key, self._cgroup_version) - worker.oom_seen
            self._host.sweep(worker.key, _managed(worker)[1], spare=None, wait=wait)
        if not wait:
            self._tell(frame)
            return None
        try:
            reply = self._call(frame)
        except ExecutorError:
            return None
        status = dict(reply.get("status") or {})
        if reply.get("reason"):
            status["reason"] = reply["reason"]
        if reply.get("oom") or oom:
            status["oom"] = reply.get("oom") or oom
        return status


def _managed(worker: WorkerHandle) -> tuple[int, int]:
    """``(host pid, uid)`` of a worker whose principal the host manages (it has both then)."""
    assert worker.uid is not None
    return worker.pid, worker.uid


def _wait_hello(sock, timeout: float) -> tuple[bytes, int]:
    """A keeper's hello (``h``, its pid and uid, and a description when it was spawned) and the pid
    the kernel gave with it; other messages before it are dropped."""
    end = time.monotonic() + timeout
    while True:
        data, pid = wait_message(sock, max(0.0, end - time.monotonic()))
        if data[:1] == b"h" and len(data) >= 1 + HELLO.size and pid:
            return data, pid
