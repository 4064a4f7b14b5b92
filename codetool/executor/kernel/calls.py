"""Sandbox side of :mod:`codetool.executor`: the few kernel calls Python's standard library lacks,
through ``ctypes``. Standard library only (it runs in the sandbox's system interpreter).

- ``prctl`` options, ``capset`` (the capability sets of the calling thread) and the ambient set,
  ``mount``/``umount2``;
- installing the seccomp filter built by the host (``codetool.executor.kernel.seccomp``), optionally with a
  *listener*: a file descriptor on which the family's root receives the calls the filter hands it
  (``SECCOMP_RET_USER_NOTIF``: only ``setresuid``) and answers each one, letting it run or failing
  it with ``EPERM`` (``struct seccomp_notif``/``seccomp_notif_resp``, Linux >= 5.5);
- joining a fresh session keyring.

Every function returns a failure value (``False``/``None``/``-errno``) instead of raising, so a
kernel without a feature degrades to a described isolation string rather than a crash.
"""

import ctypes
import errno
import os
import struct
from typing import Any

PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 8, 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 47, 2
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
# _IOWR('!', 0, struct seccomp_notif[80]), _IOWR('!', 1, struct seccomp_notif_resp[24]), _IOW('!', 2, u64)
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
NOTIF_SIZE, RESP_SIZE = 80, 24
KEYCTL_JOIN_SESSION_KEYRING = 1
CAP_SETUID = 7
CAPABILITY_VERSION_3 = 0x20080522
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MNT_DETACH = 1, 2, 4, 32, 2
MS_BIND, MS_REC, MS_SLAVE, MS_SHARED = 4096, 16384, 1 << 19, 1 << 20
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000

_LIBC: Any  # a CDLL, or None: a call on None raises AttributeError, which every caller catches
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no libc: every call below reports failure
    _LIBC = None


def _errno_result(value):
    return value if value >= 0 else -ctypes.get_errno()


def prctl(option, value, arg3=0):
    """``prctl(option, value, arg3, 0, 0) == 0``."""
    try:
        return _LIBC.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(arg3), 0, 0) == 0
    except (AttributeError, OSError):
        return False


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capset(capabilities, inheritable=False):
    """Set the calling thread's effective and permitted sets to ``capabilities`` (numbers below
    32), and its inheritable set to them too when ``inheritable`` (else to nothing: then an
    ambient raise, :func:`keep_across_exec`, is possible). Only lowering works."""
    mask = 0
    for cap in capabilities:
        mask |= 1 << cap
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = mask
    if inheritable:
        data[0].inheritable = mask
    try:
        return _LIBC.capset(ctypes.byref(header), ctypes.byref(data)) == 0
    except (AttributeError, OSError):
        return False


def keep_across_exec(capability):
    """Raise ``capability`` (already permitted and inheritable) into the ambient set, so that a
    program this process executes keeps it (``PR_CAP_AMBIENT_RAISE``)."""
    return prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, capability)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(program, seccomp_nr=None):
    """Install a seccomp filter (``struct sock_filter[]`` bytes) on this thread and everything it
    will start. With ``seccomp_nr`` (the ``seccomp`` syscall number), ask for a listener: returns
    its file descriptor, or ``None`` when the kernel cannot give one (nothing was installed then).
    Without it, returns whether the filter was installed. Needs ``no_new_privs`` first."""
    if not program or len(program) % 8:
        return None if seccomp_nr is not None else False
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    try:
        if seccomp_nr is None:
            return _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
        fd = _LIBC.syscall(ctypes.c_long(seccomp_nr), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                           ctypes.c_long(SECCOMP_FILTER_FLAG_NEW_LISTENER), ctypes.byref(fprog))
    except (AttributeError, OSError):
        return None if seccomp_nr is not None else False
    return fd if fd >= 0 else None


def new_session_keyring(keyctl_nr):
    """Join a fresh anonymous session keyring, so no key of the host's session is in reach."""
    if keyctl_nr is None:
        return False
    try:
        return _LIBC.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                             ctypes.c_void_p(None)) >= 0
    except (AttributeError, OSError):
        return False


def unshare(flags):
    try:
        return _LIBC.unshare(ctypes.c_int(flags)) == 0
    except (AttributeError, OSError):
        return False


def mount(source, target, fstype, flags, options):
    """``mount(2)``; 0 or ``-errno``."""
    try:
        return _errno_result(_LIBC.mount(source.encode(), target.encode(), fstype.encode(),
                                         ctypes.c_ulong(flags), options.encode() if options else None))
    except (AttributeError, OSError):
        return -errno.ENOSYS


def umount(target):
    """Lazy ``umount2(target, MNT_DETACH)``; 0 or ``-errno``."""
    try:
        return _errno_result(_LIBC.umount2(target.encode(), MNT_DETACH))
    except (AttributeError, OSError):
        return -errno.ENOSYS


class Notification:
    """One call a filter handed to its listener: ``id``, the calling thread ``pid`` (in the
    listener's pid namespace), the syscall ``nr`` and its six ``args``."""

    __slots__ = ("id", "pid", "nr", "args")

    def __init__(self, raw):
        self.id, self.pid = struct.unpack_from("=QI", raw, 0)
        self.nr = struct.unpack_from("=i", raw, 16)[0]
        self.args = struct.unpack_from("=6Q", raw, 32)


def receive_notification(listener):
    """The next notification on ``listener`` (call when it is readable), or ``None`` (the caller
    died meanwhile, or the kernel refused)."""
    raw = ctypes.create_string_buffer(NOTIF_SIZE)
    try:
        if _LIBC.ioctl(listener, ctypes.c_ulong(NOTIF_RECV), raw) != 0:
            return None
    except (AttributeError, OSError):
        return None
    return Notification(raw.raw)


def notification_alive(listener, notification_id):
    """Whether the notified thread still waits (its pid was not reused meanwhile)."""
    value = ctypes.c_uint64(notification_id)
    try:
        return _LIBC.ioctl(listener, ctypes.c_ulong(NOTIF_ID_VALID), ctypes.byref(value)) == 0
    except (AttributeError, OSError):
        return False


def answer_notification(listener, notification_id, allow):
    """Let the notified call run (``allow``) or fail it with ``EPERM``."""
    if allow:
        resp = struct.pack("=QqiI", notification_id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE)
    else:
        resp = struct.pack("=QqiI", notification_id, 0, -errno.EPERM, 0)
    buf = ctypes.create_string_buffer(resp, RESP_SIZE)
    try:
        return _LIBC.ioctl(listener, ctypes.c_ulong(NOTIF_SEND), buf) == 0
    except (AttributeError, OSError):
        return False


def close(fd):
    try:
        os.close(fd)
    except OSError:
        pass
