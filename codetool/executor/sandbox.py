"""The requests an executor family makes of its root for its workers: ``spawn`` a fresh worker
(a new principal), ``fork_worker`` (a copy of a worker's state in a new principal, within
``FORK_TIMEOUT_S``), ``begin``/``end`` of a step (the worker resumed; then stopped, and the rest of
its principal killed), ``release_worker`` (the whole principal killed, its scratch removed).

The family itself (its root process, modes, restarts, principals' keys) is
:class:`codetool.executor.family.Family`; one step's protocol is ``codetool.executor.step``.
"""

from __future__ import annotations

import os
import socket
import time

from codetool.executor import adoption
from codetool.executor.channel import Conn, ProtocolError, log_safe, read_available
from codetool.executor.config import ExecutorConfig
from codetool.executor.family import REQUEST_TIMEOUT_S, Family, WorkerHandle
from codetool.executor.launch import ExecutorError, _warn_once
from codetool.executor.root_link import RootLink

FORK_TIMEOUT_S = 1.0  # a fork whose state does not copy within this fails (one failed candidate)


class ForkFailed(Exception):
    """A fork that did not give a working copy of the state.

    Args:
        kind (`str`): ``violation`` (the state's worker sent something that is not a valid
            frame) or ``lost`` (it did not answer, or the copy did not start, within
            ``FORK_TIMEOUT_S``).
        parent_lost (`bool`): the state's worker itself misbehaved and was killed.
    """

    def __init__(self, kind: str, message: str, parent_lost: bool):
        super().__init__(message)
        self.kind, self.parent_lost = kind, parent_lost


