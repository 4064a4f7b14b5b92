"""The **principals and limits between host and sandbox**, as the Linux kernel enforces them:
the layer both sides stand on.

- shipped into the sandbox too (wire names ``sandbox_kernel``, ``sandbox_procs``; untyped,
  standard library only, like ``inside``): ``calls`` (the kernel calls Python's standard library
  lacks: ``prctl``, capabilities, mounts, the seccomp filter and its listener, keyrings, through
  ``ctypes``) and ``procs`` (``/proc`` and cgroup files: a process's uid, state and start time, a
  cgroup's pids and OOM kills). The sandbox's root sets up and polices the principals with them,
  and the host does the same where it may (``host/adoption.py``, ``host/step.py``);
- used by the host only: ``seccomp`` (the filter program every sandbox process runs under),
  ``cgroups`` (the memory cgroups of a family and its principals) and ``schedstat`` (the CPU and
  run-queue time the deadlines count with). Per-process limits (``RLIMIT_*``) are set where a
  worker starts (``inside/spawn.py``).

**May import** only the standard library and each other (a shipped module only the shipped
ones: ``tests/test_executor_boundary.py``); **trusts** its caller. ``calls``, ``procs`` and
``schedstat`` return a failure value instead of raising where a kernel lacks a feature or a
process is gone.
"""
