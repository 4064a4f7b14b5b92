"""``ExecutorConfig``: the limits and isolation settings of :class:`~codetool.executor.Executor`."""

from __future__ import annotations

from dataclasses import dataclass

from codetool.config import ConfigError, option

ISOLATION_MODES = ("auto", "bwrap", "fallback")


@dataclass
class ExecutorConfig:
    """Limits of the sandbox that runs model-written code (docs/DESIGN.md §2, §5).

    Args:
        timeout_s (`float`, *optional*, defaults to `30.0`): seconds one ``run`` may take, not
            counting the time its threads waited for a CPU on a busy host (see ``busy_backstop``)
            nor the time the host spent performing its tool calls (each has ``tool_timeout_s``;
            ``max_tool_calls`` bounds their number). At the limit the worker and everything it started are killed
            (outcome ``timeout``) and the state is lost.
        cpu_time_s (`float`, *optional*, defaults to `20.0`): CPU seconds each sandbox process may
            use (``RLIMIT_CPU``). Past it the worker is killed (``CPULimit``). Every fork starts from
            zero, and the executor re-forks a worker that has used half of it, so in practice it
            bounds one step.
        memory_mb (`int`, *optional*, defaults to `1024`): MiB one step may make the host hold in
            all: every process of the candidate together with its scratch files (and, with a
            memory cgroup, its kernel memory) gets ``memory_mb - 2 * max_step_mb - 4``, the host's
            own buffers for the step the rest. Past it the candidate is killed (``MemoryLimit``).
            Each process also has it as its address-space limit (``RLIMIT_AS``; and as its data
            limit, ``RLIMIT_DATA``, never reached first): one bigger allocation raises ``MemoryError``.
        max_output_chars (`int`, *optional*, defaults to `20000`): characters of stdout/stderr kept
            per step; the rest is dropped as it is written (``output_truncated``).
        max_file_mb (`int`, *optional*, defaults to `64`): largest file the code may write
            (``RLIMIT_FSIZE``), in MiB.
        scratch_mb (`int`, *optional*, defaults to `256`): size of each candidate's scratch tmpfs,
            in MiB (when the host is root; otherwise only ``max_file_mb`` bounds each file). It
            counts against ``memory_mb`` too.
        max_files (`int`, *optional*, defaults to `10000`): inodes (files and directories) of each
            candidate's scratch tmpfs.
        max_open_files (`int`, *optional*, defaults to `256`): ``RLIMIT_NOFILE``.
        max_processes (`int`, *optional*, defaults to `64`): ``RLIMIT_NPROC`` of a candidate's
            uid: its processes and threads together (only enforced when each candidate runs as its
            own unprivileged uid, see ``drop_uid``).
        isolation (`str`, *optional*, defaults to `"auto"`): ``bwrap`` (bubblewrap namespaces;
            an error if it cannot run), ``fallback`` (no bubblewrap) or ``auto`` (bubblewrap when it
            works here, else the fallback).
        scratch_dir (`str`, *optional*): where the fallback mode creates its per-family scratch
            directory (defaults to the system temporary directory). Directories there whose host
            process is gone are removed at the next start: give hosts in different pid namespaces
            different ones.
        tool_timeout_s (`float`, *optional*, defaults to `15.0`): seconds the host waits for one
            tool call before answering the code with a ``timeout`` tool error. That is the tool's
            failure, an outage: the step is ``not_executed`` (``ToolOutage``) unless the host itself
            decided its failure (see ``codetool.executor.host.step``).
        python (`str`, *optional*, defaults to `"auto"`): interpreter of the sandbox. ``auto`` takes
            ``/usr/bin/python3`` when present (readable by an unprivileged uid), else the host's.
            The sandbox has only that interpreter's standard library and packages.
        drop_uid (`bool`, *optional*, defaults to `True`): when the host runs as root, run each
            candidate as its own fresh unprivileged uid (what keeps siblings apart, and what
            ``max_processes`` and file permissions need).
        cgroup (`bool`, *optional*, defaults to `True`): bound each candidate's memory with a
            memory cgroup where the host can create one (``codetool.executor.kernel.cgroups``); else the
            sandbox root polls it.
        grace_s (`float`, *optional*, defaults to `0.5`): seconds the threads a step started get to
            end after the step did. A thread still running then could act between steps, so the
            worker is killed and the state is lost (the step's outcome stands).
        infra_retries (`int`, *optional*, defaults to `3`): times a fork, a copy or a worker start
            that failed for a reason outside the code (a deadline on a busy host, a worker lost
            between steps, a resource the machine refused) is tried again, its deadline doubled,
            before the step is recorded as ``not_executed`` (which no reward or label counts).
        start_timeout_s (`float`, *optional*, defaults to `5.0`): seconds a fork copy may take to
            start (a fresh worker gets four times as much), not counting the time the processes
            doing it waited for a CPU (their run-queue waits, ``codetool.executor.kernel.schedstat``), up
            to ``busy_backstop`` times in all.
        busy_backstop (`float`, *optional*, defaults to `10.0`): how far a busy host may stretch a
            deadline: a step whose threads waited for a CPU gets that time back, but it is stopped
            at ``busy_backstop * timeout_s`` whatever happened; if it had not had ``timeout_s`` to
            run by then, it is ``not_executed`` (the machine's failure, not the code's).
        max_tool_calls (`int`, *optional*, defaults to `200`): tool calls one step may make. The
            call past it is not performed, and the step ends with outcome ``resource_limit``
            (``ToolLimit``), whatever the code does afterwards.
        max_step_mb (`int`, *optional*, defaults to `16`): MiB the host may hold for one step: what
            the sandbox sent it (tool arguments, answers, every frame) and what it queued for the
            sandbox and the sandbox did not read yet. Past it the step is stopped (the worker is
            killed, outcome ``resource_limit``). Each recorded call keeps a bounded preview of its
            arguments plus their SHA-256.
    """

    timeout_s: float = option(30.0, "seconds per run (tool calls and CPU waits on a busy host not counted)")
    cpu_time_s: float = option(20.0, "CPU seconds per sandbox process (RLIMIT_CPU)")
    memory_mb: int = option(1024, "MiB one step may hold in all (processes, scratch, host buffers)")
    max_output_chars: int = option(20000, "characters of output kept per run")
    max_file_mb: int = option(64, "largest file the code may write, MiB (RLIMIT_FSIZE)")
    scratch_mb: int = option(256, "size of each candidate's scratch tmpfs, MiB")
    max_files: int = option(10000, "files and directories in each candidate's scratch tmpfs")
    max_open_files: int = option(256, "open files per sandbox process (RLIMIT_NOFILE)")
    max_processes: int = option(64, "processes+threads of one executor family (RLIMIT_NPROC)")
    isolation: str = option("auto", "sandbox: bubblewrap namespaces, fallback, or auto",
                            choices=ISOLATION_MODES)
    scratch_dir: str | None = option(None, "parent of the fallback scratch directory (default: temp dir)")
    tool_timeout_s: float = option(15.0, "seconds to wait for one tool call (past it: an outage)")
    python: str = option("auto", "sandbox interpreter (auto: /usr/bin/python3 if present)")
    drop_uid: bool = option(True, "run each candidate as its own unprivileged uid when the host is root")
    cgroup: bool = option(True, "bound each candidate's memory with a cgroup where possible")
    grace_s: float = option(0.5, "seconds a step's threads get to end after it (then the state is killed)")
    infra_retries: int = option(3, "times a fork or worker start that failed outside the code is retried")
    start_timeout_s: float = option(5.0, "seconds a fork copy may take to start (more on a busy host)")
    busy_backstop: float = option(10.0, "most a busy host may stretch a deadline, as a multiple of it")
    max_tool_calls: int = option(200, "tool calls per step; past it the step fails (ToolLimit)")
    max_step_mb: int = option(16, "MiB the host may hold for one step; past it the step is stopped")

    def __post_init__(self):
        if self.isolation not in ISOLATION_MODES:
            raise ConfigError(f"executor isolation: got {self.isolation!r}; choose one of {list(ISOLATION_MODES)}.")
        for name in ("timeout_s", "cpu_time_s", "tool_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"executor {name}: got {value!r}; expected a number of seconds > 0.")
        if self.grace_s < 0:
            raise ConfigError(f"executor grace_s: got {self.grace_s!r}; expected seconds >= 0.")
        if not isinstance(self.busy_backstop, (int, float)) or self.busy_backstop < 1:
            raise ConfigError(f"executor busy_backstop: got {self.busy_backstop!r}; expected a number >= 1.")
        if not isinstance(self.infra_retries, int) or isinstance(self.infra_retries, bool) or self.infra_retries < 0:
            raise ConfigError(f"executor infra_retries: got {self.infra_retries!r}; expected an integer >= 0.")
        minimums = {"memory_mb": 128, "max_output_chars": 100, "max_file_mb": 1, "scratch_mb": 1, "max_files": 16,
                    "max_open_files": 32, "max_processes": 4, "max_tool_calls": 1, "max_step_mb": 2}
        for name, low in minimums.items():
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"executor {name}: got {value!r}; expected an integer >= {low} "
                                  f"(the sandboxed interpreter cannot work below that).")
