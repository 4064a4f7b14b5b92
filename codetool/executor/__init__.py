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
``bwrap(net,pid,ipc,uts,mount)+uid+principals+rlimits(as,cpu,fsize,nofile,nproc,core)+seccomp+keyring+memory(cgroup-v1)``):

| layer | bwrap mode | fallback mode |
|---|---|---|
| namespaces: network, pid, ipc, uts, mount (bubblewrap) | yes | network and mount, when root |
| read-only root of ``/usr`` + a few ``/etc`` files: no ``/home``, ``/root``, project | yes | no |
| ``/tmp`` (and, as root, ``/var/tmp``, ``/dev/shm``) writable by the root only | yes | when root |
| **every executor its own principal**: its own uid (host root), scratch, memory budget | yes | when root |
| scratch: a tmpfs of ``scratch_mb`` and ``max_files`` inodes per candidate, its cwd/HOME/TMPDIR | yes | when root |
| ``/proc`` shows a candidate its own processes only (``hidepid``) | yes | when root |
| rlimits: address space, CPU, file size, open files, processes (per uid), core | yes | yes |
| memory of a candidate's whole process family: a memory cgroup, else polled by the root | yes | when root |
| environment from ``codetool.secrets.sandbox_environment``, stdin ``/dev/null`` | yes | yes |
| wall-clock interrupt, then kill; output capped as it is written; control sequences removed | yes | yes |
| seccomp filter (``codetool.executor.seccomp``: no ptrace, ``pidfd_getfd``, ``process_vm_*``, keyrings, new namespaces, io_uring, SysV IPC, memfd, sockets but netlink, epoll/inotify, identity changes...) | yes | yes |
| fresh session keyring; workers not dumpable; channels close-on-exec | yes | yes |
| host-side checks of every frame: depth, finite numbers, 64-bit ints, numeric call ids, size; per-step budgets of tool calls (``max_tool_calls``) and of every byte the host holds (``max_step_mb``); answers capped; control characters escaped in logs | yes | yes |

Measured on the development machine (Debian 12, kernel 6.18, root, bubblewrap 0.8.0, a writable
cgroup v1 memory hierarchy; ``benchmarks/bench_executor.py``): every layer of the bwrap column
works. Without root nothing separates candidates from each other: they share the host user's
uid (a warning is logged; run the host as root, e.g. in a container, with bubblewrap).

