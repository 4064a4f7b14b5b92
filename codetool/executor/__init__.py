"""The sandboxed, stateful, forkable executor of model-written code (docs/DESIGN.md §2, §5).

```python
from codetool.executor import Executor, ExecutorConfig, ExecutionResult
with Executor(ExecutorConfig(timeout_s=10), tools={"get_weather": get_weather}) as ex:
    ex.run("x = 1")
    child = ex.fork()                          # a copy of the state, nothing re-executed
    r = child.run("x += 1; print(x)")          # r.stdout == "2\\n"; ex still has x == 1
    child.close()
```

**Layout: where the host ends and the sandbox begins.**

| folder | runs in | holds |
|---|---|---|
| ``codetool/executor/`` | the host | the API: ``Executor`` (``executor.py``), ``ExecutorConfig`` (``config.py``), ``ExecutionResult``, ``ToolCall``, ``StepExecutor`` (``result.py``) |
| ``host/`` | the host | the family, launching bubblewrap, the requests to root and keepers, one step and its verdict, tool proxy, scratch directory |
| ``inside/`` | the sandbox, shipped as source | the family's root (``root``, ``spawn``, ``principals``, ``scratch``) and each worker (``keeper``, ``worker``, ``io``, ``copy``) |
| ``kernel/`` | both | the principals and limits: kernel calls (``calls``) and ``/proc``/cgroup facts (``procs``), shipped too; the seccomp program, memory cgroups and schedstat (``seccomp``, ``cgroups``, ``schedstat``), host only |

Arrows: the API imports ``host``; ``host`` imports ``config``, ``result`` and
``kernel``, and ships ``inside`` and ``kernel``'s ``calls``/``procs`` as text
(``host/launch.py``), never importing ``inside``; ``inside`` imports only the standard library,
itself and the shipped ``kernel`` modules; ``kernel`` imports only itself. Outside the executor,
code imports this package (and ``result``, ``config``), not its folders (``tests/test_layering.py``).
Each folder's docstring says what it trusts.

**State.** A step runs in a long-lived worker process, so variables, functions and imports persist
across ``run`` calls. ``fork`` makes the worker ``os.fork`` itself: the copy becomes the worker of
a new executor, so the K candidates of a search step start from the same state without re-running
any earlier step or tool call. A new executor's worker is a fork of the family's *template*, a
fresh interpreter the family's root execs (``inside.spawn``) and that never runs a step. A
worker's main thread is the *keeper* (``inside.keeper``), which never runs code of the state:
each step runs in a thread of its own.

**Tools.** Inside the sandbox each tool is a proxy function that sends ``(name, JSON arguments)``
to the host over a Unix socket; the host performs the call (``codetool.executor.host.proxy``), records a
``ToolCall``, and returns the parsed JSON (or raw text) of the response, or raises ``ToolError`` in
the code when the status is not ``ok``. ``finish(answer)`` and ``give_up(reason)`` end the step
with a signal that ``except Exception`` cannot swallow; the host keeps the first one. Frames are
JSON only: nothing produced by the sandbox is ever unpickled. Which calls were made and what they
answered is the host's record, whatever the code says.

**The verdict is out of the step's reach** (``codetool.executor.host.step``, ``inside.keeper``). Each
step gets a fresh *verdict* socket. Before the step's code is compiled, the keeper's chain of C
iterators writes 16 random bytes ``t`` on it; it writes ``t`` again only when the code returned
(plus one zero byte when it ended at ``finish``/``give_up``, whose frame the host then also
wants). ``t`` lives in the C stack of that chain, in no Python object, so no code of the state
(rebinding any function, module or builtin, ``__code__``/``__defaults__`` swaps, ``__del__``, gc
callbacks, threads, timers, signal handlers, atexit, ``sys.excepthook``, a class named like the
host's ``Timeout``) can produce the second ``t``: the step is ``ok`` exactly when it arrived, and
anything else written on the socket makes it a ``sandbox_violation``. Timeouts, the CPU, memory,
byte and tool-call limits, the worker's death and the tool calls come from the host and the
kernel. Catching its own exceptions (``try``/``except``) is running, as in the paper. What the
code reports about its error (type, message) is only the observation shown to the model, and a
host error type it names is marked ``"(raised by the code)"``. Between steps the keeper holds no
thread, timer or handler of the state: a thread still running ``grace_s`` after its step kills
the worker (``state_lost``); steps cannot set signal handlers (they run in no main thread); an
audit hook refuses what reads or writes the interpreter's memory (``ctypes``, building or
unmarshalling code objects, tracing, ``gc.get_referrers``, other threads' frames); the workers
have no ``/proc`` and the C modules that give raw memory access are hidden (mount namespace).
``tests/test_executor_verdict.py`` plants each forgery of issue 37 in a state and in its forks.

**The machine's failures are not the code's** (issue 37). A fork, copy or worker start that
fails for a reason outside the code is tried again (``ExecutorConfig.infra_retries``, its
deadline doubled); deadlines count only time the sandbox's processes could run
(``codetool.executor.kernel.schedstat``: run-queue waits are given back, up to ``busy_backstop`` times);
a step's ``timeout_s`` is reached when it had that much time to run (or used that much CPU, for a
step that starves itself), never because the host was busy. Only then is the result
``not_executed`` (``ExecutionResult.executed`` is false; ``error_type`` names the cause:
``WorkerStart``, ``StateLost``, ``HostBusy``; ``attempts`` the tries): no reward, label or metric
counts it. :attr:`Executor.infra_counts` counts the family's retries, recoveries and
not-executed steps. A step cannot stretch its own deadline: it may not lower its priority or pin
its CPUs (seccomp), and the CPU its other threads and processes use counts as its time.
``ExecutorError`` means the sandbox itself cannot start.

**Isolation, in layers** (``ExecutionResult.isolation`` records which were active, e.g.
``bwrap(net,pid,ipc,uts,mount)+uid+principals+rlimits(as,data,cpu,fsize,nofile,nproc,core)+seccomp+hidden(proc,ctypes)+keyring+memory(cgroup-v1)``):

| layer | bwrap mode | fallback mode |
|---|---|---|
| namespaces: network, pid, ipc, uts, mount (bubblewrap) | yes | network and mount, when root |
| read-only root of ``/usr`` + a few ``/etc`` files: no ``/home``, ``/root``, project | yes | no |
| ``/tmp`` (and, as root, ``/var/tmp``, ``/dev/shm``) writable by the root only | yes | when root |
| **every executor its own principal**: its own uid (host root), scratch, memory budget | yes | when root |
| scratch: a tmpfs of ``scratch_mb`` and ``max_files`` inodes per candidate, its cwd/HOME/TMPDIR | yes | when root |
| workers' own mount namespace: no ``/proc``, ``_ctypes`` and CPython's test modules hidden | yes | when root |
| keeper: verdict socket, audit hook, no handler/thread/timer of the state between steps | yes | yes |
| rlimits: address space, CPU, file size, open files, processes (per uid), core | yes | yes |
| memory of a candidate's whole process family: a memory cgroup, else polled by the root | yes | when root |
| environment from ``codetool.secrets.sandbox_environment``, stdin ``/dev/null`` | yes | yes |
| deadline of time the step could run, then kill; output capped as it is written; control sequences removed | yes | yes |
| seccomp filter (``codetool.executor.kernel.seccomp``: no ptrace, ``pidfd_getfd``, ``process_vm_*``, keyrings, new namespaces, io_uring, SysV IPC, memfd, ``MAP_SHARED``, sockets but netlink, epoll/inotify, identity and priority changes...) | yes | yes |
| fresh session keyring; channels close-on-exec | yes | yes |
| host-side checks of every frame: depth, finite numbers, 64-bit ints, numeric call ids, size; per-step budgets of tool calls (``max_tool_calls``) and of every byte the host holds (``max_step_mb``); answers capped; control characters escaped in logs | yes | yes |

Measured on the development machine (Debian 12, kernel 6.18, root, bubblewrap 0.8.0, a writable
cgroup v1 memory hierarchy; ``benchmarks/bench_executor.py``): every layer of the bwrap column
works. Without root nothing separates candidates from each other: they share the host user's
uid (a warning is logged; run the host as root, e.g. in a container, with bubblewrap).

**Principals.** When the host runs as root, every ``Executor`` and every ``fork()`` is a
separate principal: the host picks a fresh random uid (one of 3e9) for it, and the kernel keeps
principals apart: a process cannot signal, trace, open ``/proc/<pid>/fd`` or ``mem`` of, or lower
the limits of another uid's processes; ``RLIMIT_NPROC`` counts per uid; a candidate's scratch is
its own tmpfs (mode 0700, a copy of its parent's when forked, holes of sparse files kept, copied
by a helper charged to the new candidate's cgroup when it is big, so a big scratch delays only its
own fork), so a full scratch or a planted module costs only its owner. A fork copy becomes its
own principal with one ``setresuid``, which the seccomp filter hands to the host (or, without a
memory cgroup, to the family's root) over a seccomp listener: it is let through only for the
copy that was expected (a fresh single-threaded child of the right worker, still of its parent's
uid), once; every other identity change is denied. At the fork the copy also stops sharing
anything with its zygote: inherited file descriptors are reopened (files in the scratch by the
same relative name in its own, others by path, pipes and sockets replaced by ``/dev/null``).

**Idle candidates.** Between its steps a candidate runs nothing: its worker's keeper is blocked
reading its control socket, with no thread, interval or POSIX timer, or signal handler of the
state; at the end of every step every other process of its principal is killed (its uid's, or its
cgroup's), ``setsid`` spinners included, and ``close`` kills the rest. So its memory cannot grow
while it waits; with a cgroup the kernel bounds it at all times, without one the root polls it
while a step runs and once more at its end.

**Host bounds.** What the host keeps for one step (frames received, replies queued and not read,
output, answer) counts against ``max_step_mb``; past it the step is stopped (``StepLimit``), and
a tool answer that would not fit is refused to the code as a tool error. A candidate's processes
and scratch files together get ``memory_mb - 2 * max_step_mb - 4`` MiB: enforced by the kernel
in a memory cgroup (kernel memory included: inodes, page tables, file locks...) where the host
may create one (``codetool.executor.kernel.cgroups``), else polled every 10 ms while it runs (resident
memory of its processes plus its scratch) and killed past it (``MemoryLimit``). Each process also
has ``memory_mb`` as its address-space limit.

**Processes.** Each family (a root executor and everything forked from it, i.e. one episode or
one tree; or, through a :class:`~codetool.executor.FamilyPool`, the executors of several
tasks, each still its own principal) has one root process that never runs model code: it spawns
fresh workers, prepares each principal (uid, scratch mount, cgroup), kills principals' other
processes, and reaps orphans (it is a child subreaper). A forked worker is a child of the worker it
was forked from; closing an executor kills its whole principal, not the executors forked from it.
When the host dies, the root sees its channel close and kills the rest. The fallback mode's family
directory (``codetool-sandbox-<host pid>-<start>-*``) is removed on close, restart or failed
start, by the root when the host dies first, or by the next sandbox started in the same parent
directory (``codetool.executor.host.scratch``).

**Recovery.** A timeout, the CPU limit, the memory limit, a crash or ``os._exit`` kill the worker
and all its processes: the result has ``state_lost=True`` (as has a step that left threads
running), and the next run starts from a fresh state. A worker lost between steps (killed from
outside) makes the next result ``not_executed`` (``StateLost``, ``state_lost=True``).

**Residual risk: what a step can still do, and to whom** (measured with
``tests/test_executor_verdict.py``, ``test_executor_idle.py``, ``test_executor_infra.py`` and
``benchmarks/bench_executor.py``; details in ``docs/EXECUTOR.md``):

- *To its own result:* a failing step chooses how it fails: its error type and message, and,
  from its report, whether the failure reads ``runtime_error``, ``resource_limit`` or
  ``sandbox_violation`` (the interpreter's ``MemoryError``, a full scratch or a refused
  permission are not kernel facts the host could see). It can fail on purpose (raise, exit, kill
  itself, exceed a limit). It cannot turn a failure, a timeout, a limit or a step that did not run
  into ``ok``, nor change which tool calls were made or what they answered.
- *To its descendants* (later steps of its state and its forks): it can make them fail (a state
  is a state: a rebound ``json`` or builtin stays rebound), never succeed, and never turn them
  into ``not_executed``: a state that holds its whole address space still gets its next step's
  thread, and no process, thread or timer of it survives its step. A step that changes anything of
  its worker's control socket (fd 3: flags, I/O signal owner, any socket option, a filter; or fd 5) is
  itself the failure (``inside.keeper.intact``), and so is a change a process of the step makes
  before the host kills it: the keeper checks again after that kill (``host.report``).
- *To its siblings, other episodes, the host:* when the host is root, nothing but CPU contention
  while they run at the same time (no CPU cgroup), which their deadlines give back; at most
  ``memory_mb`` of host memory (measured 938-988 MiB peak growth at the default 1 GiB, with and
  without a memory cgroup).
- *Not defended:* a memory-safety bug of CPython reachable from pure Python without ``ctypes``,
  hand-made code objects or ``marshal`` would reach the keeper's C stack and could forge ``t``
  (none is known to us for these conditions; not audited); kernel exploits beyond what the seccomp
  deny list removes; a worker killed by the machine's own OOM killer (not its cgroup) while its
  step runs reads ``worker_lost``, a failure of the code (the host cannot tell it from the code
  killing itself); a host that throttles the executor with a CPU quota (a container's
  ``cpu.max``): throttled time is no run-queue wait, so it counts as the step's; a host that is
  **not root**: candidates share its uid, workers keep ``/proc``
  and the C modules (the audit hook alone stands between a step and ``ctypes``, and a program the
  step starts can open ``/proc/<worker>/mem``), so the verdict, siblings and the host are all
  within reach; in the fallback mode, world-readable host files, and without root, network access.
  A hung tool callable is abandoned in a daemon thread.
- *Behaviour that changed for the code* (issue 37): a timeout kills the state (no interrupt);
  steps cannot install signal handlers, lower their priority, map ``MAP_SHARED`` memory, read
  ``/proc`` or import ``ctypes``; threads must end within ``grace_s`` of their step.
"""

from codetool.executor.config import ISOLATION_MODES, ExecutorConfig
from codetool.executor.executor import Executor
from codetool.executor.host.channel import log_safe
from codetool.executor.host.launch import ExecutorError, bwrap_problem
from codetool.executor.host.pool import FamilyPool, StartingExecutor, started_in_background
from codetool.executor.result import OUTCOMES, ExecutionResult, ToolCall

__all__ = ["Executor", "ExecutorConfig", "ExecutionResult", "ToolCall", "ExecutorError", "OUTCOMES",
           "ISOLATION_MODES", "bwrap_problem", "FamilyPool", "StartingExecutor", "started_in_background",
           "log_safe"]
