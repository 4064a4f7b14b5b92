"""Sandbox side of :mod:`codetool.executor`, the **root** role. Standard library only.

Runs inside the sandbox next to ``sandbox_worker`` (see that module). The root is the first
process of an executor family and never runs model code: it spawns fresh workers (rlimits set and
the uid dropped before any model code runs), kills a worker's whole process tree on request (with
SIGCHLD blocked, so that no pid of the tree can be freed and recycled meanwhile), reaps every
orphan (it is a child subreaper), and when the host goes away kills everything that is left.
"""

import ctypes
import json
import os
import resource
import shutil
import signal
import sys
import time

try:
    from sandbox_worker import Channel, Worker, _close
except ImportError:  # imported on the host (documentation tools): the package's copy
    from codetool.executor.sandbox_worker import Channel, Worker, _close

PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_SET_SECCOMP = 36, 38, 4, 22
SECCOMP_MODE_FILTER, KEYCTL_JOIN_SESSION_KEYRING = 2, 1
CLONE_NEWNET = 0x40000000
# Imported once here, so that every worker (a fork of the root) has them already.
PREIMPORTS = ("json", "math", "re", "datetime", "time", "collections", "itertools", "functools",
              "random", "string", "statistics", "textwrap", "urllib.parse", "decimal", "fractions",
              "copy", "typing", "dataclasses", "heapq", "bisect", "operator", "pprint", "subprocess")
LIMITS = (("as", "RLIMIT_AS"), ("cpu", "RLIMIT_CPU"), ("fsize", "RLIMIT_FSIZE"),
          ("nofile", "RLIMIT_NOFILE"), ("nproc", "RLIMIT_NPROC"), ("core", "RLIMIT_CORE"))


def _prctl(option, value):
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program):
    """Install a seccomp filter (``struct sock_filter[]`` bytes, built by the host's
    ``codetool.executor.seccomp``) on this process and everything it will start."""
    if not program or len(program) % 8:
        return False
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
    except (OSError, AttributeError):
        return False


def new_session_keyring(keyctl_nr):
    """Join a fresh anonymous session keyring, so no key of the host's session is in reach."""
    if keyctl_nr is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                            ctypes.c_void_p(None)) >= 0
    except (OSError, AttributeError):
        return False


