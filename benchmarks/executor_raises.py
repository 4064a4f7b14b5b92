"""Can a step's code make ``Executor.fork()`` or ``run()`` raise, or pass its own failure off as the machine's?

Issue 37: an executor that raised in a step (``host_error``) is recorded as the machine's failure,
which is right only if no step's code can make it raise. Each step below runs in a fork of a warm
state (as ``codetool.search.step`` runs a candidate); then the state it left is forked again and
runs ``print(x)``, and the root runs a step. Prints one line per step: the step's result, the next
step's, and any exception ``fork``/``run`` raised (``RAISED_<phase>``). A ``not_executed`` result
after a step's own doing would be the reverse fault (the code's failure left out of every rate).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/executor_raises.py [NAME ...]

About 2 minutes on 2 busy CPUs (the steps that spin or sleep wait out their 3 s deadline; the one
that shrinks its address space waits out the busy backstop, 30 s).
"""

from __future__ import annotations

import json
import sys
import time

from codetool.executor import Executor, ExecutorConfig

ATTACKS = {
 "kill_self_9": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
 "os_exit": "import os; os._exit(3)",
 "sys_exit": "import sys; sys.exit(2)",
 "raise_systemexit_base": "raise BaseException('x')",
 "kill_parent": "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
 "kill_all": "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept Exception as e:\n    print(e)",
 "memory_bomb": "x = bytearray(3 << 30)",
 "memory_grow": "x = []\nwhile True:\n    x.append(bytearray(64 << 20))",
 "close_fds": "import os; os.closerange(0, 4096)",
 "close_fds_then_print": "import os; os.closerange(0, 4096); print('after')",
 "dup2_over_fds": "import os\nfor fd in range(0, 64):\n    try:\n        os.dup2(0, fd)\n    except OSError:\n        pass",
 "write_garbage_fds": "import os\nfor fd in range(0, 128):\n    try:\n        os.write(fd, b'\\xff\\x00\\x00\\x10' + b'{' * 64)\n    except OSError:\n        pass",
 "write_frames_fds": "import os, struct, json\nb = json.dumps({'op': ['x']}).encode()\nfor fd in range(0, 128):\n    try:\n        os.write(fd, struct.pack('>I', len(b)) + b)\n    except OSError:\n        pass",
 "write_tool_frame_weird": "import os, struct, json\nfor body in [{'op':'tool','call':1,'name':'zz','args':[],'kwargs':{'':1}}, {'op':'raised','output_dropped':[1]}, {'op':'finish','answer':{'a':1}}, {'op':'tool','call':2,'name':'zz','args':[{'a':[1]*10}],'kwargs':{}}]:\n    b = json.dumps(body).encode()\n    for fd in range(3, 128):\n        try:\n            os.write(fd, struct.pack('>I', len(b)) + b)\n        except OSError:\n            pass",
 "flood_output": "print('x' * (50 << 20))",
 "flood_loop": "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
 "flood_stderr_bytes": "import os\nfor _ in range(2000):\n    os.write(2, b'\\xff\\xfe' * 32768)",
 "fork_child_spin": "import os\nif os.fork() == 0:\n    while True:\n        pass",
 "fork_many": "import os\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n            import time; time.sleep(60)\n    except OSError as e:\n        print(e); break",
 "setsid_daemon": "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        import time; time.sleep(100)\n    os._exit(0)",
 "threads_left": "import threading, time\nthreading.Thread(target=lambda: time.sleep(100), daemon=True).start()",
 "recursion": "def f(n): return f(n+1)\nf(0)",
 "deep_c_recursion": "import sys; sys.setrecursionlimit(10**8)\ndef f(n): return f(n+1)\nf(0)",
 "cpu_spin": "while True:\n    pass",
 "sleep_long": "import time; time.sleep(100)",
 "signal_self_stop": "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)",
 "rlimit_nofile_zero": "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (0, 0))",
 "rlimit_as_tiny": "import resource; resource.setrlimit(resource.RLIMIT_AS, (1<<20, 1<<20))",
 "rlimit_nproc_zero": "import resource; resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))",
 "fill_scratch": "import os\nwith open('big', 'wb') as f:\n    f.write(b'\\0' * (60 << 20))\nfor i in range(5000):\n    open(f'f{i}', 'w').close()",
 "chdir_rmdir": "import os, shutil\nd = os.getcwd()\nos.chdir('/')\nshutil.rmtree(d, ignore_errors=True)",
 "huge_finish": "finish('z' * (20 << 20))",
 "surrogates": "print('\\udcff' * 10); finish('\\ud800')",
 "nul_bytes_print": "print('\\0' * 1000)",
 "del_builtins": "import builtins\nfor k in list(vars(builtins)):\n    if k not in ('print',):\n        try: delattr(builtins, k)\n        except Exception: pass",
 "gc_freeze_sys_modules": "import sys\nsys.modules.clear()",
 "stdout_closed": "import sys; sys.stdout.close(); sys.stderr.close()",
}
HUGE = "x = 1\n#" + "a" * (20 << 20)


def attack(name: str, code: str, cfg: ExecutorConfig) -> dict:
    """The results of ``code`` in a fork of a warm state, of a fork of what it left, of the root."""
    rec: dict = {}
    root = Executor(cfg, tools={"zz": lambda **k: {"ok": 1}})
    opened = [root]
    try:
        root.run("import os\nx = 41")
        child = root.fork()
        opened.append(child)
        r = child.run(code)
        rec["run"] = [r.outcome, r.error_type, (r.error_message or "")[:100]]
        after = child.fork()
        opened.append(after)
        r = after.run("print(x)")
        rec["next"] = [r.outcome, r.error_type, (r.stdout or "")[:20]]
        r = root.run("print(x + 1)")
        rec["root"] = [r.outcome, (r.stdout or "")[:20]]
    except Exception as e:  # noqa: BLE001 - what this probe looks for
        rec["RAISED"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        for ex in reversed(opened):
            ex.close()
    return rec


def main() -> int:
    only = set(sys.argv[1:])
    cfg = ExecutorConfig(timeout_s=3, cpu_time_s=6, start_timeout_s=5)
    raised = 0
    for name, code in [*ATTACKS.items(), ("huge_code_20MiB", HUGE)]:
        if only and name not in only:
            continue
        start = time.monotonic()
        rec = attack(name, code, cfg)
        raised += "RAISED" in rec
        print(f"{name:24s} {json.dumps(rec)[:400]} ({time.monotonic() - start:.1f} s)", flush=True)
    print(f"steps that made fork() or run() raise: {raised}")
    return 1 if raised else 0


if __name__ == "__main__":
    sys.exit(main())
