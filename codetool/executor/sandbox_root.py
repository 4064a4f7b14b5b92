"""Sandbox side of :mod:`codetool.executor`, the **root** role. Standard library only.

Runs inside the sandbox next to ``sandbox_worker``. The root is the first process of an executor
family and never runs model code. It serves the host's requests, in order, on its control channel:

- ``spawn``: a fresh worker (a new principal: its uid, scratch and cgroup prepared first; rlimits,
  uid, capabilities and the seccomp filter set before any model code runs);
- ``expect``: prepare the principal of a fork copy (its scratch a copy of its parent's) and let
  the copy's one ``setresuid`` through when it comes (``sandbox_principals``);
- ``begin``/``end``: a step of a principal starts (its worker is resumed, and memory polled) or
  ended (its worker is stopped, then every other process of the principal is killed);
- ``release``: kill all of a principal and remove its scratch and cgroup;
- ``exit``, or the end of the control channel (the host died): kill everything and leave.

It also reaps every orphan (it is a child subreaper). Replies carry the request's ``id``.
"""

import json
import os
import resource
import select
import signal
import socket
import sys
import time

try:
    import sandbox_kernel as kernel
    from sandbox_io import Channel, close_fd
    from sandbox_principals import Principals
    from sandbox_worker import Worker
except ImportError:  # imported on the host (documentation tools): the package's copies
    from codetool.executor import sandbox_kernel as kernel
    from codetool.executor.sandbox_io import Channel, close_fd
    from codetool.executor.sandbox_principals import Principals
    from codetool.executor.sandbox_worker import Worker

# Imported once here, so that every worker (a fork of the root) has them already.
PREIMPORTS = ("json", "math", "re", "datetime", "time", "collections", "itertools", "functools",
              "random", "string", "statistics", "textwrap", "urllib.parse", "decimal", "fractions",
              "copy", "typing", "dataclasses", "heapq", "bisect", "operator", "pprint", "subprocess", "tempfile")
LIMITS = (("as", "RLIMIT_AS"), ("cpu", "RLIMIT_CPU"), ("fsize", "RLIMIT_FSIZE"),
          ("nofile", "RLIMIT_NOFILE"), ("nproc", "RLIMIT_NPROC"), ("core", "RLIMIT_CORE"))
SANDBOX_MODULES = ("sandbox_kernel", "sandbox_copy", "sandbox_io", "sandbox_worker", "sandbox_scratch",
                   "sandbox_principals", "sandbox_root")
MS_REC, MS_PRIVATE, MS_NOEXEC = 16384, 1 << 18, 8


