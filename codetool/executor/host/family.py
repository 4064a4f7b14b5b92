"""The processes of one executor *family* (a root executor and every executor forked from it,
directly or not): start its root, restart it when it dies, stop it, and carry the root's requests.
The requests for workers (spawn, fork, a step's begin and end, release) are
:class:`codetool.executor.host.sandbox.Sandbox`'s, on top of this.

A family is one root process (``inside/root.py``) started either inside bubblewrap
(``bwrap`` mode: new network, pid, ipc and uts namespaces, a read-only root built from ``/usr``
and a few ``/etc`` files, ``/proc`` of the new pid namespace (each principal sees only its own
processes there), a minimal ``/dev``, and a ``/tmp`` where only the root may create anything)
or directly (``fallback`` mode: a family directory, plus network and mount namespaces when the
host is root). In both modes the environment is :func:`codetool.secrets.sandbox_environment`
and stdin is ``/dev/null``.

Every executor is a *principal* (``inside.principals``): when the host is root, its own uid
(picked here at random, for every spawn and every fork), its own scratch directory (a tmpfs of
``scratch_mb`` and ``max_files`` inodes, mounted by the root), its own memory budget (a cgroup
where the host may create one, see ``codetool.executor.kernel.cgroups``, else polled by the root). A
worker runs code of the state only during a step: between steps its keeper holds no thread, timer
or handler of the state (``inside.keeper``), and at ``end`` the root kills every other process
of its principal.

The root never runs model code. It execs every worker as a fresh interpreter
(``inside.spawn``). In bubblewrap it keeps CAP_SETUID, CAP_SETGID, CAP_KILL (uids and kills),
CAP_SYS_ADMIN (scratch mounts, the workers' mount namespaces), CAP_CHOWN, CAP_DAC_OVERRIDE and
CAP_FOWNER (copying a parent's scratch for a fork); a worker keeps only CAP_SETUID, whose every
use goes through the root (``codetool.executor.kernel.seccomp``).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import IO

from codetool.executor.config import ExecutorConfig
from codetool.executor.host import adoption, scratch
from codetool.executor.host.channel import ProtocolError, read_message
from codetool.executor.host.launch import (
    BOOTSTRAP,
    CGROUP_MOUNT,
    NAMESPACES,
    WORKER_BOOT,
    ExecutorError,
    _bwrap_argv,
    _sandbox_sources,
    _warn_once,
    bwrap_problem,
    interpreter_info,
    others_can_use,
    resolve_python,
)
from codetool.executor.host.root_link import RootLink
from codetool.executor.kernel import cgroups, schedstat
from codetool.executor.kernel.seccomp import filter_program, syscall_numbers
from codetool.secrets import sandbox_environment

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0
UID_BASE, UID_SPAN = 1_000_000_000, 3_000_000_000  # principals' uids (below 2**32 - 1)
_LIVE: weakref.WeakSet[Family] = weakref.WeakSet()
_KEYS: set[int] = set()  # uids of the live principals of this process
_KEYS_LOCK = threading.Lock()


@dataclass(eq=False)  # compared (and hashed) by identity
class WorkerHandle:
    """The host's view of one worker: the host's end of its keeper's control socket
    (``inside.keeper``), the read end of its output pipe, its pid on the host (from the kernel, with
    its first message), its principal (``key``; its ``uid`` when uids are per principal), its scratch
    directory, its pid in the sandbox (as the root counts) and the CPU seconds it used so far."""

    ctl: socket.socket
    output_fd: int
    pid: int
    key: int
    uid: int | None = None
    scratch: str = ""
    sandbox_pid: int | None = None
    pidfd: int | None = None  # to kill it when its root is gone (fallback mode as the host user)
    oom_seen: int = 0
    cpu_s: float = 0.0
    info: dict = field(default_factory=dict)
    stray: bool = False  # a step report (E, N, V) came between steps: the last step forged one

    def dead(self) -> bool:
        """Whether the worker is gone (checked without blocking; messages left from an earlier step
        are dropped; a step report among them sets ``stray``)."""
        while True:
            got = read_message(self.ctl)
            if got is None:
                return False
            if not got[0]:
                return True
            self.stray = self.stray or got[0][:1] in (b"E", b"N", b"V")

    def close(self) -> None:
        try:
            self.ctl.close()
        except OSError:
            pass
        for fd in (self.output_fd, self.pidfd):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass
        self.pidfd = None


def separate_principals(config: ExecutorConfig) -> bool:
    """Whether the executors of a family with ``config`` are separate principals here (the host
    is root, ``drop_uid`` is on and the sandbox interpreter is usable by an unprivileged uid)."""
    return bool(config.drop_uid and os.geteuid() == 0 and others_can_use(interpreter_info(resolve_python(config.python))))


def _new_key() -> int:
    """A fresh principal key (its uid when uids are per principal): random, and no live principal
    of this process has it. (Hosts in other processes draw from 3e9 values too.)"""
    with _KEYS_LOCK:
        while True:
            key = UID_BASE + secrets.randbelow(UID_SPAN)
            if key not in _KEYS:
                _KEYS.add(key)
                return key


def _free_key_globally(key: int) -> None:
    with _KEYS_LOCK:
        _KEYS.discard(key)


class Family:
    """The processes of one executor family and the link to its root; shared (reference-counted)
    by its executors. :class:`codetool.executor.host.sandbox.Sandbox` adds the requests for workers.

    Args:
        config (`ExecutorConfig`): limits and isolation mode.
    Raises:
        ExecutorError: when the requested isolation cannot start here.
    """

    def __init__(self, config: ExecutorConfig):
        self.config = config
        self.python = resolve_python(config.python)
        self.info = interpreter_info(self.python)
        self.mode = self._choose_mode()
        self.as_root = os.geteuid() == 0
        self.principals = False  # a uid per principal (the host is root and may drop)
        self.gid: int | None = None
        if config.drop_uid and self.as_root:
            if separate_principals(config):
                self.principals = True
                self.gid = UID_BASE + secrets.randbelow(UID_SPAN)  # the family's group
            else:
                _warn_once("sandbox interpreter %s is not usable by an unprivileged uid; code runs as "
                           "root (no RLIMIT_NPROC). Set executor.python to a system Python.", self.python)
        if not self.principals and (self.as_root or self.mode == "fallback"):
            _warn_once("executor sandbox (%s) runs the code as the host user (uid %d)%s; candidates are "
                       "not separate principals. Use bubblewrap, and run the host as root with "
                       "executor.drop_uid true.", self.mode, os.geteuid(),
                       "" if self.mode == "bwrap" else " without namespaces: it can signal and read what this user can")
        host_reserve = (2 * config.max_step_mb + 4) << 20  # what the host itself may hold for a step
        self.memory_bytes = max(64 << 20, (config.memory_mb << 20) - host_reserve)
        self.isolation = ""
        self._refs = 0
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._link: RootLink | None = None
        self._scratch: str | None = None
        self._cgroup: tuple[str, int] | None = None
        self._ready: dict = {}
        self.root_pid: int | None = None  # the root's pid on the host
        self._keys: set[int] = set()  # this family's live principals
        self._handles: weakref.WeakSet[WorkerHandle] = weakref.WeakSet()
        self._host: adoption.Principals | None = None  # the host manages the principals (cgroup mode)
        self._start()
        _LIVE.add(self)

    # ------------------------------------------------------------------------------ life cycle
    def _choose_mode(self) -> str:
        if self.config.isolation == "fallback":
            return "fallback"
        problem = bwrap_problem(self.python)
        if problem is None:
            return "bwrap"
        if self.config.isolation == "bwrap":
            raise ExecutorError(f"executor isolation 'bwrap' was requested but {problem}. Install "
                                f"bubblewrap or set executor.isolation to 'auto' or 'fallback'.")
        _warn_once("executor: %s; using the fallback sandbox (no namespaces)", problem)
        return "fallback"

    def _limits(self) -> dict:
        cfg = self.config
        cpu = max(1, math.ceil(cfg.cpu_time_s))
        memory = cfg.memory_mb << 20  # (data: never reached before as; set so that lowering it is seen)
        return {"as": memory, "data": memory, "cpu": [cpu, cpu + 1], "fsize": cfg.max_file_mb << 20,
                "nofile": cfg.max_open_files, "nproc": cfg.max_processes, "core": 0}

    @property
    def _scratch_parent(self) -> str:
        """Where the principals' scratch directories are, as the sandbox sees it: ``/tmp`` in
        bubblewrap and in the fallback as root (the root hides the host's behind its own)."""
        if self.mode == "bwrap" or self.as_root:
            return "/tmp"
        assert self._scratch is not None  # made by _start before the root is started
        return self._scratch

    def scratch_of(self, key: int) -> str:
        """The scratch directory of principal ``key``, as its processes see it."""
        return os.path.join(self._scratch_parent, f"c{key}")

    def _settings(self) -> dict:
        machine = platform.machine()
        numbers = syscall_numbers(machine) if filter_program(machine) else {}
        program, plain = filter_program(machine), filter_program(machine, notify=False)
        cgroup = None
        if self._cgroup is not None:
            cgroup = {"path": CGROUP_MOUNT if self.mode == "bwrap" else self._cgroup[0], "version": self._cgroup[1]}
        fallback_root = self.mode == "fallback" and self.as_root
        return {"limits": self._limits(), "principals": self.principals, "gid": self.gid,
                "unshare_net": fallback_root, "unshare_mount": fallback_root,
                "hidepid": self.mode == "bwrap" and self.as_root, "mount_scratch": self.as_root,
                "scratch_parent": self._scratch_parent, "scratch": self._scratch,
                "scratch_bytes": self.config.scratch_mb << 20, "scratch_inodes": self.config.max_files,
                "memory_bytes": self.memory_bytes, "cgroup": cgroup,
                "seccomp": program.hex() if program else "", "seccomp_plain": plain.hex() if plain else "",
                "seccomp_nr": numbers.get("seccomp"), "setresuid_nr": numbers.get("setresuid"),
                "keyctl_nr": numbers.get("keyctl"), "host_listeners": self._host is not None,
                "worker_boot": WORKER_BOOT, "worker_mounts": self.as_root}

    def _start(self) -> None:
        if self.config.cgroup and self.as_root and self._cgroup is None:
            self._cgroup = cgroups.family_cgroup()
        numbers = syscall_numbers(platform.machine()) if filter_program() else {}
        if self.principals and self._cgroup is not None and numbers:
            self._host = adoption.Principals(self._cgroup[0], numbers["setresuid"])
        cwd, extra, prefix = "/", {}, []
        if self.mode == "bwrap":
            prefix = _bwrap_argv(shutil.which("bwrap") or "bwrap", self.info, self.as_root,
                                 self._cgroup[0] if self._cgroup else None, self.config.scratch_mb)
        else:
            if self._scratch is None:  # a restart gets a fresh one (_abort removed the old one)
                self._scratch = scratch.make(self.config.scratch_dir, None)
                if self.principals:
                    os.chmod(self._scratch, 0o711)  # principals reach their own directory only
            cwd, extra = self._scratch, {"HOME": self._scratch, "TMPDIR": self._scratch}
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = prefix + [self.python, "-I", "-B", "-c", BOOTSTRAP, str(child.fileno()),
                            json.dumps(self._settings())]
        errors: IO[bytes] = tempfile.TemporaryFile()
        debug = os.environ.get("CODETOOL_SANDBOX_DEBUG") == "1"  # the root's stderr stays the host's
        if os.environ.get("CODETOOL_SANDBOX_DEBUG_FILE"):
            errors = open(os.environ["CODETOOL_SANDBOX_DEBUG_FILE"], "ab")
        try:
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=None if debug else errors, pass_fds=(child.fileno(),), cwd=cwd,
                                          env=sandbox_environment(extra), start_new_session=True)
        except OSError as exc:
            self._abort()
            raise ExecutorError(f"could not start the sandbox ({self.mode}): {exc}") from None
        finally:
            child.close()
        self._link = link = RootLink(parent)
        stdin = self._proc.stdin
        assert stdin is not None  # Popen(stdin=PIPE)
        try:
            stdin.write(_sandbox_sources())
            stdin.close()
            self._ready = link.conn.wait_frame(START_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError, ProtocolError) as exc:
            self._abort()
            errors.seek(0)
            detail = errors.read().decode("utf-8", "replace").strip()[-500:] or str(exc)
            raise ExecutorError(f"the {self.mode} sandbox did not start: {detail}") from None
        finally:
            errors.close()
        if self._cgroup is not None and not cgroups.move_tree(self._proc.pid, os.path.join(self._cgroup[0], "root")):
            logger.debug("could not move the sandbox root into its cgroup")
        self.root_pid = _host_pid(self._proc.pid, self._ready.get("pid"))
        logger.debug("sandbox started: mode=%s principals=%s python=%s", self.mode, self.principals, self.python)

    def _describe(self, hello: dict) -> str:
        layers = [f"bwrap({NAMESPACES})" if self.mode == "bwrap"
                  else "fallback(net)" if self._ready.get("netns") else "fallback"]
        if hello.get("uid") not in (None, 0, -1) and hello.get("uid") != os.geteuid():
            layers.append("uid")
        if self.principals:
            layers.append("principals")
        if hello.get("limits"):
            layers.append(f"rlimits({','.join(hello['limits'])})")
        if hello.get("seccomp"):
            layers.append("seccomp")
        if hello.get("mounts"):
            layers.append("hidden(proc,ctypes)")
        if self._ready.get("keyring"):
            layers.append("keyring")
        if self._cgroup is not None:
            layers.append(f"memory(cgroup-v{self._cgroup[1]})")
        elif self.principals or self.mode == "bwrap":
            layers.append("memory(poll)")
        else:
            layers.append("no-cgroup")
        return "+".join(layers)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._link is not None and not self._link.eof

    def acquire(self) -> None:
        with self._lock:
            self._refs += 1

    def acquire_open(self, count: int = 1) -> bool:
        """Take ``count`` references if the family is still running (not closed by the release of
        its last executor); whether it did (:class:`codetool.executor.host.pool.FamilyPool`)."""
        with self._lock:
            if self._proc is None:
                return False
            self._refs += count
            return True

    @property
    def executors(self) -> int:
        """Executors (and reservations) holding the family."""
        return self._refs

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs <= 0:
                self.close()

    def close(self) -> None:
        """Kill every process of the family and remove its scratch directory."""
        with self._lock:
            if self._proc is None:
                return
            clean = False
            try:
                if self._link is not None:
                    self._link.send({"op": "exit"})
                clean = self._proc.wait(timeout=3.0) == 0
            except (EOFError, OSError, subprocess.TimeoutExpired):
                pass
            self._abort(clean)
            _LIVE.discard(self)

    def _abort(self, clean: bool = False) -> None:
        """Kill the family without its root's help (unless ``clean``: the root already did it) and
        remove its scratch directory and cgroup; the next start makes fresh ones."""
        proc, self._proc = self._proc, None
        if self._link is not None:
            self._link.close()
        if self._host is not None:
            self._host.close()
            self._host = None
        if proc is not None and not clean:
            self._kill_family(proc)
        scratch.remove(self._scratch)
        self._scratch = None
        if self._cgroup is not None:
            for _ in range(50):  # the kernel frees a cgroup a moment after its last process
                if cgroups.remove(self._cgroup[0]):
                    break
                time.sleep(0.01)
            self._cgroup = None

    def _kill_family(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                logger.warning("sandbox process %d did not exit after SIGKILL", proc.pid)
        if self.mode == "fallback" and self.principals:
            _kill_uids(set(self._keys))  # workers outlive a dead root in this mode
        elif self.mode == "fallback":  # one uid for all: through the pidfds of the workers handed out
            for handle in list(self._handles):
                if handle.pidfd is not None:
                    try:
                        signal.pidfd_send_signal(handle.pidfd, signal.SIGKILL)
                    except OSError:
                        pass

    def _new_key(self) -> int:
        key = _new_key()
        self._keys.add(key)
        return key

    def _free_key(self, key: int) -> None:
        self._keys.discard(key)
        _free_key_globally(key)

    # ---------------------------------------------------------------------------- requests
    def _current_link(self) -> RootLink:
        with self._lock:
            if not self.alive:
                self._abort()
                self._start()
            assert self._link is not None  # alive, or just started
            return self._link

    def _call(self, frame: dict, fds: list[int] | None = None, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        """A request the root answers; the family restarts first when its root is gone."""
        link = self._current_link()
        try:
            return link.wait(link.send(frame, fds, reply=True), timeout)
        except (EOFError, TimeoutError, OSError) as exc:
            logger.warning("sandbox root stopped answering (%s); restarting the family", exc)
            with self._lock:
                if self._link is link:
                    self._abort()
            raise ExecutorError(f"the sandbox root process failed: {exc}") from None

    def _tell(self, frame: dict) -> None:
        """A request without an answer (a dead family is left for the next request to restart)."""
        with self._lock:
            link = self._link if self.alive else None
        if link is None:
            return
        try:
            link.send(frame)
        except EOFError as exc:
            logger.warning("sandbox root stopped answering (%s)", exc)
            with self._lock:
                if self._link is link:
                    self._abort()

    def _track(self, handle: WorkerHandle) -> WorkerHandle:
        if self.mode == "fallback" and not self.principals:
            try:
                handle.pidfd = os.pidfd_open(handle.pid)
            except OSError:
                handle.pidfd = None
            self._handles.add(handle)
        return handle


def _host_pid(top: int, inner: int | None) -> int:
    """The host pid of the process that is ``inner`` in the sandbox's pid namespace, among ``top``
    (bubblewrap, or the root itself) and its descendants; ``top`` when none is found."""
    frontier = [top]
    for _ in range(64):
        if not frontier:
            break
        pid = frontier.pop()
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if inner is not None and nspid and nspid[-1] == str(inner):
            return pid
        frontier.extend(schedstat.children([pid]))
    return top


def _kill_uids(uids: set[int]) -> None:
    """SIGKILL every process whose real uid is one of ``uids`` (principals of this host)."""
    if not uids:
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                line = next((x for x in f if x.startswith("Uid:")), "")
            parts = line.split()
            if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in uids:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, IndexError, StopIteration):
            continue


@atexit.register
def _close_all() -> None:
    for sandbox in list(_LIVE):
        try:
            sandbox.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            logger.debug("could not close a sandbox at exit", exc_info=True)
