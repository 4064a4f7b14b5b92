"""How a sandbox family is launched: which interpreter runs the sandbox, whether bubblewrap works
here, bubblewrap's command line, and the sources the sandbox interpreter boots from.

The sandbox interpreter reads its modules (JSON ``[[name, source], ...]``) from stdin, installs
the root's under their names and runs the root (``BOOTSTRAP``); nothing of the host's file system is
needed inside. Each worker is a fresh interpreter started by the root (``inside/spawn.py``): it reads
the worker's modules from descriptor 4, disables ``os.register_at_fork`` before anything else is
imported, and runs its keeper (``WORKER_BOOT``, ``inside/keeper.py``).

What is shipped is :data:`SOURCES`: the files of ``codetool/executor/inside/`` and
``codetool/executor/kernel/``, read as text (the host never imports them for this), each installed
in the sandbox under the *wire name* :data:`SOURCES` gives it (``sandbox_io`` for ``inside/io.py``,
``sandbox_kernel`` for ``kernel/calls.py``...), the name the shipped modules import each other by.
Nothing of ``host/`` is ever shipped (``tests/test_executor_boundary.py``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from codetool import CodetoolError
from codetool.secrets import sandbox_environment

logger = logging.getLogger(__name__)

# wire name -> its file, relative to codetool/executor/
SOURCES = {"sandbox_kernel": "kernel/calls.py", "sandbox_procs": "kernel/procs.py", "sandbox_io": "inside/io.py",
           "sandbox_scratch": "inside/scratch.py", "sandbox_principals": "inside/principals.py",
           "sandbox_spawn": "inside/spawn.py", "sandbox_root": "inside/root.py", "sandbox_worker": "inside/worker.py",
           "sandbox_copy": "inside/copy.py", "sandbox_keeper": "inside/keeper.py"}
ROOT_MODULES = ("sandbox_kernel", "sandbox_procs", "sandbox_io", "sandbox_scratch", "sandbox_principals",
                "sandbox_spawn", "sandbox_root")  # in import order; the last one has main()
WORKER_MODULES = ("sandbox_io", "sandbox_worker", "sandbox_copy", "sandbox_keeper")  # the last one has main()
SANDBOX_MODULES = tuple(dict.fromkeys(ROOT_MODULES + WORKER_MODULES))
BOOTSTRAP = ("import json,sys,types\n"
             "mods=dict(json.loads(sys.stdin.buffer.read()))\n"
             f"for name in {ROOT_MODULES!r}:\n"
             "    m=sys.modules[name]=types.ModuleType(name)\n"
             "    exec(compile(mods[name],'<'+name+'>','exec'),m.__dict__)\n"
             "m.main(mods)")
WORKER_BOOT = ("import posix,sys,types\n"
               "posix.register_at_fork=dict\n"  # before anything registers a fork hook (inside/keeper.py)
               "src=b''\n"
               "while 1:\n"
               " c=posix.read(4,1<<20)\n"
               " if not c:break\n"
               " src+=c\n"
               "posix.close(4)\n"
               "import json\n"
               "for name,s in json.loads(src):\n"
               " m=sys.modules[name]=types.ModuleType(name)\n"
               " exec(compile(s,'<'+name+'>','exec'),m.__dict__)\n"
               "m.main(json.loads(sys.argv[1]))")
NAMESPACES = "net,pid,ipc,uts,mount"
SYSTEM_PYTHON = "/usr/bin/python3"
CGROUP_MOUNT = "/run/codetool-cgroup"  # where bubblewrap shows the family's cgroup to its root
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
             "CAP_FOWNER")


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


def _bwrap_argv(bwrap: str, info: dict, as_root: bool, cgroup: str | None = None, scratch_mb: int = 1) -> list[str]:
    # No --die-with-parent: it fires when the *thread* that started bwrap exits. The root notices
    # the end of its control channel instead and kills the family when the host goes away.
    argv = [bwrap, "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if as_root:  # the root process keeps only what it needs (see the module docstring)
        argv += ["--cap-drop", "ALL"]
        for cap in ROOT_CAPS:
            argv += ["--cap-add", cap]
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
    # /tmp holds only the principals' scratch mounts: nobody but the root creates anything there.
    # (Not root: no mounts, so the scratch directories share /tmp, of scratch_mb.)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(1 << 20 if as_root else scratch_mb << 20),
             "--perms", "0711" if as_root else "0700", "--tmpfs", "/tmp"]
    if cgroup:
        argv += ["--bind", cgroup, CGROUP_MOUNT]
    argv += ["--remount-ro", "/", "--chdir", "/tmp", "--"]
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
    argv = _bwrap_argv(bwrap, info, os.geteuid() == 0) + [python, "-I", "-c", "pass"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=sandbox_environment())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap does not run: {exc}"
    if proc.returncode != 0:
        return f"bubblewrap fails here: {(proc.stderr or '').strip()[-300:] or proc.returncode}"
    return None


@functools.lru_cache(maxsize=1)
def _sandbox_sources() -> bytes:
    executor = Path(__file__).parent.parent
    return json.dumps([[name, (executor / SOURCES[name]).read_text()] for name in SANDBOX_MODULES]).encode()


