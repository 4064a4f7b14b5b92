"""Sandbox side of :mod:`codetool.executor`, run by the family's **root** in the child it forks for a
new worker: what must happen with the root's privileges before the worker's interpreter starts,
then ``execve`` of a fresh interpreter (``codetool.executor.host.launch.WORKER_BOOT``). Standard library
only.

Why a fresh interpreter: a fork of the root would carry the root's ``ctypes`` objects (calling them
reads and writes the process's memory and raises no audit event) and whatever fork hooks its
imports registered; the fresh one has neither, and its keeper disables both before any code of the
state exists (``inside.keeper``).

In order: the descriptors at fixed numbers (1 and 2 the output pipe, 3 the control socket, 4 the
worker's sources, 5 the directory of the scratch directories) and no other; the principal's cgroup;
the rlimits; when the root may mount, a mount namespace of the worker's own, a slave of the
family's (so the scratch mounts the root makes later reach it), without ``/proc`` (no
``/proc/self/mem``: the interpreter's memory cannot be read through a file) and with the C modules
that give raw memory access (``_ctypes``, the CPython test modules) hidden behind ``/dev/null``;
the uid, gid and ``CAP_SETUID`` (kept across ``execve`` as an ambient capability, for the one
``setresuid`` of each fork copy, which the seccomp filter hands to the host or the root); the
scratch as cwd, ``HOME`` and ``TMPDIR``; the seccomp filter (its listener handed to the root);
``execve``.
"""

import fcntl
import json
import os
import resource
import socket
import sys

try:
    import sandbox_kernel as kernel
    from sandbox_io import close_fd
except ImportError:  # imported on the host (tests, documentation tools): the package's copies
    from codetool.executor.inside.io import close_fd
    from codetool.executor.kernel import calls as kernel

LIMITS = (("as", "RLIMIT_AS"), ("data", "RLIMIT_DATA"), ("cpu", "RLIMIT_CPU"), ("fsize", "RLIMIT_FSIZE"),
          ("nofile", "RLIMIT_NOFILE"), ("nproc", "RLIMIT_NPROC"), ("core", "RLIMIT_CORE"))
UNSAFE_MODULES = ("_ctypes", "_ctypes_test", "_testcapi", "_testinternalcapi", "_testbuffer", "_xxtestfuzz",
                  "_testmultiphase", "_testimportmultiple", "_testclinic")
FIXED = (1, 3, 4, 5)
MS_NOEXEC = 8  # output, control socket, sources, scratch parent (2 is a copy of 1)


def unsafe_files():
    """Paths of the C modules that give raw memory access (hidden from every worker)."""
    import importlib.util

    found = []
    for name in UNSAFE_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            found.append(spec.origin)
    return found


def exec_worker(config, fds, msg, principal, principals, handoff, sources, hidden):
    """Become the worker of ``principal`` (see the module docstring); never returns.

    Args:
        config (`dict`): the root's settings.
        fds (`list[int]`): the worker's control socket and the write end of its output pipe.
        msg (`dict`): the host's ``spawn`` request (tools, output size, grace).
        principal: the new principal (``inside.principals.Principal``).
        principals: the family's ``inside.principals.Principals``.
        handoff (`socket.socket`): where the seccomp listener goes (to the root).
        sources (`bytes`): JSON ``[[name, source], ...]`` of the worker's modules.
        hidden (`list[str]`): files to hide behind ``/dev/null`` (:func:`unsafe_files`).
    """
    os.setsid()
    source_read, source_write = os.pipe()
    try:
        fcntl.fcntl(source_write, fcntl.F_SETPIPE_SZ, len(sources) + 4096)
    except (OSError, AttributeError):
        pass
    os.write(source_write, sources)
    os.close(source_write)
    handoff_fd = fcntl.fcntl(handoff.detach(), fcntl.F_DUPFD_CLOEXEC, 100)
    order = (fds[1], fds[0], source_read)
    staged = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in order]  # off the target numbers first
    for fd in order:
        close_fd(fd)
    for fd, target in zip(staged, FIXED):
        os.dup2(fd, target)
        close_fd(fd)
    os.dup2(1, 2)
    _close_all_but({0, 1, 2, 3, 4, handoff_fd})
    principals.attach(principal, os.getpid())  # before any allocation of its own
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
    mounts = bool(config.get("worker_mounts")) and _own_mounts(hidden)
    parent_fd = os.open(principals.parent, os.O_PATH | os.O_DIRECTORY)  # in the worker's own namespace
    if parent_fd != 5:
        os.dup2(parent_fd, 5)
        close_fd(parent_fd)
    os.set_inheritable(5, True)
    if uid is not None:
        gid = config.get("gid") if config.get("gid") is not None else uid
        keep = [kernel.CAP_SETUID] if config.get("principals") else []
        kernel.prctl(kernel.PR_SET_KEEPCAPS, 1)  # CAP_SETUID survives the drop, for the copies
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if not kernel.capset(keep, inheritable=True) or (keep and not kernel.keep_across_exec(keep[0])):
            raise RuntimeError("could not set the worker's capabilities")
        kernel.prctl(kernel.PR_SET_KEEPCAPS, 0)
        if os.getresuid() != (uid, uid, uid):
            raise RuntimeError(f"could not drop to uid {uid}")
    os.chdir(5)  # entered as the principal's own uid
    os.chdir(os.path.basename(principal.scratch))
    env = dict(os.environ, HOME=principal.scratch, TMPDIR=principal.scratch)
    listener, seccomp = None, False
    if config.get("seccomp"):
        if config.get("principals"):
            listener = kernel.install_seccomp(bytes.fromhex(config["seccomp"]), config.get("seccomp_nr"))
            seccomp = listener is not None
        if not seccomp:  # no listener here: every identity change is simply denied
            seccomp = kernel.install_seccomp(bytes.fromhex(config["seccomp_plain"]))
    hand = socket.socket(fileno=handoff_fd)
    if listener is not None:
        socket.send_fds(hand, [b"L"], [listener])
        close_fd(listener)
    else:
        hand.send(b"N")
    hand.close()
    settings = {"tools": list(msg["tools"]), "max_output_chars": int(msg["max_output_chars"]),
                "grace": float(msg.get("grace", 0.5)), "uid": uid, "limits": applied, "seccomp": bool(seccomp),
                "principal": listener is not None, "mounts": mounts, "scratch_parent": principals.parent}
    python = sys.executable
    os.execve(python, [python, "-I", "-S", "-B", "-c", config["worker_boot"], json.dumps(settings)], env)


def _own_mounts(hidden):
    """The worker's own mount namespace (see the module docstring); ``False`` if it cannot have one."""
    if not kernel.unshare(kernel.CLONE_NEWNS):
        return False
    if kernel.mount("none", "/", "", kernel.MS_REC | kernel.MS_SLAVE, "") < 0:
        raise RuntimeError("could not make the worker's mounts its own")
    for _ in range(8):  # every procfs stacked there (the fallback's own is mounted over the host's)
        if kernel.umount("/proc") < 0:
            break
    # and an empty, read-only directory in its place
    if kernel.mount("none", "/proc", "tmpfs", kernel.MS_RDONLY | kernel.MS_NOSUID | kernel.MS_NODEV | MS_NOEXEC,
                    "size=4k,nr_inodes=1,mode=0555") < 0:
        raise RuntimeError("could not hide /proc from the worker")
    for path in hidden:
        if kernel.mount("/dev/null", path, "", kernel.MS_BIND, "") < 0:
            raise RuntimeError(f"could not hide {path} from the worker")
    return True


def _close_all_but(keep):
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd not in keep:
            close_fd(fd)
