"""How fast is the executor's fork, what do separate principals cost, how many tool calls does
state-by-fork save, and which isolation layers work on this machine? (codetool.executor)

1. Overhead: ``fork()`` + ``run("pass")`` + ``close()`` on a warm executor, per isolation mode,
   measured side by side with the executor of ``--compare`` (a git ref, default ``main``: its
   ``codetool`` package is extracted to a temporary folder and run from there). Rounds alternate
   between the two, each in a fresh process, and the medians (p90) of all samples are compared
   (issue 37's target: ours within 1.5x). ``poll`` is ``cgroup=False`` (the memory budget polled
   by the sandbox root, which also sweeps each principal and lets each fork's ``setresuid``
   through), what a host without a delegated memory cgroup gets. Plus the cost of starting a
   family.
2. Trajectory: 5 steps, 2 candidates per step, one tool call per candidate (a host tool that
   sleeps ``--tool-latency`` seconds, like a fast API). Ours forks the kept state for each
   candidate; the baseline is the public CodeTool approach, re-running every earlier chosen step
   in a fresh interpreter (a fresh executor) for each candidate. Expected: 10 tool calls vs 30.
3. Isolation layers: each layer probed by code that must be stopped by it, including what a
   candidate tries against a sibling (signals, ``/proc/<pid>/fd``, shared files, a full scratch,
   the process limit) and against the host's memory.

    .venv/bin/python benchmarks/bench_executor.py [--iterations 100] [--rounds 6] [--compare main] [--overhead-only]

Timings on a shared 2-core CPU are noisy: other processes delay every fork and wake-up, hence the
alternating rounds and pooled medians.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _result import emit  # benchmarks/_result.py

from codetool.executor import Executor, ExecutorConfig, bwrap_problem
from codetool.secrets import sandbox_environment

REPO = Path(__file__).resolve().parents[1]


def modes() -> list[str]:
    problem = bwrap_problem()
    if problem:
        print(f"(bubblewrap mode skipped: {problem})")
    return ["fallback"] + ([] if problem else ["bwrap"])


def ms(values: list[float], q: float = 0.5) -> str:
    values = sorted(values)
    return f"{1000 * values[min(len(values) - 1, int(q * len(values)))]:.2f}"


OVERHEAD = """
import json, sys, time
from codetool.executor import Executor, ExecutorConfig
mode, iterations, extra = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
samples = []
with Executor(ExecutorConfig(isolation=mode, **extra)) as ex:
    ex.run("import json, math\\nstate = {'x': 1}")
    for _ in range(iterations):
        t0 = time.perf_counter()
        child = ex.fork()
        assert child.run("pass").ok
        child.close()
        samples.append(time.perf_counter() - t0)
