"""The sandbox's seccomp filter: a classic-BPF program that the family's root installs before any
model code runs (every worker and every process it starts inherits it; none can remove it).

**What it denies** (``EPERM`` unless said otherwise), and why:

- reaching another process of the family: ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd`` (the sibling-forgery path: duplicating a sibling's channel), ``kcmp``;
- kernel keyrings: ``keyctl``, ``add_key``, ``request_key`` (the host's session keyring);
- new namespaces: ``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag, and ``clone3``
  (``ENOSYS``: its flags sit in memory a filter cannot read; glibc then falls back to ``clone``);
- memory that rlimits do not count: SysV shared memory and message queues (``shmget``,
  ``shmat``, ``msgget``), ``memfd_create``, ``memfd_secret``;
- large kernel attack surfaces the code has no use for: ``io_uring_*``, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``mount``/``umount2``/``pivot_root``,
  ``open_by_handle_at``;
- sockets other than ``AF_NETLINK`` ones: ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` sockets and
  ``socketpair`` are ``EPERM`` (the candidates of a family share one network namespace, so a
  loopback port or an abstract socket would be a channel between siblings, and a Unix socket's
  buffers are kernel memory that no limit counts); any other family is ``EAFNOSUPPORT`` (AF_VSOCK,
  for one, is not isolated by a network namespace);
- kernel objects whose memory no rlimit counts and that the code has no use for: ``epoll``,
  ``inotify``/``fanotify``, POSIX message queues, SysV semaphores, ``io_setup`` (AIO rings);
- shared memory mappings (``mmap`` with ``MAP_SHARED``): a fork copy would share them with the
  worker it came from (a channel between candidates); ``MAP_PRIVATE`` mappings work;
- lowering its own scheduling priority or pinning its CPUs (``setpriority``, ``sched_setscheduler``,
  ``sched_setparam``, ``sched_setattr``, ``sched_setaffinity``): a step's deadline gives back the
  time its threads waited for a CPU (``codetool.executor.kernel.schedstat``), so a step that made itself
  wait (``SCHED_IDLE``, nice 19) would stretch its deadline up to ``busy_backstop`` and turn an
  endless loop into a ``not_executed`` step;
- signals the kernel would deliver later, on the state's behalf: ``fcntl`` ``F_SETOWN``,
  ``F_SETOWN_EX``, ``F_SETSIG`` and ``F_SETFL`` with ``O_ASYNC``, and ``ioctl`` ``FIOASYNC``,
  ``FIOSETOWN``, ``SIOCSPGRP``, on any descriptor (a kept socket set to signal the worker when the
  host closed its end killed it between steps, with a signal a machine also sends: its next step
  and forks read ``not_executed``; red team, round 5);
- stopping a process: ``kill``, ``tkill``, ``tgkill``, ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo`` and
  ``pidfd_send_signal`` with ``SIGSTOP``, ``SIGTSTP``, ``SIGTTIN`` or ``SIGTTOU`` (a child that
  stopped its worker as the step ended left a keeper that never answers: ``not_executed``);
- identity changes: ``setresuid`` goes to the family's root (``SECCOMP_RET_USER_NOTIF``), which
  lets exactly one call through, the one that makes a fresh fork its own principal (a new uid);
  every other ``set*uid``/``set*gid``/``setgroups`` and ``capset`` is ``EPERM``. A worker keeps
  ``CAP_SETUID`` for that call only; the filter is what stops every other use of it;
- on x86-64, the x32 ABI (syscall numbers with bit 30 set); a foreign architecture (``int 0x80``
  i386 calls) kills the process.

The program is built here, on the host, from a syscall table for x86-64 and aarch64 (checked
against libseccomp's tables by the tests where libseccomp is installed), and installed with
``prctl(PR_SET_SECCOMP)`` through ``ctypes`` inside the sandbox. Why not a binding: the sandbox
interpreter is the system ``python3`` with its standard library only (no ``pyseccomp`` or
``python3-seccomp`` there), the filter is a short deny list, and a hand-built program also works
in the fallback mode, where bubblewrap's ``--seccomp`` does not exist. On other architectures
there is no filter and ``ExecutionResult.isolation`` does not list ``seccomp``.
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/audit.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h).
SYSCALLS = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
               "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308,
               "shmget": 29, "shmat": 30, "msgget": 68, "memfd_create": 319, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "mount": 165, "umount2": 166,
               "pivot_root": 155, "open_by_handle_at": 304, "socket": 41, "socketpair": 53, "clone": 56,
               "setuid": 105, "setgid": 106, "setreuid": 113, "setregid": 114, "setgroups": 116,
               "setresuid": 117, "setresgid": 119, "setfsuid": 122, "setfsgid": 123, "capset": 126,
               "epoll_create": 213, "epoll_create1": 291, "inotify_init": 253, "inotify_init1": 294,
               "fanotify_init": 300, "mq_open": 240, "semget": 64, "io_setup": 206, "seccomp": 317,
               "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144, "sched_setattr": 314,
               "sched_setaffinity": 203, "mmap": 9, "fcntl": 72, "ioctl": 16, "kill": 62, "tkill": 200,
               "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
                "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "setns": 268,
                "shmget": 194, "shmat": 196, "msgget": 186, "memfd_create": 279, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "mount": 40, "umount2": 39,
                "pivot_root": 41, "open_by_handle_at": 265, "socket": 198, "socketpair": 199, "clone": 220,
                "setuid": 146, "setgid": 144, "setreuid": 145, "setregid": 143, "setgroups": 159,
                "setresuid": 147, "setresgid": 149, "setfsuid": 151, "setfsgid": 152, "capset": 91,
                "epoll_create1": 20, "inotify_init1": 26, "fanotify_init": 262, "mq_open": 180,
                "semget": 190, "io_setup": 0, "seccomp": 277, "mmap": 222,
                "setpriority": 140, "sched_setparam": 118, "sched_setscheduler": 119, "sched_setattr": 274,
                "sched_setaffinity": 122, "fcntl": 25, "ioctl": 29, "kill": 129, "tkill": 130, "tgkill": 131,
                "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240},
}
COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435,
          "pidfd_getfd": 438, "memfd_secret": 447, "pidfd_send_signal": 424}  # same number on every architecture
DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "keyctl", "add_key",
          "request_key", "unshare", "setns", "shmget", "shmat", "msgget", "memfd_create", "memfd_secret",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd",
          "mount", "umount2", "pivot_root", "open_by_handle_at", "setuid", "setgid", "setreuid", "setregid",
          "setgroups", "setresgid", "setfsuid", "setfsgid", "capset", "epoll_create", "epoll_create1",
          "inotify_init", "inotify_init1", "fanotify_init", "mq_open", "semget", "io_setup", "setpriority",
          "sched_setparam", "sched_setscheduler", "sched_setattr", "sched_setaffinity")
NOTIFIED = ("setresuid",)  # decided by the family's root (sandbox_guard)
SOCKET_FAMILIES = (16,)  # AF_NETLINK (getaddrinfo, if_nameindex)
DENIED_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6: EPERM
CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
F_SETFL, O_ASYNC = 4, 0o20000
SIGNAL_FCNTLS = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX
SIGNAL_IOCTLS = (0x5452, 0x8901, 0x8902)  # FIOASYNC, FIOSETOWN, SIOCSPGRP
STOP_SIGNALS = (19, 20, 21, 22)  # SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU (x86-64 and aarch64)
SIGNAL_IN_ARG1 = ("kill", "tkill", "rt_sigqueueinfo", "pidfd_send_signal")
SIGNAL_IN_ARG2 = ("tgkill", "rt_tgsigqueueinfo")

# linux/filter.h, linux/seccomp.h
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_USER_NOTIF, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x7FC00000, 0x00050000
_NR, _ARCH, _ARG0, _ARG1, _ARG2, _ARG3 = 0, 4, 16, 24, 32, 40  # offsets in struct seccomp_data (low words of args[i])
MAP_SHARED = 0x01  # also set in MAP_SHARED_VALIDATE


def syscall_numbers(machine: str) -> dict[str, int]:
    """Name -> number of the syscalls the filter looks at, on ``machine`` (``platform.machine()``)."""
    return {**SYSCALLS[machine], **COMMON}


def filter_program(machine: str | None = None, notify: bool = True, signals: bool = True) -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes (8 per instruction), or ``None`` when
    ``machine`` (defaults to this one) has no syscall table here. With ``notify=False``,
    ``setresuid`` is denied like the other identity changes (no root to decide). ``signals=False``
    leaves out the rules on signal-driven I/O and stop signals (only for the tests of the host's
    backstops behind them)."""
    machine = machine or platform.machine()
    if machine not in SYSCALLS:
        return None
    nr = syscall_numbers(machine)
    code: list[tuple | str] = [(_LD_ABS_W, _ARCH), (_JEQ, AUDIT_ARCH[machine], None, "kill"), (_LD_ABS_W, _NR)]
    if machine == "x86_64":
        code.append((_JGE, 0x40000000, "deny", None))
    code += [(_JEQ, nr["socket"], "socket", None), (_JEQ, nr["socketpair"], "deny", None),
             (_JEQ, nr["clone"], "clone", None), (_JEQ, nr["clone3"], "enosys", None),
             (_JEQ, nr["mmap"], "mmap", None)]
    if signals:
        code += [(_JEQ, nr["fcntl"], "fcntl", None), (_JEQ, nr["ioctl"], "ioctl", None)]
        code += [(_JEQ, nr[name], "signal1", None) for name in SIGNAL_IN_ARG1]
        code += [(_JEQ, nr[name], "signal2", None) for name in SIGNAL_IN_ARG2]
    code += [(_JEQ, nr[name], "deny", None) for name in DENIED if name in nr]
    code += [(_JEQ, nr[name], "notify" if notify else "deny", None) for name in NOTIFIED]
    code.append((_RET, RET_ALLOW))
    code += ["socket", (_LD_ABS_W, _ARG0)]
    code += [(_JEQ, family, "allow", None) for family in SOCKET_FAMILIES]
    code += [(_JEQ, family, "deny", None) for family in DENIED_FAMILIES]
    code.append((_RET, _RET_ERRNO | errno.EAFNOSUPPORT))
    code += ["clone", (_LD_ABS_W, _ARG0), (_JSET, CLONE_NEW_FLAGS, "deny", None), (_RET, RET_ALLOW)]
    code += ["mmap", (_LD_ABS_W, _ARG3), (_JSET, MAP_SHARED, "deny", None), (_RET, RET_ALLOW)]
    if signals:
        code += ["fcntl", (_LD_ABS_W, _ARG1), *[(_JEQ, c, "deny", None) for c in SIGNAL_FCNTLS],
                 (_JEQ, F_SETFL, "setfl", None), (_RET, RET_ALLOW),
                 "setfl", (_LD_ABS_W, _ARG2), (_JSET, O_ASYNC, "deny", None), (_RET, RET_ALLOW)]
        code += ["ioctl", (_LD_ABS_W, _ARG1), *[(_JEQ, c, "deny", None) for c in SIGNAL_IOCTLS], (_RET, RET_ALLOW)]
        for label, arg in (("signal1", _ARG1), ("signal2", _ARG2)):
            code += [label, (_LD_ABS_W, arg), *[(_JEQ, n, "deny", None) for n in STOP_SIGNALS], (_RET, RET_ALLOW)]
    code += ["allow", (_RET, RET_ALLOW), "deny", (_RET, _RET_ERRNO | errno.EPERM), "notify", (_RET, RET_USER_NOTIF),
             "enosys", (_RET, _RET_ERRNO | errno.ENOSYS), "kill", (_RET, RET_KILL_PROCESS)]
    return _assemble(code)


def _assemble(code: list) -> bytes:
    """Instructions ``(op, k)`` or ``(jump_op, k, true_label, false_label)`` (``None`` = next)
    and label strings, to bytes; jumps are forward and relative, as BPF wants."""
    labels, position = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = position
        else:
            position += 1
    out, position = bytearray(), 0
    for item in code:
        if isinstance(item, str):
            continue
        position += 1
        if len(item) == 2:
            out += struct.pack("=HBBI", item[0], 0, 0, item[1])
            continue
        op, k, true, false = item
        jt = labels[true] - position if true else 0
        jf = labels[false] - position if false else 0
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("seccomp program: a jump is out of range")
        out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)