class Root:
    """The family's first process (see the module docstring)."""

    def __init__(self, config):
        self.config = config
        self.chan = Channel(config["control_fd"])
        self.statuses = {}
        self.principals = Principals(config)
        self.pid = os.getpid()
        null = os.open(os.devnull, os.O_RDONLY)  # stdin held the sources; the code gets nothing
        os.dup2(null, 0)
        os.close(null)

    def start(self):
        family_dir = self.config.get("scratch") or ""
        self.family_parent = None  # (descriptor of its parent, its name): reachable once /tmp is hidden
        if os.path.basename(family_dir).startswith("codetool-sandbox-"):
            try:
                parent_fd = os.open(os.path.dirname(family_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                self.family_parent = (parent_fd, os.path.basename(family_dir))
            except OSError:
                pass
        subreaper = kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
        kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
        netns = bool(self.config.get("unshare_net")) and kernel.unshare(kernel.CLONE_NEWNET)
        if self.config.get("unshare_mount") and kernel.unshare(kernel.CLONE_NEWNS):
            # the fallback's mounts stay in this family's namespace: its own /proc (each principal
            # sees its own processes), and the host's world-writable folders hidden behind empty
            # ones that only the root may write (the scratch mounts go to the new /tmp)
            kernel.mount("none", "/", "", MS_REC | MS_PRIVATE, "")
            kernel.mount("proc", "/proc", "proc", kernel.MS_NOSUID | kernel.MS_NODEV | MS_NOEXEC, "hidepid=2,gid=0")
            for path, mode in (("/tmp", "0711"), ("/var/tmp", "0755"), ("/dev/shm", "0755"), ("/run/lock", "0755"),
                               ("/var/lock", "0755")):
                if os.path.isdir(path) and not os.path.islink(path):
                    kernel.mount("tmpfs", path, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, f"size=1m,mode={mode}")
        elif self.config.get("hidepid"):  # a principal sees no other principal's processes
            kernel.mount("proc", "/proc", "proc",
                         kernel.MS_REMOUNT | kernel.MS_NOSUID | kernel.MS_NODEV | MS_NOEXEC, "hidepid=2,gid=0")
        keyring = kernel.new_session_keyring(self.config.get("keyctl_nr"))
        kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
        signal.signal(signal.SIGCHLD, self._reap)
        for name in PREIMPORTS:
            try:
                __import__(name)
            except ImportError:
                pass
        self.chan.send({"op": "ready", "pid": self.pid, "subreaper": subreaper, "netns": netns,
                        "keyring": keyring, "python": list(sys.version_info[:3])})

    # ------------------------------------------------------------------------------- the loop
    def serve(self):
        control = self.chan.sock.fileno()
        poller = select.poll()
        poller.register(control, select.POLLIN)
        watched = set()
        while True:
            msg = self.chan.buffered()
            if msg is not None:
                self.handle(msg)
                continue
            self.adopt()
            for fd in self.principals.listeners:
                if fd not in watched:
                    poller.register(fd, select.POLLIN)
                    watched.add(fd)
            timeout = self.principals.poll_due()
            deadlines = [e.deadline for e in self.principals.expected.values()]
            deadlines += [deadline for _, _, deadline in self.principals.pending]
            if deadlines:
                soonest = max(0.0, min(deadlines) - time.monotonic())
                timeout = soonest if timeout is None else min(timeout, soonest)
            if self.principals.pending:
                timeout = 0.002 if timeout is None else min(timeout, 0.002)
            events = poller.poll(None if timeout is None else timeout * 1000 + 1)
            if any(fd == control for fd, _ in events):
                try:
                    self.chan.fill()
                except (EOFError, OSError):  # the host is gone: clean up after it
                    self.exit(remove_scratch=True)
                continue  # the host's requests first: an expectation precedes its copy's call
            for fd, ev in events:
                if ev & select.POLLIN:
                    self.principals.receive(fd)
                elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    poller.unregister(fd)
                    watched.discard(fd)
                    self.principals.drop_listener(fd)
            self.adopt()
            self.housekeeping()

    def adopt(self):
        """Answer the pending ``setresuid`` calls; tell the host of each copy adopted."""
        if self.principals.pending:
            for expectation, pid in self.principals.decide():
                self.principals.settle(expectation)
                self.chan.send({"op": "adopted", "id": expectation.request, "pid": pid})

    def housekeeping(self):
        for expectation in self.principals.expired():
            self.principals.settle(expectation)
            self.chan.send({"op": "adopt_failed", "id": expectation.request,
                            "error": "the fork copy did not become its own principal in time"})
        due = self.principals.poll_due()
        if due is not None and due <= 0:
            self.principals.poll_memory(self.pid)
        self.principals.tidy()

    def handle(self, msg):
        op, key = msg.get("op"), msg.get("key")
        principal = self.principals.by_key.get(key)
        if op == "spawn":
            self.spawn(msg)
        elif op == "expect":
            self.expect(msg)
        elif op == "adopt" and principal is not None and not self.principals.uids and principal.pid is None:
            principal.pid = int(msg["pid"])  # (one uid for all: the zygote's word is all there is)
        elif op == "begin" and principal is not None:
            principal.active = True
            principal.reason = None
            self.principals.next_poll = 0.0
            self.principals.resume(principal)
        elif op == "end":
            reply = {"op": "ended", "id": msg.get("id"), "reason": None, "oom": 0}
            if principal is not None:
                self.principals.stop(principal)
                self.principals.kill(principal, spare=principal.pid)
                principal.active = False
                seen = self.principals.oom_kills(principal)
                reply.update(reason=principal.reason, oom=seen - principal.oom_seen)
                principal.oom_seen = seen
            if msg.get("reply"):
                self.chan.send(reply)
        elif op == "release":
            released = self.principals.release(key)
            status = None
            if released is not None and released.spawned and msg.get("reply"):
                status = self._status_of(released.pid)
            if msg.get("reply"):
                self.chan.send({"op": "released", "id": msg.get("id"), "status": status,
                                "reason": released.reason if released is not None else None,
                                "oom": (self.principals.oom_kills(released) - released.oom_seen)
                                if released is not None else 0})
        elif op == "exit":
            self.exit(remove_scratch=False)

    def _status_of(self, pid):
        """How ``pid`` ended, when the root is its parent (a spawned worker); else ``None``."""
        status = self._wait_reaped(pid, 2.0)
        if status is None:
            return None
        if os.WIFSIGNALED(status):
            return {"signal": os.WTERMSIG(status)}
        return {"exit": os.WEXITSTATUS(status)}

    # --------------------------------------------------------------------------- principals
    def expect(self, msg):
        key, parent_key, request = int(msg["key"]), msg.get("parent"), msg.get("id")
        parent = self.principals.by_key.get(parent_key)
        try:
            if parent is None:
                raise OSError("the state to fork is gone")
            self.principals.prepare(key, parent_key)
        except OSError as exc:
            self.chan.send({"op": "adopt_failed", "id": request, "error": str(exc)[:200]})
            return
        if self.config.get("host_listeners"):  # the host lets the copy's setresuid through
            self.chan.send({"op": "prepared", "id": request})
            return
        resumed = self.principals.resume(parent)
        if self.principals.uids:
            self.principals.expect(key, parent_key, request, resumed)
        else:
            self.chan.send({"op": "prepared", "id": request})

    def spawn(self, msg):
        fds, self.chan.fds = self.chan.fds[:2], self.chan.fds[2:]
        request, key = msg.get("id"), int(msg["key"])
        if len(fds) != 2:
            for fd in fds:
                close_fd(fd)
            return self.chan.send({"op": "spawn_failed", "id": request, "error": "no channel was passed"})
        try:
            principal = self.principals.prepare(key)
        except OSError as exc:
            for fd in fds:
                close_fd(fd)
            return self.chan.send({"op": "spawn_failed", "id": request, "error": str(exc)[:200]})
        mine, theirs = socket.socketpair()
        try:
            pid = os.fork()
        except OSError as exc:
            pid, error = -1, str(exc)
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.chan.sock.detach()  # closed below with every descriptor of the root
            mine.detach()
            self.principals.listeners = []
            try:
                self._become_worker(fds, msg, principal, theirs)
            except BaseException as exc:  # noqa: B036 - report any set-up failure, then die
                try:
                    os.write(2, (f"sandbox worker set-up failed: {exc!r}\n").encode())
                finally:
                    os._exit(70)
            os._exit(0)
        theirs.close()
        for fd in fds:
            close_fd(fd)
        if pid < 0:
            mine.close()
            self.principals.release(key)
            return self.chan.send({"op": "spawn_failed", "id": request, "error": error[:200]})
        principal.pid, principal.spawned = pid, True
        listener = _receive_listener(mine, 5.0)
        mine.close()
        if listener is not None and self.config.get("host_listeners"):  # the host decides
            socket.send_fds(self.chan.sock, [_frame({"op": "spawned", "id": request, "pid": pid, "listener": True})],
                            [listener])
            close_fd(listener)
            return
        if listener is not None:
            self.principals.add_listener(listener)
        self.chan.send({"op": "spawned", "id": request, "pid": pid})

    def _become_worker(self, fds, msg, principal, handoff):
        os.setsid()
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        close_fd(fds[1])
        _close_all_but({0, 1, 2, fds[0], handoff.fileno()})
        # a way into the scratch directories that needs no search permission on their ancestors
        parent_fd = os.open(self.principals.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        config = dict(self.config, tools=list(msg["tools"]), max_output_chars=int(msg["max_output_chars"]),
                      scratch=principal.scratch, uid=principal.uid, scratch_parent_fd=parent_fd)
        self.principals.attach(principal, os.getpid())  # before any allocation of its own
        uid, applied = principal.uid, []
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
            gid = config["gid"] if config.get("gid") is not None else uid
            kernel.prctl(kernel.PR_SET_KEEPCAPS, 1)  # CAP_SETUID survives the drop, for the copies
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if not kernel.capset([kernel.CAP_SETUID] if config.get("principals") else []):
                raise RuntimeError("could not set the worker's capabilities")
            kernel.prctl(kernel.PR_SET_KEEPCAPS, 0)
            if os.getresuid() != (uid, uid, uid):
                raise RuntimeError(f"could not drop to uid {uid}")
        os.chdir(parent_fd)  # entered as the principal's own uid
        os.chdir(os.path.basename(principal.scratch))
        os.environ["HOME"] = os.environ["TMPDIR"] = principal.scratch
        kernel.prctl(kernel.PR_SET_DUMPABLE, 0)  # no /proc/<pid>/fd, mem or environ access
        listener, seccomp = None, False
        if config.get("seccomp"):
            if config.get("principals"):
                listener = kernel.install_seccomp(bytes.fromhex(config["seccomp"]), config.get("seccomp_nr"))
                seccomp = listener is not None
            if not seccomp:  # no listener here: every identity change is simply denied
                seccomp = kernel.install_seccomp(bytes.fromhex(config["seccomp_plain"]))
        if listener is not None:
            socket.send_fds(handoff, [b"L"], [listener])
            close_fd(listener)
        else:
            handoff.send(b"N")
        handoff.close()
        worker = Worker(Channel(fds[0]), config)
        sys.argv = ["<sandbox>"]
        for name in SANDBOX_MODULES:  # not importable by the code (its objects stay reachable)
            sys.modules.pop(name, None)
        worker.chan.send({"op": "hello", "pid": os.getpid(), "uid": os.getuid(), "limits": applied,
                          "seccomp": bool(seccomp), "principal": listener is not None})
        worker.serve()

    # ---------------------------------------------------------------------------- reaping
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
            if pid not in self.statuses:
                time.sleep(0.0005)
        return self.statuses.pop(pid, None)

    def exit(self, remove_scratch=True):
        """Kill every process of the family and end the root. The host removes the fallback's
        scratch directory after a clean close; when the host is gone (``remove_scratch``) the root
        does."""
        try:
            self.principals.release_all()
            for _ in range(100):
                alive = [pid for pid, _, _, state, _ in self.principals.family(self.pid) if state not in ("Z", "X")]
                if not alive:
                    break
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.001)
            self._wait_all(2.0)
            self.principals.tidy()
        finally:
            family = getattr(self, "family_parent", None)
            if remove_scratch and family is not None:
                import shutil

                if sys.version_info >= (3, 11):
                    shutil.rmtree(family[1], dir_fd=family[0], ignore_errors=True)
                else:  # no dir_fd before 3.11 (a TypeError there): the folder through its parent's descriptor
                    shutil.rmtree(f"/proc/self/fd/{family[0]}/{family[1]}", ignore_errors=True)
            os._exit(0)

    def _wait_all(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.001)
            except ChildProcessError:
                return


def _frame(obj):
    data = json.dumps(obj).encode("ascii")
    return len(data).to_bytes(4, "big") + data


def _receive_listener(sock, timeout):
    """The listener descriptor a new worker hands over (``None`` if it has none or died)."""
    sock.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(sock, 16, 1)
    except OSError:
        return None
    if data == b"L" and fds:
        return fds[0]
    for fd in fds:
        close_fd(fd)
    return None


def _close_all_but(keep):
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd not in keep:
            close_fd(fd)


def main():
    config = json.loads(sys.argv[2])
    config["control_fd"] = int(sys.argv[1])
    root = Root(config)
    try:
        root.start()
        root.serve()
    except BaseException:  # noqa: B036 - e.g. the host died while the root started (EPIPE on ready)
        root.exit()