print(json.dumps(samples))
"""


def checkout(ref: str) -> Path:
    """``ref``'s ``codetool`` package in a temporary folder (for ``PYTHONPATH``)."""
    folder = Path(tempfile.mkdtemp(prefix="codetool-bench-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "codetool"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def overhead_in(package_root: Path, mode: str, iterations: int, extra: dict | None = None) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run([sys.executable, "-c", OVERHEAD, mode, str(iterations), json.dumps(extra or {})],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare_overhead(modes: list[str], ref: str, iterations: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Pooled fork+run+close samples of ``ref`` and of this tree, rounds alternating."""
    old_root = checkout(ref)
    variants = {f"{mode} {ref}": (old_root, mode, None) for mode in modes}
    variants.update({f"{mode} ours": (REPO, mode, None) for mode in modes})
    if "bwrap" in modes and os.geteuid() == 0:
        variants[f"bwrap {ref} poll"] = (old_root, "bwrap", {"cgroup": False})
        variants["bwrap ours poll"] = (REPO, "bwrap", {"cgroup": False})
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (root, mode, extra) in variants.items():
            samples[name] += overhead_in(root, mode, iterations, extra)
    return samples


def bench_overhead(mode: str, iterations: int) -> dict:
    starts = []
    for _ in range(5 if iterations else 3):
        t0 = time.perf_counter()
        Executor(ExecutorConfig(isolation=mode)).close()
        starts.append(time.perf_counter() - t0)
    total, fork, run, close = [], [], [], []
    with Executor(ExecutorConfig(isolation=mode)) as ex:
        ex.run("import json, math\nstate = {'x': 1}")
        for _ in range(iterations):
            t0 = time.perf_counter()
            child = ex.fork()
            t1 = time.perf_counter()
            assert child.run("pass").ok
            t2 = time.perf_counter()
            child.close()
            t3 = time.perf_counter()
            total.append(t3 - t0)
            fork.append(t1 - t0)
            run.append(t2 - t1)
            close.append(t3 - t2)
    return {"mode": mode, "total": total, "fork": fork, "run": run, "close": close, "start": starts}


class Api:
    """A host tool with a fixed latency that counts its calls."""

    def __init__(self, latency: float):
        self.latency = latency
        self.calls = 0

    def __call__(self, query: str):
        self.calls += 1
        time.sleep(self.latency)
        return {"query": query, "results": [query.upper()]}


def candidate_code(step: int, k: int) -> str:
    return f"r{step} = search(query='step {step} candidate {k}')\nprint(r{step}['results'][0])"


def bench_trajectory(mode: str, latency: float, steps: int = 5, k: int = 2) -> dict:
    cfg = ExecutorConfig(isolation=mode)
    api = Api(latency)
    t0 = time.perf_counter()
    state = Executor(cfg, tools={"search": api})
    for step in range(steps):
        candidates = [state.fork() for _ in range(k)]
        results = [c.run(candidate_code(step, i)) for i, c in enumerate(candidates)]
        assert all(r.ok for r in results)
        state.close()
        state = candidates[0]  # keep the first candidate, close the others
        for other in candidates[1:]:
            other.close()
    state.close()
    ours = {"calls": api.calls, "seconds": time.perf_counter() - t0}

    api = Api(latency)
    t0 = time.perf_counter()
    history: list[str] = []
    for step in range(steps):
        for i in range(k):
            with Executor(cfg, tools={"search": api}) as fresh:
                assert fresh.run("\n".join(history + [candidate_code(step, i)])).ok
        history.append(candidate_code(step, 0))
    baseline = {"calls": api.calls, "seconds": time.perf_counter() - t0}
    return {"mode": mode, "ours": ours, "baseline": baseline}


PROBES = [
    # (layer, setup config overrides, code, predicate on the result)
    ("network namespace", {}, "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
     lambda r: not r.ok),
    ("pid namespace", {}, "import os\nprint(os.path.exists('/proc/{host_pid}'))", lambda r: r.stdout == "False\n"),
    ("mount namespace (project hidden)", {}, f"open({str(REPO / 'pyproject.toml')!r})",
     lambda r: r.error_type == "FileNotFoundError"),
    ("system folders not writable", {}, "open('/usr/codetool-probe', 'w')", lambda r: not r.ok),
    ("uts namespace", {}, "import socket\nprint(socket.gethostname())", lambda r: r.stdout == "sandbox\n"),
    ("unprivileged uid", {}, "import os\nprint(os.getuid())", lambda r: r.ok and r.stdout != "0\n"),
    ("rlimit address space", {"memory_mb": 256}, "a = bytearray(400 * 2**20)", lambda r: r.error_type == "MemoryError"),
    ("rlimit CPU time", {"cpu_time_s": 1, "timeout_s": 5}, "while True:\n    pass",
     lambda r: r.error_type == "CPULimit"),
    ("rlimit file size", {"max_file_mb": 1}, "open('f.bin', 'wb').write(b'0' * 2 * 2**20)",
     lambda r: r.outcome == "resource_limit"),
    ("rlimit open files", {"max_open_files": 32}, "fs = [open('/dev/null') for _ in range(64)]",
     lambda r: r.outcome == "resource_limit"),
    ("rlimit processes", {"max_processes": 8},
     "import subprocess\nps = [subprocess.Popen(['sleep', '3']) for _ in range(16)]",
     lambda r: r.outcome == "resource_limit"),
    ("scratch size (tmpfs)", {"scratch_mb": 4}, "open('f.bin', 'wb').write(b'0' * 8 * 2**20)",
     lambda r: r.outcome == "resource_limit"),
    ("scrubbed environment", {}, "import os\nprint(' '.join(sorted(os.environ)))",
     lambda r: set(r.stdout.split()) <= set(sandbox_environment()) | {"HOME", "TMPDIR", "PWD"}),
    ("stdin is /dev/null", {}, "input()", lambda r: r.error_type == "EOFError"),
    ("wall-clock kill", {"timeout_s": 1}, "while True:\n    try:\n        pass\n    except BaseException:\n        pass",
     lambda r: r.timed_out),
    ("output cap", {"max_output_chars": 1000}, "print('x' * 10**6)", lambda r: r.output_truncated),
    ("no ctypes, or pidfd_getfd denied", {},
     "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\npfd = os.pidfd_open(os.getpid())\n"
     "print(libc.syscall(438, pfd, 0, 0), ctypes.get_errno())",
     lambda r: r.stdout == "-1 1\n" or r.error_type == "ImportError"),
    ("seccomp: AF_VSOCK denied", {}, "import socket\nsocket.socket(40, socket.SOCK_STREAM)",
     lambda r: not r.ok and "97" in (r.error_message or "")),
    ("seccomp: SysV shm and memfd denied", {}, "import os\nos.memfd_create('x')",
     lambda r: r.outcome == "sandbox_violation"),
    ("tool-call budget (max_tool_calls)", {"max_tool_calls": 5},
     "while True:\n    search(query='x')", lambda r: r.error_type == "ToolLimit"),
    ("verdict out of reach (classifier swapped)", {},
     "import sys\nfor m in list(sys.modules.values()):\n    for k in ('classify', 'kind_of'):\n"
     "        if k in getattr(m, '__dict__', {}):\n            m.__dict__[k] = lambda *a, **kw: 'ok'\n"
     "finish.__globals__['classify'] = lambda e: 'ok'\nraise ValueError('forged?')",
     lambda r: r.outcome == "runtime_error"),
    ("verdict out of reach (host's timeout line)", {},
     "class Timeout(BaseException):\n    pass\nraise Timeout('the step ran longer than 30 s and was stopped')",
     lambda r: r.outcome == "runtime_error"),
]


def bench_layers(mode: str) -> dict[str, str]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    found = {}
    try:
        for layer, overrides, code, works in PROBES:
            cfg = ExecutorConfig(isolation=mode, **{"timeout_s": 5, **overrides})
            with Executor(cfg, tools={"search": Api(0.0)}) as ex:
                r = ex.run(code.replace("{port}", str(port)).replace("{host_pid}", str(os.getpid())))
                found[layer] = "yes" if works(r) else "no"
    finally:
        listener.close()
    return found


SIBLING_PROBES = [
    # (what a candidate tries against a sibling, the attack, the sibling's check, expected output)
    ("signal every process it can", "import os, signal\nos.kill(-1, signal.SIGKILL)", "print('alive')", "alive\n"),
    ("leave a module for python -c", "open('json.py', 'w').write('raise SystemExit(3)')",
     "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'import json']).returncode)", "0\n"),
    ("fill its scratch", "open('fill.bin', 'wb').write(b'0' * (30 << 20))",
     "open('mine.txt', 'w').write('x' * 1000)\nprint('written')", "written\n"),
    ("hold the process limit", "import os, time\nfor _ in range(40):\n    try:\n        pid = os.fork()\n"
     "    except OSError:\n        break\n    if pid == 0:\n        os.setsid()\n        time.sleep(30)\n"
     "        os._exit(0)", "import subprocess\nprint(subprocess.run(['true']).returncode)", "0\n"),
    ("list or write the sibling's scratch", "import os\ntry:\n    print(os.listdir({sibling!r}))\n"
     "    open({sibling!r} + '/planted.py', 'w')\nexcept OSError as e:\n    print('denied', e.errno)",
     "import os\nprint(os.listdir('.'))", "[]\n"),
]


def bench_siblings(mode: str) -> dict[str, str]:
    """Each attack runs in one candidate, then its sibling (forked from the same state) runs."""
    found = {}
    cfg = ExecutorConfig(isolation=mode, timeout_s=5, scratch_mb=32, max_processes=24)
    with Executor(cfg) as root:
        root.run("kept = 1")
        for name, attack, check, expected in SIBLING_PROBES:
            attacker, sibling = root.fork(), root.fork()
            try:
                r = attacker.run(attack.replace("{sibling!r}", repr(sibling._slot.worker.scratch)))
                leaked = name.startswith("list or write") and "denied" not in r.stdout
                checked = sibling.run(check + "\nassert kept == 1")
                found[name] = "held" if (checked.stdout == expected and not checked.state_lost and not leaked) \
                    else "BROKEN"
            finally:
                attacker.close()
                sibling.close()
    return found


MEMORY_ATTACKS = [
    # (attack, code): each run with the default limits (memory_mb 1024)
    ("8 children of 300 MiB", "import subprocess, sys, time\n"
     "code = 'import time\\nb = bytearray(300 << 20)\\nfor i in range(0, len(b), 4096):\\n    b[i] = 1\\ntime.sleep(30)'\n"
     "ps = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(8)]\ntime.sleep(8)"),
    ("scratch 180 MiB + 900 MiB", "for i in range(3):\n    open(f'f{i}.bin', 'wb').write(b'1' * (60 << 20))\n"
     "b = bytearray(900 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1"),
    ("200,000 empty files", "for i in range(200_000):\n    open(f'e{i}', 'w').close()"),
    ("2,000,000 file locks", "import fcntl\nf = open('locks', 'w')\n"
     "for i in range(2_000_000):\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)"),
    ("24 processes x 30,000 mappings", "import mmap, os, time\n"
     "def split():\n    flags, rw = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, mmap.PROT_READ | mmap.PROT_WRITE\n"
     "    kept = [mmap.mmap(-1, 4096, flags=flags, prot=rw if i % 2 else mmap.PROT_READ) for i in range(30_000)]\n"
     "    time.sleep(30)\n"
     "for _ in range(24):\n    if os.fork() == 0:\n        split()\n        os._exit(0)\ntime.sleep(8)"),
]


def _available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))


