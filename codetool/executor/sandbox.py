"""Start, feed and stop the sandbox processes of one executor *family* (a root executor and every
executor forked from it, directly or not).

A family is one root process (``sandbox_root.py``) started either inside bubblewrap
(``bwrap`` mode: new network, pid, ipc and uts namespaces, a read-only root built from ``/usr``
and a few ``/etc`` files, a size-capped tmpfs at ``/tmp`` as working directory, ``/proc`` of the
new pid namespace, a minimal ``/dev``) or directly (``fallback`` mode: a private scratch directory,
plus a network namespace when the host is root and the kernel allows it). In both modes the
environment is :func:`codetool.secrets.sandbox_environment`, stdin is ``/dev/null``, and when the
host is root every worker runs as a fresh unprivileged uid, picked at random per family, with
``no_new_privs`` set and rlimits applied before the drop.

The root never runs model code; it spawns fresh workers, kills process trees, reaps orphans, and
on close kills everything left. In bubblewrap it keeps only CAP_SETUID, CAP_SETGID and CAP_KILL.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from codetool import CodetoolError
from codetool.executor import scratch
from codetool.executor.channel import Conn, ProtocolError, log_safe, read_available
from codetool.executor.config import ExecutorConfig
from codetool.executor.seccomp import filter_program, syscall_numbers
from codetool.secrets import sandbox_environment

logger = logging.getLogger(__name__)

# The sandbox interpreter reads its two modules (JSON [[name, source], ...]) from stdin, installs
# them under their names, and runs the root. Nothing of the host's file system is needed inside.
BOOTSTRAP = ("import json,sys,types\n"
             "for name,source in json.loads(sys.stdin.buffer.read()):\n"
             "    m=sys.modules[name]=types.ModuleType(name)\n"
             "    exec(compile(source,'<'+name+'>','exec'),m.__dict__)\n"
             "m.main()")
SANDBOX_MODULES = ("sandbox_worker", "sandbox_root")  # in import order; the last one has main()
NAMESPACES = "net,pid,ipc,uts,mount"
SYSTEM_PYTHON = "/usr/bin/python3"
START_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0
_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()


class ExecutorError(CodetoolError):
    """The sandbox cannot be started or used; the message says why and what to change."""


_WARNED: set[str] = set()


def _warn_once(message: str, *args) -> None:
    text = message % args
    if text not in _WARNED:
        _WARNED.add(text)
        logger.warning(text)


@functools.lru_cache(maxsize=8)
def interpreter_info(python: str) -> dict:
    """Version, executable and prefixes of a Python interpreter (asked once per path)."""
    probe = ("import json,sys,sysconfig;print(json.dumps({'version':list(sys.version_info[:3]),"
             "'executable':sys.executable,'stdlib':sysconfig.get_paths()['stdlib'],"
             "'prefixes':sorted({sys.prefix,sys.base_prefix,sys.exec_prefix,sys.base_exec_prefix})}))")
    try:
        out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=30,
                             env=sandbox_environment(), check=True).stdout
        info = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise ExecutorError(f"executor python {python!r} does not run ({exc}); set executor.python "
                            f"to a Python >= 3.9 interpreter.") from None
    if tuple(info["version"]) < (3, 9):
        raise ExecutorError(f"executor python {python!r} is Python {'.'.join(map(str, info['version']))}; "
                            f"the sandbox needs >= 3.9.")
    return info


def resolve_python(setting: str) -> str:
    """The sandbox interpreter for ``ExecutorConfig.python``."""
    if setting != "auto":
        return setting
    if os.access(SYSTEM_PYTHON, os.X_OK):
        try:
            interpreter_info(SYSTEM_PYTHON)
            return SYSTEM_PYTHON
        except ExecutorError:
            pass
    return sys.executable


def others_can_use(info: dict) -> bool:
    """Whether an unprivileged uid can run this interpreter and read its standard library."""
    def walk(path: str, need: int) -> bool:
        path = os.path.realpath(path)
        parts = Path(path).parents
        try:
            if any(not os.stat(p).st_mode & stat.S_IXOTH for p in parts):
                return False
            return bool(os.stat(path).st_mode & need)
        except OSError:
            return False

    return walk(info["executable"], stat.S_IXOTH) and walk(info["stdlib"], stat.S_IROTH)


def _bwrap_argv(bwrap: str, info: dict, scratch_mb: int, as_root: bool) -> list[str]:
    # No --die-with-parent: it fires when the *thread* that started bwrap exits. The root notices
    # the end of its control channel instead and kills the family when the host goes away.
    argv = [bwrap, "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if as_root:  # the root process keeps only what it needs: drop workers to their uid, kill them
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_KILL"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    major, minor = info["version"][:2]
    argv += ["--perms", "0755", "--dir", "/etc"]  # parents made implicitly would be 0700
    for path in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/python3",
                 f"/etc/python{major}.{minor}"):
        argv += ["--ro-bind-try", path, path]
    extra = set(info["prefixes"]) | {os.path.dirname(os.path.realpath(info["executable"]))}
    for path in sorted(extra):
        if not (path + "/").startswith("/usr/"):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_mb << 20), "--perms", "1777",
             "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp", "--"]
    return argv


def bwrap_problem(python: str = "auto") -> str | None:
    """Why bubblewrap cannot sandbox ``python`` (an ``ExecutorConfig.python`` setting) on this
    machine, or ``None`` when it can. Probed once per interpreter (a tiny sandbox is started)."""
    return _bwrap_problem(resolve_python(python))


@functools.lru_cache(maxsize=8)
def _bwrap_problem(python: str) -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    try:
        info = interpreter_info(python)
    except ExecutorError as exc:
        return str(exc)
    argv = _bwrap_argv(bwrap, info, 1, os.geteuid() == 0) + [python, "-I", "-c", "pass"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=sandbox_environment())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap does not run: {exc}"
    if proc.returncode != 0:
        return f"bubblewrap fails here: {(proc.stderr or '').strip()[-300:] or proc.returncode}"
    return None


@functools.lru_cache(maxsize=1)
def _sandbox_sources() -> bytes:
    here = Path(__file__).parent
    return json.dumps([[name, (here / f"{name}.py").read_text()] for name in SANDBOX_MODULES]).encode()


@dataclass
class WorkerHandle:
    """The host's view of one worker: its channel, the read end of its output pipe, its pid (in the
    sandbox's pid namespace) and the CPU seconds it reported after its last run."""

    conn: Conn
    output_fd: int
    pid: int
    cpu_s: float = 0.0
    info: dict = field(default_factory=dict)
    reap: bool = False  # processes of its last step were killed; it must reap them
    nonces: deque = field(default_factory=lambda: deque(maxlen=8))  # of its recent runs

    def dead(self) -> bool:
        """Whether the worker is gone (checked without blocking; stray frames are discarded)."""
        try:
            self.conn.read()  # non-blocking
        except ProtocolError:
            return True
        self.conn.frames.clear()
        return self.conn.eof

    def close(self) -> None:
        self.conn.close()
        try:
            os.close(self.output_fd)
        except OSError:
            pass


