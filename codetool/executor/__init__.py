"""The sandboxed, stateful, forkable executor of model-written code (docs/DESIGN.md §2, §5).

```python
from codetool.executor import Executor, ExecutorConfig, ExecutionResult
with Executor(ExecutorConfig(timeout_s=10), tools={"get_weather": get_weather}) as ex:
    ex.run("x = 1")
    child = ex.fork()                          # a copy of the state, nothing re-executed
    r = child.run("x += 1; print(x)")          # r.stdout == "2\\n"; ex still has x == 1
    child.close()
```

**State.** A step runs in a long-lived worker process, so variables, functions and imports persist
across ``run`` calls. ``fork`` makes the worker ``os.fork`` itself: the copy becomes the worker of
a new executor, so the K candidates of a search step start from the same state without re-running
any earlier step or tool call.

**Tools.** Inside the sandbox each tool is a proxy function that sends ``(name, JSON arguments)``
to the host over a Unix socket; the host performs the call (``codetool.executor.proxy``), records a
``ToolCall``, and returns the parsed JSON (or raw text) of the response, or raises ``ToolError`` in
the code when the status is not ``ok``. ``finish(answer)`` and ``give_up(reason)`` end the step
with a signal that ``except Exception`` cannot swallow; the host keeps the first one. Frames are
JSON only: nothing produced by the sandbox is ever unpickled.

**Isolation, in layers** (``ExecutionResult.isolation`` records which were active, e.g.
``bwrap(net,pid,ipc,uts,mount)+uid+rlimits(as,cpu,fsize,nofile,nproc,core)+seccomp+keyring+no-cgroup``):

| layer | bwrap mode | fallback mode |
|---|---|---|
| namespaces: network, pid, ipc, uts, mount (bubblewrap) | yes | network only, when root |
| read-only root of ``/usr`` + a few ``/etc`` files: no ``/home``, ``/root``, project, ``/proc`` of the host | yes | no |
| scratch directory as cwd, shared by the family | tmpfs ``/tmp`` of ``scratch_mb`` | private directory |
| fresh unprivileged uid per family when the host is root, ``no_new_privs`` | yes | yes |
| rlimits: address space, CPU, file size, open files, processes (needs the uid), core | yes | yes |
| environment from ``codetool.secrets.sandbox_environment``, stdin ``/dev/null`` | yes | yes |
| wall-clock interrupt, then kill of the whole process tree; output capped as it is written | yes | yes |
| seccomp filter (``codetool.executor.seccomp``: no ptrace, ``pidfd_getfd``, ``process_vm_*``, keyrings, new namespaces, io_uring, SysV shm/msg, memfd, AF_VSOCK...) | yes | yes |
| fresh session keyring; workers not dumpable; channels close-on-exec | yes | yes |
| processes that leave their worker's tree are killed at the family's next kill, close or failed fork | yes | yes |
| host-side checks of every frame: depth, finite numbers, 64-bit ints, size; per-step budget of tool calls (``max_tool_calls``) and bytes (``max_step_mb``); answers capped at 100,000 characters; arguments recorded as a preview plus SHA-256; control characters escaped in logs | yes | yes |
| per-candidate cgroup v2 limits (memory incl. shm, pids, cpu) | no (``no-cgroup``) | no |

Measured on the development machine (Debian 12, kernel 6.18, root, bubblewrap 0.8.0; see
``benchmarks/bench_executor.py``): every layer of the bwrap column works, including the uid drop,
``RLIMIT_NPROC`` and the seccomp filter; in the fallback mode everything but the pid, mount and
uts namespaces and the scratch size cap works (the network namespace comes from ``unshare`` as
root).

**Processes.** Each family (a root executor and everything forked from it, i.e. one episode or
one tree) has one root process that never runs model code: it spawns fresh workers, kills process
trees (with SIGCHLD blocked so no pid can be recycled meanwhile), and reaps orphans (it is a child
subreaper). A forked worker is a child of the worker it was forked from (the zygote of that
state); closing an executor kills its worker and every process the worker started, but not the
executors forked from it. When the host dies, the root sees its channel close and kills the rest.
The fallback mode's scratch directory (``codetool-sandbox-<host pid>-<start>-*``) is removed by the
host on close, restart or failed start, and by the root when the host dies first; one left by a
host and root that both died first (SIGKILL) is reclaimed by the next sandbox started in the same
parent directory (``codetool.executor.scratch``).

**Reports, and what the code can still forge.** Every frame carries the nonce of its run (random,
per run) and a sequence number: frames of an earlier run are dropped, frames with an unknown nonce
or out of order stop the step as ``sandbox_violation``; tool calls and ``finish`` from threads an
earlier step started are refused; the worker's serve loop binds its methods before any model code
runs, so replacing ``Worker.run`` changes no later report; budgets, caps and the timeout are
decided by the host. A *sibling* cannot reach a candidate's channel (seccomp denies ``ptrace``,
``pidfd_getfd`` and ``process_vm_*``; workers are not dumpable; exec'd programs hold no channel).
**Residual risk:** the outcome of a step (``ok`` or an error, the answer) is reported by the
interpreter that runs the step's code, so that code can forge its own step's report, and with
deliberate effort (frame introspection, ctypes, patching ``json`` or the channel) the reports of
later steps of the same state and of forks made from it. There is no supervisor process between
the worker and the host that the code cannot reach. The reward of a trajectory is therefore only
as honest as the model that wrote it allows; a model trained against this executor could learn
such tricks, and the tests pin the simple ones only.

**What it does not protect against.** Kernel exploits beyond what the seccomp deny list removes;
CPU and memory contention with the host (no cgroups: this machine mounts the cgroup v1 hierarchy
and delegates no v2 controllers, so the isolation string says ``no-cgroup``; per-process rlimits
and the seccomp denial of SysV shm and memfd stand in). The processes of one family share a uid, a
pid namespace and the scratch directory, so one candidate can signal a sibling or the state it was
forked from (the executor then reports ``state_lost`` on that executor's next run and carries on),
or read a file a sibling wrote. In the fallback mode: reading world-readable host files (the
project included), POSIX shared memory in the host's ``/dev/shm`` and, when the host is not root,
network access, signalling the host user's processes and reading their ``/proc/<pid>/environ`` (a
warning is logged; install bubblewrap). A process that detaches from its worker (double fork)
lives until the next kill, close or failed fork of its family, or its CPU limit. A hung tool
callable is abandoned in a daemon thread.

**Recovery.** A timeout first interrupts the code (state kept, processes it started are killed);
code that ignores the interrupt is killed ``grace_s`` later with all its processes. After a kill,
a crash or ``os._exit`` the result has ``state_lost=True`` (as has the next result of an executor
whose worker was killed between runs), and the next run starts a fresh worker. Problems caused by
the code never raise in the host; ``ExecutorError`` means the sandbox itself cannot start.
"""

from codetool.executor.config import ISOLATION_MODES, ExecutorConfig
from codetool.executor.executor import Executor
from codetool.executor.result import OUTCOMES, ExecutionResult, ToolCall
from codetool.executor.sandbox import ExecutorError, bwrap_problem

__all__ = ["Executor", "ExecutorConfig", "ExecutionResult", "ToolCall", "ExecutorError", "OUTCOMES",
           "ISOLATION_MODES", "bwrap_problem"]