class Root:
    """The family's first process: spawns workers, kills process trees, reaps every orphan."""

    def __init__(self, config):
        self.config = config
        self.chan = Channel(config["control_fd"])
        self.statuses = {}
        self.workers = set()  # pids of the workers it spawned and has not been asked to kill
        null = os.open(os.devnull, os.O_RDONLY)  # stdin held the sources; the code gets nothing
        os.dup2(null, 0)
        os.close(null)

    def start(self):
        subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        netns = False
        if self.config.get("unshare_net"):
            try:
                netns = ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0
            except (OSError, AttributeError):
                netns = False
        keyring = new_session_keyring(self.config.get("keyctl_nr"))
        _prctl(PR_SET_DUMPABLE, 0)
        seccomp = install_seccomp(bytes.fromhex(self.config.get("seccomp") or ""))
        signal.signal(signal.SIGCHLD, self._reap)
        for name in PREIMPORTS:
            try:
                __import__(name)
            except ImportError:
                pass
        self.chan.send({"op": "ready", "pid": os.getpid(), "subreaper": subreaper, "netns": netns,
                        "seccomp": seccomp, "keyring": keyring, "python": list(sys.version_info[:3])})

    def _reap(self, signum=None, frame=None):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if len(self.statuses) > 4096:
                self.statuses.clear()
            self.statuses[pid] = status

    def _wait_reaped(self, pid, timeout):
        end = time.monotonic() + timeout
        while pid not in self.statuses and time.monotonic() < end:
            self._reap()
            time.sleep(0.0005)
        return self.statuses.pop(pid, None)

    def serve(self):
        while True:
            eof = False
            try:
                msg = self.chan.recv()
            except (EOFError, OSError, ValueError):  # the host is gone: clean up after it
                msg, eof = {"op": "exit"}, True
            op = msg.get("op")
            if op == "spawn":
                self.spawn(msg)
            elif op == "kill":
                status = self.kill(int(msg["pid"]), bool(msg.get("keep_root")),
                                   [int(p) for p in msg.get("spare", ())])
                if msg.get("reply", True):
                    self.chan.send({"op": "killed", "pid": msg["pid"], "status": status})
            elif op == "sweep":  # before a retried fork: free the slots of detached processes
                self.kill(-1, keep_root=True, spare=[int(p) for p in msg.get("spare", ())])
                end = time.monotonic() + 0.5
                while any(_state(c) == "Z" for c in _children(os.getpid())) and time.monotonic() < end:
                    self._reap()
                    time.sleep(0.002)
                self.chan.send({"op": "swept"})
            elif op == "exit":
                self.exit(remove_scratch=eof)

    def exit(self, remove_scratch=True):
        """Kill every process of the family and end the root. The host removes the scratch directory
        after a clean close; when the host is gone (``remove_scratch``) the root does."""
        try:
            self.kill(os.getpid(), keep_root=True, everything=True)
            self._wait_all(2.0)
        finally:
            if remove_scratch and os.path.basename(self.config.get("scratch") or "").startswith("codetool-sandbox-"):
                shutil.rmtree(self.config["scratch"], ignore_errors=True)
            os._exit(0)

    def spawn(self, msg):
        fds, self.chan.fds = self.chan.fds[:2], self.chan.fds[2:]
        try:
            pid = os.fork() if len(fds) == 2 else -1
        except OSError:
            pid = -1
        if pid < 0:  # the host sees the worker's channel close and reports it
            for fd in fds:
                _close(fd)
            return self.chan.send({"op": "spawn_failed"})
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.chan.close()
            try:
                self._become_worker(fds, msg)
            except BaseException as exc:  # noqa: B036 - report any set-up failure, then die
                try:
                    os.write(2, (f"sandbox worker set-up failed: {exc!r}\n").encode())
                finally:
                    os._exit(70)
            os._exit(0)
        for fd in fds:
            _close(fd)
        self.workers.add(pid)
        self.chan.send({"op": "spawned", "pid": pid})

    def _become_worker(self, fds, msg):
        os.setsid()
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        _close(fds[1])
        config = dict(self.config, tools=list(msg["tools"]), max_output_chars=int(msg["max_output_chars"]))
        applied = []
        uid = config.get("uid")
        for name, attr in LIMITS:
            value = config["limits"].get(name)
            if value is None or (name == "nproc" and uid is None):
                continue
            soft, hard = value if isinstance(value, list) else (value, value)
            try:
                resource.setrlimit(getattr(resource, attr), (int(soft), int(hard)))
                applied.append(name)
            except (ValueError, OSError, AttributeError):
                pass
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise RuntimeError(f"could not drop to uid {uid}")
        _prctl(PR_SET_DUMPABLE, 0)  # no /proc/<pid>/fd, mem or environ access by a sibling
        worker = Worker(Channel(fds[0]), config)
        sys.argv = ["<sandbox>"]
        worker.chan.send({"op": "hello", "pid": os.getpid(), "uid": os.getuid(), "limits": applied})
        worker.serve()

    def kill(self, pid, keep_root=False, spare=(), everything=False):
        """Stop then kill ``pid`` and all its descendants except the live workers in ``spare`` (the
        copies forked from it); returns how ``pid`` ended when the root is its parent. Only the
        root's own exit (``everything``) kills the root's whole tree.

        SIGCHLD is blocked meanwhile, so no process of the tree can be reaped (its pid freed and
        reused) between being found and being killed. The pid comes from a frame a worker sent, so
        only a descendant of the root is touched: never the root itself or a host process.

        Every kill also sweeps the processes that left their worker's tree (a double fork makes
        them the root's children): whatever is the root's child but neither a worker it spawned
        nor a live worker in ``spare`` is killed with its tree, so a detached process cannot
        outlive the next close or timeout of its family, nor hold its process slots."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            ours = pid > 0 and (pid in self.statuses or _ppid(pid) == os.getpid())
            me = os.getpid()
            if pid <= 0:  # a sweep only
                pass
            elif _descends_from(pid, me) or (pid == me and everything):
                _kill_tree(pid, keep_root, set(spare), me)
            elif ours and not keep_root:  # it died already: kill what it left in its process group
                _kill_group(pid, set(spare), me)
            if not keep_root:
                self.workers.discard(pid)
            keep = self.workers | set(spare) | ({pid} if keep_root else set())
            for orphan in _children(me):
                if orphan not in keep:
                    _kill_tree(orphan, False, set(spare), me)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        if keep_root or not ours:
            return None
        status = self._wait_reaped(pid, 2.0)
        if status is None:
            return None
        if os.WIFSIGNALED(status):
            return {"signal": os.WTERMSIG(status)}
        return {"exit": os.WEXITSTATUS(status)}

    def _wait_all(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.001)
            except ChildProcessError:
                return


def _stat(pid):
    """The fields of /proc/<pid>/stat after the command name, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state(pid):
    fields = _stat(pid)
    return fields[0] if fields else None


def _ppid(pid):
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def _descends_from(pid, ancestor):
    for _ in range(256):
        pid = _ppid(pid)
        if pid == ancestor:
            return True
        if pid in (None, 0, 1):
            return False
    return False


def _pgid(pid):
    fields = _stat(pid)
    return int(fields[2]) if fields else None


def _children(pid):
    found = []
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


def _kill_group(pgid, spare, root):
    """SIGKILL the process group ``pgid`` (processes that left the tree), except ``spare`` ones (a
    copy forked a moment ago may not have left its parent's group yet) and anything that does not
    descend from ``root`` (a group id can be recycled once its processes are gone)."""
    if _descends_from(pgid, root) and not any(_pgid(pid) == pgid for pid in spare):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in spare and _pgid(int(entry)) == pgid \
                and _descends_from(int(entry), root):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def _kill_tree(root, keep_root, spare, ancestor):
    """SIGSTOP the tree top-down (a stopped process cannot fork), then SIGKILL all of it."""
    seen, order, frontier = set(), [], [root]
    while frontier:
        pid = frontier.pop()
        if pid in seen or pid in spare:
            continue
        seen.add(pid)
        if not (keep_root and pid == root):
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                continue
            order.append(pid)
        frontier.extend(_children(pid))
    if not keep_root:  # while its leader is stopped, so the group id cannot have been recycled
        _kill_group(root, spare, ancestor)
    for pid in order:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    end = time.monotonic() + 1.0  # wait until they are dead (zombies), so they can be reaped now
    for pid in order:
        while _state(pid) not in ("Z", "X", None) and time.monotonic() < end:
            time.sleep(0.0005)


def main():
    config = json.loads(sys.argv[2])
    config["control_fd"] = int(sys.argv[1])
    root = Root(config)
    try:
        root.start()
        root.serve()
    except BaseException:  # noqa: B036 - e.g. the host died while the root started (EPIPE on ready)
        root.exit()