def _sample(low: list[int], stop) -> None:
    while not stop.is_set():
        low[0] = min(low[0], _available())
        time.sleep(0.01)


def _host_peak() -> str | None:
    """The ``memory.max_usage_in_bytes`` of this process's own memory cgroup (v1), which holds the
    host and every sandbox it starts: what this benchmark's process family adds, whatever the
    other processes of the machine do."""
    from codetool.executor.kernel.cgroups import memory_base

    found = memory_base()
    if found is None or found[1] != 1:
        return None
    path = os.path.join(found[0], "memory.max_usage_in_bytes")
    return path if os.access(path, os.W_OK) else None


def bench_memory(mode: str, cgroup: bool) -> dict[str, tuple[str, float, float]]:
    """Each attack: ``(outcome, MiB the host's process family grew by at its peak, the candidate
    cgroup's peak in MiB or nan)``. The growth is read from this process's own memory cgroup
    where there is one (precise), else from the machine's MemAvailable (which moves with the
    other processes of the machine too)."""
    import threading

    found = {}
    peak_file = _host_peak()
    cfg = ExecutorConfig(isolation=mode, timeout_s=20, cpu_time_s=20, cgroup=cgroup)
    with Executor(cfg) as root:
        for name, code in MEMORY_ATTACKS:
            ex = root.fork()
            base, low, stop = _available(), [_available()], threading.Event()
            if peak_file:
                usage = os.path.join(os.path.dirname(peak_file), "memory.usage_in_bytes")
                with open(peak_file, "w") as f:
                    f.write("0")
                with open(usage) as f:
                    base = int(f.read())
            sampler = threading.Thread(target=_sample, args=(low, stop))
            sampler.start()
            r = ex.run(code)
            stop.set()
            sampler.join()
            if peak_file:
                with open(peak_file) as f:
                    low = [base - (int(f.read()) - base)]
            peak = float("nan")
            host = ex._sandbox._host
            if host is not None and ex._slot.worker is not None:
                try:
                    with open(os.path.join(host.cgroup_of(ex._slot.worker.key), "memory.max_usage_in_bytes")) as f:
                        peak = int(f.read()) / 2**20
                except OSError:
                    pass
            found[name] = (r.error_type or r.outcome, (base - low[0]) / 2**20, peak)
            ex.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=100, help="fork+run+close repetitions per round")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds per variant")
    parser.add_argument("--compare", default="main", help="git ref whose executor is measured side by side")
    parser.add_argument("--overhead-only", action="store_true", help="measure only 1. (fork + run + close)")
    parser.add_argument("--tool-latency", type=float, default=0.05, help="seconds each tool call sleeps")
    args = parser.parse_args()
    available = modes()
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} (other processes share the CPU)\n")

    print(f"1. fork() + run('pass') + close(), ms: {args.rounds} alternating rounds x {args.iterations}, "
          f"pooled (ours vs {args.compare})")
    samples = compare_overhead(available, args.compare, args.iterations, args.rounds)
    print(f"{'variant':<22} {'median':>8} {'p90':>8} {'vs ' + args.compare:>10}")
    ratios = {}
    for name, values in samples.items():
        mode, poll = name.split()[0], " poll" if name.endswith(" poll") else ""
        base = sorted(samples[f"{mode} {args.compare}{poll}"])
        ratio = sorted(values)[len(values) // 2] / base[len(base) // 2]
        ratios[name] = ratio
        print(f"{name:<22} {ms(values):>8} {ms(values, 0.9):>8} {ratio:>9.2f}x")
    starts = {mode: bench_overhead(mode, 0)["start"] for mode in available}
    print("new family (Executor()):", ", ".join(f"{m} {ms(v)} ms" for m, v in starts.items()))
    if args.overhead_only:
        return

    print(f"\n2. 5 steps x 2 candidates x 1 tool call ({args.tool_latency * 1000:.0f} ms each)")
    print(f"{'mode':<10} {'approach':<22} {'tool calls':>10} {'wall s':>8}")
    for mode in available:
        t = bench_trajectory(mode, args.tool_latency)
        for name, key in (("fork (ours)", "ours"), ("re-execution baseline", "baseline")):
            print(f"{mode:<10} {name:<22} {t[key]['calls']:>10} {t[key]['seconds']:>8.2f}")

    print("\n3. isolation layers that work here (each probed by code it must stop)")
    layers = {mode: bench_layers(mode) for mode in available}
    print(f"{'layer':<44} " + " ".join(f"{m:>9}" for m in available))
    for layer, *_ in PROBES:
        print(f"{layer:<44} " + " ".join(f"{layers[m][layer]:>9}" for m in available))
    print("\n   a candidate against its sibling (forked from the same state)")
    siblings = {mode: bench_siblings(mode) for mode in available}
    for name, *_ in SIBLING_PROBES:
        print(f"{name:<44} " + " ".join(f"{siblings[m][name]:>9}" for m in available))
    with Executor(ExecutorConfig(isolation=available[-1])) as ex:
        print(f"\nactive isolation ({available[-1]}): {ex.isolation}")

    print("\n4. host memory held by one step under attack, default limits (memory_mb 1024), MiB")
    print("   (growth: of this process's memory cgroup where it has one, else of the machine's MemAvailable)")
    print(f"{'attack':<32} {'variant':<12} {'outcome':<16} {'host growth':>12} {'candidate peak':>15}")
    worst = 0.0
    for variant, cgroup in (("cgroup", True), ("poll", False)):
        if variant == "cgroup" and os.geteuid() != 0:
            continue
        for name, (outcome, drop, peak) in bench_memory(available[-1], cgroup).items():
            worst = max(worst, drop)
            print(f"{name:<32} {variant:<12} {outcome:<16} {drop:>12.0f} {peak:>15.0f}")
    mode = available[-1]
    ours = sorted(samples[f"{mode} ours"])
    base = sorted(samples[f"{mode} {args.compare}"])
    emit(mode=mode, fork_run_close_ms=ours[len(ours) // 2] * 1e3, compared_ms=base[len(base) // 2] * 1e3,
         ratio=ratios[f"{mode} ours"], tool_calls=t["ours"]["calls"], baseline_tool_calls=t["baseline"]["calls"],
         seconds=t["ours"]["seconds"], baseline_seconds=t["baseline"]["seconds"],
         siblings_held=sum(v == "held" for v in siblings[mode].values()), siblings_probed=len(SIBLING_PROBES),
         worst_host_growth_mb=worst)


if __name__ == "__main__":
    main()