class Sandbox:
    """The processes of one executor family; shared (reference-counted) by its executors.

    Args:
        config (`ExecutorConfig`): limits and isolation mode.
        tool_names (`list[str]`): the tool functions every worker defines.
    Raises:
        ExecutorError: when the requested isolation cannot start here.
    """

    def __init__(self, config: ExecutorConfig, tool_names: list[str]):
        self.config = config
        self.tool_names = list(tool_names)
        self.python = resolve_python(config.python)
        self.info = interpreter_info(self.python)
        self.mode = self._choose_mode()
        as_root = os.geteuid() == 0
        self.uid: int | None = None
        if config.drop_uid and as_root:
            if others_can_use(self.info):
                self.uid = 1_000_000_000 + secrets.randbelow(1_000_000_000)
            else:
                _warn_once("sandbox interpreter %s is not usable by an unprivileged uid; code runs as "
                           "root (no RLIMIT_NPROC). Set executor.python to a system Python.", self.python)
        if self.uid is None and (as_root or self.mode == "fallback"):
            _warn_once("executor sandbox (%s) runs the code as the host user (uid %d)%s. Use bubblewrap, "
                       "and run the host as root with executor.drop_uid true.", self.mode, os.geteuid(),
                       "" if self.mode == "bwrap" else
                       " without namespaces: it can signal and read what this user can")
        self.isolation = ""
        self._refs = 0
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._control: Conn | None = None
        self._scratch: str | None = None
        self._ready: dict = {}
        self._workers: set[int] = set()  # pids of live workers (kills spare them)
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
        return {"as": cfg.memory_mb << 20, "cpu": [cpu, cpu + 1], "fsize": cfg.max_file_mb << 20,
                "nofile": cfg.max_open_files, "nproc": cfg.max_processes, "core": 0}

    def _start(self) -> None:
        as_root = os.geteuid() == 0
        program = filter_program()
        settings = {"uid": self.uid, "limits": self._limits(),
                    "unshare_net": self.mode == "fallback" and as_root,
                    "seccomp": program.hex() if program else "",
                    "keyctl_nr": syscall_numbers(platform.machine())["keyctl"] if program else None}
        cwd, extra, prefix = "/", {}, []
        if self.mode == "bwrap":
            prefix = _bwrap_argv(shutil.which("bwrap") or "bwrap", self.info, self.config.scratch_mb, as_root)
        else:
            if self._scratch is None:  # a restart gets a fresh one (_abort removed the old one)
                self._scratch = scratch.make(self.config.scratch_dir, self.uid)
            cwd, extra = self._scratch, {"HOME": self._scratch, "TMPDIR": self._scratch}
            settings["scratch"] = self._scratch  # the root removes it if the host dies first
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = prefix + [self.python, "-I", "-B", "-c", BOOTSTRAP, str(child.fileno()), json.dumps(settings)]
        errors = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=errors, pass_fds=(child.fileno(),), cwd=cwd,
                                          env=sandbox_environment(extra), start_new_session=True)
        except OSError as exc:
            self._abort()
            raise ExecutorError(f"could not start the sandbox ({self.mode}): {exc}") from None
        finally:
            child.close()
        self._control = Conn(parent)
        try:
            self._proc.stdin.write(_sandbox_sources())
            self._proc.stdin.close()
            self._ready = self._control.wait_frame(START_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError) as exc:
            self._abort()
            errors.seek(0)
            detail = errors.read().decode("utf-8", "replace").strip()[-500:] or str(exc)
            raise ExecutorError(f"the {self.mode} sandbox did not start: {detail}") from None
        finally:
            errors.close()
        logger.debug("sandbox started: mode=%s uid=%s python=%s", self.mode, self.uid, self.python)

    def _describe(self, hello: dict) -> str:
        layers = [f"bwrap({NAMESPACES})" if self.mode == "bwrap"
                  else "fallback(net)" if self._ready.get("netns") else "fallback"]
        if hello.get("uid") not in (None, 0) and hello.get("uid") != os.geteuid():
            layers.append("uid")
        if hello.get("limits"):
            layers.append(f"rlimits({','.join(hello['limits'])})")
        if self._ready.get("seccomp"):
            layers.append("seccomp")
        if self._ready.get("keyring"):
            layers.append("keyring")
        layers.append("no-cgroup")  # see the package docstring: no per-candidate cgroup limits yet
        return "+".join(layers)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._control.eof

    def acquire(self) -> None:
        with self._lock:
            self._refs += 1

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
                self._control.queue({"op": "exit"})
                self._control.flush_blocking(1.0)
                clean = self._proc.wait(timeout=3.0) == 0
            except (EOFError, OSError, TimeoutError, subprocess.TimeoutExpired):
                pass
            self._abort(clean)
            _LIVE.discard(self)

    def _abort(self, clean: bool = False) -> None:
        """Kill the family without its root's help (unless ``clean``: the root already did it) and
        remove its scratch directory; the next start makes a fresh one."""
        proc, self._proc = self._proc, None
        self._workers.clear()
        if self._control is not None:
            self._control.close()
        if proc is not None and not clean:
            self._kill_family(proc)
        scratch.remove(self._scratch)
        self._scratch = None

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
        if self.mode == "fallback" and self.uid is not None:
            _kill_uid(self.uid)  # workers outlive a dead root in this mode; the uid is ours alone

    # ---------------------------------------------------------------------------- requests
    def _request(self, frame: dict, fds: list[int] | None = None) -> dict:
        with self._lock:
            if not self.alive:
                self._abort()
                self._start()
            try:
                if fds:
                    self._control.send_with_fds(frame, fds)
                else:
                    self._control.queue(frame)
                    self._control.flush_blocking(REQUEST_TIMEOUT_S)
                return self._control.wait_frame(REQUEST_TIMEOUT_S)
            except (EOFError, TimeoutError, OSError) as exc:
                logger.warning("sandbox root stopped answering (%s); restarting the family", exc)
                self._abort()
                raise ExecutorError(f"the sandbox root process failed: {exc}") from None

    def spawn(self) -> WorkerHandle:
        """A fresh worker with an empty state."""
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        read_fd, write_fd = os.pipe()
        try:
            self._request({"op": "spawn", "tools": self.tool_names,
                           "max_output_chars": self.config.max_output_chars},
                          [worker_end.fileno(), write_fd])
        except ExecutorError:
            host_end.close()
            os.close(read_fd)
            raise
        finally:
            worker_end.close()
            os.close(write_fd)
        handle = self._handshake(host_end, read_fd)
        if not self.isolation:
            self.isolation = self._describe(handle.info)
        return handle

    def fork_worker(self, parent: WorkerHandle, timeout: float = REQUEST_TIMEOUT_S) -> WorkerHandle:
        """A new worker holding a copy of ``parent``'s state (``os.fork`` inside the sandbox).

        Returns as soon as the parent has forked; the copy finishes setting itself up while the
        host goes on (its first frame is the reply to the first request sent to it)."""
        host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        read_fd, write_fd = os.pipe()
        try:
            parent.conn.send_with_fds({"op": "fork"}, [worker_end.fileno(), write_fd])
            reply = parent.conn.wait_frame(timeout)
        except (EOFError, TimeoutError, OSError) as exc:
            host_end.close()
            os.close(read_fd)
            raise ExecutorError(f"could not fork the executor: the worker did not answer ({exc})") from None
        finally:
            worker_end.close()
            os.close(write_fd)
        if reply.get("op") != "forked" or not isinstance(reply.get("pid"), int):
            host_end.close()
            os.close(read_fd)
            raise ExecutorError(f"could not fork the executor: {log_safe(reply.get('error', reply.get('op')))}")
        os.set_blocking(read_fd, False)
        with self._lock:
            self._workers.add(reply["pid"])
        return WorkerHandle(conn=Conn(host_end), output_fd=read_fd, pid=reply["pid"])

    def _handshake(self, host_end: socket.socket, read_fd: int) -> WorkerHandle:
        os.set_blocking(read_fd, False)
        conn = Conn(host_end)
        try:
            hello = conn.wait_frame(REQUEST_TIMEOUT_S)
            if hello.get("op") != "hello" or not isinstance(hello.get("pid"), int):
                raise EOFError(f"unexpected first frame {hello.get('op')!r}")
        except (EOFError, TimeoutError, ValueError) as exc:
            detail = (read_available(read_fd) or b"").decode("utf-8", "replace").strip()[-500:]
            conn.close()
            os.close(read_fd)
            raise ExecutorError(f"a sandbox worker did not start: {log_safe(detail or exc, 500)}") from None
        with self._lock:
            self._workers.add(hello["pid"])
        return WorkerHandle(conn=conn, output_fd=read_fd, pid=hello["pid"], info=hello)

    def sweep(self) -> None:
        """Kill the processes that left their workers' trees and wait until they are reaped."""
        with self._lock:
            frame = {"op": "sweep", "spare": sorted(self._workers)}
        try:
            self._request(frame)
        except ExecutorError:
            pass

    def kill(self, pid: int, keep_root: bool = False, wait: bool = True) -> dict | None:
        """Kill worker ``pid`` (in the sandbox's pid namespace) with its whole process tree, or only
        its descendants when ``keep_root``; the workers forked from it (live executors) are spared.

        Args:
            wait (`bool`, *optional*, defaults to `True`): wait until it is done and return how the
                worker ended (``{"signal": n}`` / ``{"exit": n}``, when the root is its parent);
                otherwise the root does it in the background (the host does not need the answer).
        """
        with self._lock:
            if not keep_root:
                self._workers.discard(pid)
            frame = {"op": "kill", "pid": pid, "keep_root": keep_root, "reply": wait,
                     "spare": sorted(self._workers - {pid})}
        if not wait:
            with self._lock:
                if self.alive:
                    try:
                        self._control.queue(frame)
                        self._control.flush_blocking(REQUEST_TIMEOUT_S)
                    except (EOFError, TimeoutError, OSError) as exc:
                        logger.warning("sandbox root stopped answering (%s)", exc)
                        self._abort()
            return None
        try:
            reply = self._request(frame)
        except ExecutorError:
            return None
        status = reply.get("status")
        return status if isinstance(status, dict) else None


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (a family uid, unique to this sandbox)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                line = next((x for x in f if x.startswith("Uid:")), "")
            if line.split()[1:2] == [str(uid)]:
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