class Sandbox(Family):
    """The processes of one executor family (:class:`Family`) and the requests for its workers.

    Args:
        config (`ExecutorConfig`): limits and isolation mode.
        tool_names (`list[str]`): the tool functions a worker defines unless :meth:`spawn` is given
            its own (a family shared by executors of different tasks, ``codetool.executor.pool``).
    Raises:
        ExecutorError: when the requested isolation cannot start here.
    """

    def __init__(self, config: ExecutorConfig, tool_names: list[str]):
        self.tool_names = list(tool_names)
        super().__init__(config)

    def spawn(self, tool_names: list[str] | None = None) -> WorkerHandle:
        """A fresh worker with an empty state (a new principal) whose tool functions are
        ``tool_names`` (default: the family's)."""
        key = self._new_key()
        tools = list(self.tool_names if tool_names is None else tool_names)
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        read_fd, write_fd = os.pipe()
        try:
            reply = self._call({"op": "spawn", "key": key, "tools": tools,
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
        handle = self._handshake(host_end, read_fd, key)
        if self._host is not None:
            handle.host_pid = adoption.host_pid_of(self._host.cgroup_of(key))
        if self.principals and not handle.info.get("principal"):
            _warn_once("the kernel gives the sandbox no seccomp listener (Linux >= 5.5 needed): forks "
                       "share their parent's uid, so candidates are not separate principals")
            self.principals = False
            handle.uid = None
        if not self.isolation:
            self.isolation = self._describe(handle.info)
        return handle

    def _handshake(self, host_end: socket.socket, read_fd: int, key: int) -> WorkerHandle:
        os.set_blocking(read_fd, False)
        conn = Conn(host_end)
        try:
            hello = conn.wait_frame(REQUEST_TIMEOUT_S)
            if hello.get("op") != "hello" or not isinstance(hello.get("pid"), int):
                raise EOFError(f"unexpected first frame {hello.get('op')!r}")
        except (EOFError, TimeoutError, ValueError, ProtocolError) as exc:
            detail = (read_available(read_fd) or b"").decode("utf-8", "replace").strip()[-500:]
            conn.close()
            os.close(read_fd)
            self._tell({"op": "release", "key": key})
            self._free_key(key)
            raise ExecutorError(f"a sandbox worker did not start: {log_safe(detail or exc, 500)}") from None
        return self._track(WorkerHandle(conn=conn, output_fd=read_fd, pid=hello["pid"], key=key,
                                        uid=key if self.principals else None, scratch=self.scratch_of(key), info=hello))

    @property
    def _cgroup_version(self) -> int:
        """The family cgroup's version (the host manages principals only inside one)."""
        assert self._cgroup is not None
        return self._cgroup[1]

    def fork_worker(self, parent: WorkerHandle) -> WorkerHandle:
        """A new worker holding a copy of ``parent``'s state (``os.fork`` inside the sandbox), its
        own principal with a copy of ``parent``'s scratch.

        Raises:
            ForkFailed: the copy did not start within ``FORK_TIMEOUT_S`` (or the parent answered
                with something that is not a frame).
            ExecutorError: the family's root is gone.
        """
        key = self._new_key()
        link = self._current_link()
        host = self._host
        deadline = time.monotonic() + FORK_TIMEOUT_S
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        read_fd, write_fd = os.pipe()
        resumed = False
        try:
            if host is not None:
                host.expect(key, *_managed(parent))
                if parent.stopped:  # it has threads: they run only while the fork is made
                    host.resume(*_managed(parent))
                    parent.stopped, resumed = False, True
            try:
                rid = link.send({"op": "expect", "key": key, "parent": parent.key}, reply=True)
            except EOFError as exc:
                raise ExecutorError(f"the sandbox root process failed: {exc}") from None
            prepared = None
            if not self.principals:  # no setresuid to hold the copy back: its scratch must exist first
                prepared = self._fork_prepared(link, rid, deadline)
            frame = {"op": "fork", "uid": key if self.principals else None, "scratch": self.scratch_of(key)}
            try:
                parent.conn.send_with_fds(frame, [worker_end.fileno(), write_fd], timeout=FORK_TIMEOUT_S)
                reply = _fork_reply(parent.conn, deadline)
            except ProtocolError as exc:
                raise ForkFailed("violation", f"the state's worker sent malformed data ({exc})", True) from None
            except (EOFError, TimeoutError, OSError) as exc:
                raise ForkFailed("lost", f"the state's worker did not fork within {FORK_TIMEOUT_S:g} s ({exc})",
                                 True) from None
            if reply.get("op") != "forked" or not isinstance(reply.get("pid"), int):
                raise ForkFailed("lost", f"the state's worker could not fork: {log_safe(reply.get('error'))}", False)
            if prepared is None:
                prepared = self._fork_prepared(link, rid, deadline)
            host_pid = None
            if host is not None:
                host.prepared(key)
                try:
                    host_pid = host.wait(key, deadline)
                except TimeoutError:
                    raise ForkFailed("lost", f"the copy of the state did not start within {FORK_TIMEOUT_S:g} s",
                                     False) from None
        except (ForkFailed, ExecutorError):
            host_end.close()
            os.close(read_fd)
            if host is not None:
                host.forget(key)
            self._tell({"op": "release", "key": key})
            self._free_key(key)
            raise
        finally:
            worker_end.close()
            os.close(write_fd)
            if resumed and host is not None:  # stop it again, and kill what its threads started meanwhile
                parent.stopped = host.stop(parent.key, *_managed(parent))
                host.sweep(parent.key, _managed(parent)[1], spare=parent.host_pid)
        pid = prepared["pid"] if prepared.get("op") == "adopted" else reply["pid"]
        if not self.principals:  # the root learns the copy's pid from its zygote (there is no setresuid)
            self._tell({"op": "adopt", "key": key, "pid": pid})
        os.set_blocking(read_fd, False)
        return self._track(WorkerHandle(conn=Conn(host_end), output_fd=read_fd, pid=pid, key=key,
                                        uid=key if self.principals else None, scratch=self.scratch_of(key),
                                        host_pid=host_pid))

    @staticmethod
    def _fork_prepared(link: RootLink, rid: int, deadline: float) -> dict:
        """The root's answer to ``expect``: the new principal is ready (or its copy adopted)."""
        try:
            prepared = link.wait(rid, max(0.001, deadline - time.monotonic()))
        except TimeoutError:
            raise ForkFailed("lost", f"the copy of the state did not start within {FORK_TIMEOUT_S:g} s",
                             False) from None
        except EOFError as exc:
            raise ExecutorError(f"the sandbox root process failed: {exc}") from None
        if prepared.get("op") not in ("adopted", "prepared"):
            raise ForkFailed("lost", f"the copy of the state did not start: {log_safe(prepared.get('error'))}", False)
        return prepared

    def begin(self, worker: WorkerHandle) -> None:
        """A step of ``worker`` starts: it is resumed if it was stopped (and its memory polled)."""
        if self._host is None:
            self._tell({"op": "begin", "key": worker.key})
        elif worker.stopped:
            self._host.resume(*_managed(worker))
            worker.stopped = False

    def end(self, worker: WorkerHandle) -> dict:
        """A step of ``worker`` ended: it is stopped (if it has threads of its own) and every other
        process of its principal is killed. Returns ``{"reason": str | None, "oom": int}``
        (``reason`` is ``memory`` when the root killed the principal at its memory budget; ``oom``
        counts the processes the kernel killed at the cgroup's limit during the step)."""
        host = self._host
        if host is None:
            try:
                return self._call({"op": "end", "key": worker.key})
            except ExecutorError:
                return {}
        worker.stopped = host.stop(worker.key, *_managed(worker))
        host.sweep(worker.key, _managed(worker)[1], spare=worker.host_pid)
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
    assert worker.host_pid is not None and worker.uid is not None
    return worker.host_pid, worker.uid


def _fork_reply(conn: Conn, deadline: float) -> dict:
    """The parent worker's answer to ``fork`` (frames its code sent between runs are skipped)."""
    while True:
        frame = conn.wait_frame(max(0.0, deadline - time.monotonic()))
        if frame.get("op") in ("forked", "fork_failed"):
            return frame
