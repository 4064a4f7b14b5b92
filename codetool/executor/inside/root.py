"""Sandbox side of :mod:`codetool.executor`, the **root** role. Standard library only.

Runs inside the sandbox next to ``inside.worker``. The root is the first process of an executor
family and never runs model code. It serves the host's requests, in order, on its control channel:

- ``spawn``: a fresh worker (a new principal: its uid, scratch and cgroup prepared first), a fresh
  interpreter set up by ``inside.spawn`` before any model code runs;
- ``expect``: prepare the principal of a fork copy (its scratch a copy of its parent's, and the map
  of its parent's open files, ``inside.scratch.descriptor_map``) and let the copy's one
  ``setresuid`` through when it comes (``inside.principals``);
- ``begin``/``end``: a step of a principal starts (its memory is polled) or ended (every process of
  the principal but its worker is killed);
- ``release``: kill all of a principal and remove its scratch and cgroup;
- ``exit``, or the end of the control channel (the host died): kill everything and leave.

It also reaps every orphan (it is a child subreaper). Replies carry the request's ``id``.
"""

import json
import os
import select
import signal
import socket
import sys
import time

try:
    import sandbox_kernel as kernel
    from sandbox_io import RootChannel, close_fd
    from sandbox_principals import Principals
    from sandbox_procs import cgroup_pids
    from sandbox_scratch import copy_for_fork, small_scratch
    from sandbox_spawn import exec_worker, unsafe_files
except ImportError:  # imported on the host (tests, documentation tools): the package's copies
    from codetool.executor.inside.io import RootChannel, close_fd
    from codetool.executor.inside.principals import Principals
    from codetool.executor.inside.scratch import copy_for_fork, small_scratch
    from codetool.executor.inside.spawn import exec_worker, unsafe_files
    from codetool.executor.kernel import calls as kernel
    from codetool.executor.kernel.procs import cgroup_pids

WORKER_MODULES = ("sandbox_io", "sandbox_worker", "sandbox_copy", "sandbox_keeper")  # in import order
MS_REC, MS_PRIVATE, MS_NOEXEC = 16384, 1 << 18, 8


