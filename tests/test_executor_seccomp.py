"""The seccomp program (codetool.executor.kernel.seccomp): its syscall table against libseccomp's, and
its decisions, read by a small classic-BPF interpreter, for both architectures."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import struct

import pytest

from codetool.executor.kernel.seccomp import (
    AUDIT_ARCH,
    DENIED,
    RET_ALLOW,
    RET_KILL_PROCESS,
    RET_USER_NOTIF,
    SYSCALLS,
    filter_program,
    syscall_numbers,
)

ERRNO = 0x00050000


def decide(program: bytes, nr: int, arch: int, arg0: int = 0, *args: int) -> int:
    """What the filter returns for one syscall (``struct seccomp_data``, little endian)."""
    rest = (list(args) + [0] * 5)[:5]
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, *rest)
    code = [struct.unpack_from("=HBBI", program, 8 * i) for i in range(len(program) // 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", sorted(SYSCALLS))
def test_the_filter_decides_as_documented(machine):
    program, arch, nr = filter_program(machine), AUDIT_ARCH[machine], syscall_numbers(machine)
    assert len(program) % 8 == 0 and len(program) // 8 < 150
    for name in DENIED:
        if name in nr:  # (aarch64 has no epoll_create or inotify_init)
            assert decide(program, nr[name], arch) == ERRNO | errno.EPERM, name
    assert decide(program, nr["clone3"], arch) == ERRNO | errno.ENOSYS
    assert decide(program, nr["socket"], arch, 40) == ERRNO | errno.EAFNOSUPPORT  # AF_VSOCK
    assert decide(program, nr["socket"], arch, 16) == RET_ALLOW  # AF_NETLINK
    for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6: siblings share the network namespace
        assert decide(program, nr["socket"], arch, family) == ERRNO | errno.EPERM
    for family in (1, 2, 10, 16):
        assert decide(program, nr["socketpair"], arch, family) == ERRNO | errno.EPERM
    # the one identity change: setresuid goes to the family's root, which decides
    assert decide(program, nr["setresuid"], arch) == RET_USER_NOTIF
    assert decide(filter_program(machine, notify=False), nr["setresuid"], arch) == ERRNO | errno.EPERM
    for name in ("setuid", "setreuid", "setfsuid", "setgid", "setresgid", "setgroups", "capset"):
        assert decide(program, nr[name], arch) == ERRNO | errno.EPERM, name
    assert decide(program, nr["clone"], arch, 0x01200011) == RET_ALLOW  # fork(): SIGCHLD|SETTID...
    assert decide(program, nr["clone"], arch, 0x10000000 | 17) == ERRNO | errno.EPERM  # CLONE_NEWUSER
    # no signal-driven I/O (the kernel would signal the worker later, on the state's behalf)
    for command in (8, 10, 15):  # F_SETOWN, F_SETSIG, F_SETOWN_EX
        assert decide(program, nr["fcntl"], arch, 3, command, 1) == ERRNO | errno.EPERM, command
    assert decide(program, nr["fcntl"], arch, 3, 4, 0o20000 | 0o4000) == ERRNO | errno.EPERM  # F_SETFL O_ASYNC
    assert decide(program, nr["fcntl"], arch, 3, 4, 0o4000) == RET_ALLOW  # F_SETFL O_NONBLOCK
    for command in (1, 3, 9, 1030):  # F_GETFD, F_GETFL, F_GETOWN, F_DUPFD_CLOEXEC
        assert decide(program, nr["fcntl"], arch, 3, command) == RET_ALLOW, command
    for request in (0x5452, 0x8901, 0x8902):  # FIOASYNC, FIOSETOWN, SIOCSPGRP
        assert decide(program, nr["ioctl"], arch, 3, request) == ERRNO | errno.EPERM, request
    assert decide(program, nr["ioctl"], arch, 1, 0x5401) == RET_ALLOW  # TCGETS
    # no stopping a process; other signals pass
    for name, place in (("kill", 1), ("tkill", 1), ("tgkill", 2), ("rt_sigqueueinfo", 1), ("rt_tgsigqueueinfo", 2),
                        ("pidfd_send_signal", 1)):
        for sig in (19, 20, 21, 22):
            args = [0, 0, 0]
            args[place] = sig
            assert decide(program, nr[name], arch, *args) == ERRNO | errno.EPERM, (name, sig)
        args = [0, 0, 0]
        args[place] = 15
        assert decide(program, nr[name], arch, *args) == RET_ALLOW, name
    unsignalled = filter_program(machine, signals=False)
    assert decide(unsignalled, nr["fcntl"], arch, 3, 8, 1) == RET_ALLOW
    read, write = {"x86_64": (0, 1), "aarch64": (63, 64)}[machine]
    assert decide(program, read, arch) == RET_ALLOW and decide(program, write, arch) == RET_ALLOW
    assert decide(program, 1, 0x40000003) == RET_KILL_PROCESS  # i386 calls on an x86-64 kernel
    if machine == "x86_64":
        assert decide(program, 0x40000000 | 1, arch) == ERRNO | errno.EPERM  # the x32 ABI
    assert filter_program("sparc") is None


def test_the_syscall_table_matches_libseccomp():
    path = ctypes.util.find_library("seccomp")
    if not path:
        pytest.skip("libseccomp is not installed here")
    lib = ctypes.CDLL(path)
    lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    for machine in SYSCALLS:
        for name, number in syscall_numbers(machine).items():
            assert lib.seccomp_syscall_resolve_name_arch(AUDIT_ARCH[machine], name.encode()) == number, \
                (machine, name)