**Principals.** When the host runs as root, every ``Executor`` and every ``fork()`` is a
separate principal: the host picks a fresh random uid (one of 3e9) for it, and the kernel keeps
principals apart: a process cannot signal, trace, open ``/proc/<pid>/fd`` or ``mem`` of, or lower
the limits of another uid's processes; ``RLIMIT_NPROC`` counts per uid; a candidate's scratch is
its own tmpfs (mode 0700, a copy of its parent's when forked), so a full scratch or a planted
module costs only its owner; ``/proc`` lists its own processes only. A fork copy becomes its own
principal with one ``setresuid``, which the seccomp filter hands to the host (or, without a
memory cgroup, to the family's root) over a seccomp listener: it is let through only for the
copy that was expected (a fresh single-threaded child of the right worker, still of its parent's
uid), once; every other identity change is denied. At the fork the copy also stops sharing
anything with its zygote: inherited file descriptors are reopened (files in the scratch by the
same relative name in its own, others by path, pipes and sockets replaced by ``/dev/null``) and
``MAP_SHARED`` mappings become private copies. A worker runs only while the host talks to it:
after each run (and fork) a worker with threads of its own is stopped (``SIGSTOP``), and every
other process of its principal is killed, so nothing a step left behind outlives its result.

**Host bounds.** What the host keeps for one step (frames received, replies queued and not read,
output, answer) counts against ``max_step_mb``; past it the step is stopped (``StepLimit``), and
a tool answer that would not fit is refused to the code as a tool error. A candidate's processes
and scratch files together get ``memory_mb - 2 * max_step_mb - 4`` MiB: enforced by the kernel
in a memory cgroup (kernel memory included: inodes, page tables, file locks...) where the host
may create one (``codetool.executor.cgroups``), else polled every 10 ms while it runs (resident
memory of its processes plus its scratch) and killed past it (``MemoryLimit``). Each process also
has ``memory_mb`` as its address-space limit.

**Processes.** Each family (a root executor and everything forked from it, i.e. one episode or
one tree; or, through a :class:`~codetool.executor.pool.FamilyPool`, the executors of several
tasks, each still its own principal) has one root process that never runs model code: it spawns fresh workers, prepares each
principal (uid, scratch mount, cgroup), stops and kills principals when there is no cgroup, and
reaps orphans (it is a child subreaper). A forked worker is a child of the worker it was forked
from; closing an executor kills its whole principal, not the executors forked from it. When the
host dies, the root sees its channel close and kills the rest. The fallback mode's family
directory (``codetool-sandbox-<host pid>-<start>-*``) is removed on close, restart or failed
start, by the root when the host dies first, or by the next sandbox started in the same parent
directory (``codetool.executor.scratch``).

**A poisoned state is one failed candidate.** A protocol error (a frame that is not valid), a
worker that does not answer, or a copy that does not start within ``FORK_TIMEOUT_S`` (1 s) never
raises in the host: ``run`` returns ``sandbox_violation`` / ``worker_lost`` with
``state_lost=True``, and ``fork`` returns an executor whose first result is that failure (nothing
ran) and which goes on from a fresh state; a zygote that answered with garbage or not at all is
killed (its executor's next result says ``state_lost``). ``ExecutorError`` means the sandbox itself
cannot start.

**Residual risk: what a step can forge, and what it cannot.** The outcome of a step (``ok`` or an
error, its message, ``finish``'s answer) is reported by the interpreter that runs the step's code,
and that interpreter is the state the step leaves to every later step of its executor and to all
executors forked from it afterwards. So a step can forge the reports of itself and of all its
descendants, with ordinary code that reaches the worker's own objects, which are reachable from
the names it is given: one line, ``finish.__globals__['classify'] = lambda e: 'ok'``, makes every
later error of the state and of its forks read ``ok``; an object with a ``__del__`` in a garbage
cycle, or a thread the step started, does the same later, out of sight of the step that planted
it; ``gc.get_objects()`` finds every object. The cheap routes that need no introspection are
closed and pinned by tests: rebinding ``builtins.exec``/``compile``, the worker's modules in
``sys.modules``, audit hooks (the sandbox's own hook refuses more), a ``__builtins__`` mapping,
``sys.settrace``/``setprofile`` (reset every step), catching the timeout interrupt (still a
timeout), forged or replayed frames (nonce and sequence numbers). No in-process defence can be
complete, and no verdict computed outside the interpreter can tell what the code raised, so we
did not build one; the reward of a trajectory is only as honest as the model that wrote its
earlier steps allows. What the step cannot forge, because the host decides it: the tool calls
made and their answers, timeouts, CPU, memory, byte and call limits, ``state_lost``, the output
captured from the pipe (a step chooses what it prints, but not what the host adds: printed lines
that imitate the host's are marked, ``codetool.search.prompt``), and, with separate principals,
anything of a sibling (its processes, files, output, limits, state), of another episode, or of
the host.

**What it does not protect against.** Kernel exploits beyond what the seccomp deny list removes;
CPU contention between candidates that run at the same time (there is no CPU cgroup: a candidate
can slow a concurrent sibling down, within the sibling's own timeout and CPU limit); a host that
is not root (candidates share its uid: one can signal, trace or read what another holds); in the
fallback mode, reading world-readable host files (the project included), and, when the host is
not root, network access. A hung tool callable is abandoned in a daemon thread.

**Recovery.** A timeout first interrupts the code (state kept, processes it started are killed);
code that ignores the interrupt is killed ``grace_s`` later with all its processes. After a kill,
a crash or ``os._exit`` the result has ``state_lost=True`` (as has the next result of an executor
whose worker was killed between runs), and the next run starts a fresh worker.
"""

from codetool.executor.config import ISOLATION_MODES, ExecutorConfig
from codetool.executor.executor import Executor
from codetool.executor.launch import ExecutorError, bwrap_problem
from codetool.executor.result import OUTCOMES, ExecutionResult, ToolCall

__all__ = ["Executor", "ExecutorConfig", "ExecutionResult", "ToolCall", "ExecutorError", "OUTCOMES",
           "ISOLATION_MODES", "bwrap_problem"]