class Root:
    """The family's first process (see the module docstring)."""

    def __init__(self, config, sources):
        self.config = config
        self.worker_sources = json.dumps([[n, sources[n]] for n in WORKER_MODULES]).encode()
        self.hidden = []
        self.copies = {}  # helper pipe -> [request id, key, helper pid, its output so far]
        self.chan = RootChannel(config["control_fd"])
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
        if self.config.get("worker_mounts"):
            # the scratch mounts made later reach the workers' own mount namespaces (slaves of this one)
            if kernel.mount("none", self.principals.parent, "", kernel.MS_SHARED, "") < 0:
                self.config["worker_mounts"] = False
            self.hidden = unsafe_files()
        keyring = kernel.new_session_keyring(self.config.get("keyctl_nr"))
        kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
        signal.signal(signal.SIGCHLD, self._reap)
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
            for fd in self.principals.listeners + list(self.copies):
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
                if fd in self.copies:
                    self.copied(fd)
                    if fd not in self.copies:
                        poller.unregister(fd)
                        watched.discard(fd)
                elif ev & select.POLLIN:
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
                self.chan.send({"op": "adopted", "id": expectation.request, "pid": pid, "fdmap": expectation.fdmap})

    def housekeeping(self):
        for expectation in self.principals.expired():
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
        elif op == "end":
            reply = {"op": "ended", "id": msg.get("id"), "reason": None, "oom": 0}
            if principal is not None:
                last_look = principal.active and self.principals.poll_due() is not None
                self.principals.kill(principal, spare=principal.pid)
                if last_look:  # what the candidate keeps while idle is within its budget too
                    self.principals.check_idle(principal, self.pid)
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
        """Prepare the principal of a fork copy; its scratch is copied by a helper process (in the
        copy's cgroup, so the copy's memory is charged to it), so a big scratch delays only its own
        copy, never the family's other requests."""
        key, parent_key, request = int(msg["key"]), msg.get("parent"), msg.get("id")
        parent = self.principals.by_key.get(parent_key)
        try:
            if parent is None:
                raise OSError("the state to fork is gone")
            principal = self.principals.prepare(key, parent_key, copy=False)
        except OSError as exc:
            self.chan.send({"op": "adopt_failed", "id": request, "error": str(exc)[:200]})
            return
        pid = parent.pid
        if pid is None and parent.cgroup:  # (a copy the host adopted: the only process of its cgroup when idle)
            pids = cgroup_pids(parent.cgroup)
            pid = pids[0] if len(pids) == 1 else None
        timeout = max(1.0, float(msg.get("timeout") or 5.0))
        if self.principals.uids and not self.config.get("host_listeners"):
            self.principals.expect(key, parent_key, request, timeout)  # (its setresuid waits for the copy)
        if small_scratch(parent.scratch):  # a few files: copied here at once (cheaper than a helper)
            done = copy_for_fork(self.principals, principal, parent, pid, None)
            self._copied(request, key, isinstance(done, str), done if isinstance(done, str) else "")
            return
        read_fd, write_fd = os.pipe()
        try:
            helper = os.fork()
        except OSError as exc:
            close_fd(read_fd)
            close_fd(write_fd)
            self.principals.expected.pop(key, None)
            self.chan.send({"op": "adopt_failed", "id": request, "error": str(exc)[:200]})
            return
        if helper == 0:
            close_fd(read_fd)
            os._exit(copy_for_fork(self.principals, principal, parent, pid, write_fd))
        close_fd(write_fd)
        self.principals.helpers.add(helper)
        self.copies[read_fd] = [request, key, helper, bytearray()]

    def copied(self, fd):
        """A helper's output is readable: take it; at its end, answer the ``expect`` it served."""
        request, key, helper, data = self.copies[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            chunk = b""
        if chunk:
            data += chunk
            return
        del self.copies[fd]
        close_fd(fd)
        status = self._wait_reaped(helper, 5.0)
        self.principals.helpers.discard(helper)
        done = status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        self._copied(request, key, done, data.decode("ascii", "replace"))

    def _copied(self, request, key, done, fdmap):
        """A fork's scratch is copied (or could not be): let its copy through, or say it failed."""
        expectation = self.principals.expected.get(key)
        if not done:
            self.principals.expected.pop(key, None)
            self.chan.send({"op": "adopt_failed", "id": request, "error": "the scratch could not be copied"})
            return
        if expectation is not None:
            expectation.fdmap, expectation.ready = fdmap, True
        else:  # the host (or no setresuid at all) lets the copy through
            self.chan.send({"op": "prepared", "id": request, "fdmap": fdmap})

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
                exec_worker(self.config, fds, msg, principal, self.principals, theirs, self.worker_sources,
                            self.hidden)
            except BaseException as exc:  # noqa: B036 - report any set-up failure, then die
                try:
                    os.write(2, (f"sandbox worker set-up failed: {exc!r}\n").encode())
                finally:
                    os._exit(70)
            os._exit(70)
        theirs.close()
        for fd in fds:
            close_fd(fd)
        if pid < 0:
            mine.close()
            self.principals.release(key)
            return self.chan.send({"op": "spawn_failed", "id": request, "error": error[:200]})
        principal.pid, principal.spawned = pid, True
        listener = _receive_listener(mine, 20.0)
        mine.close()
        if listener is not None and self.config.get("host_listeners"):  # the host decides
            socket.send_fds(self.chan.sock, [_frame({"op": "spawned", "id": request, "pid": pid, "listener": True})],
                            [listener])
            close_fd(listener)
            return
        if listener is not None:
            self.principals.add_listener(listener)
        self.chan.send({"op": "spawned", "id": request, "pid": pid})

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


def main(sources):
    config = json.loads(sys.argv[2])
    config["control_fd"] = int(sys.argv[1])
    root = Root(config, sources)
    try:
        root.start()
        root.serve()
    except BaseException:  # noqa: B036 - e.g. the host died while the root started (EPIPE on ready)
        root.exit()
