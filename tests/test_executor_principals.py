"""Issue 27's findings, one test each: siblings are separate principals, the host is bounded for a
step, a poisoned state costs one candidate, forks fail fast, and the cheap forging routes of the
last round are closed.

The code plays the attacker (it has read the source). Tests that need a uid per candidate skip
where the host is not root (``principals`` missing from ``Executor.isolation``).
"""

from __future__ import annotations

import threading
import time

import pytest

from codetool.executor import Executor, ExecutorConfig
from tests.conftest import kept_state_root, need

CONFIG = dict(timeout_s=4.0, grace_s=0.5, memory_mb=512, max_processes=24, max_output_chars=5000,
              scratch_mb=16, max_step_mb=4)



@pytest.fixture(scope="module")
def root(mode):
    yield from kept_state_root(mode, CONFIG, tools={"lookup": lambda city: {"city": city}})


def pair(root: Executor) -> tuple[Executor, Executor]:
    return root.fork(), root.fork()


# A thread that outlives its step and, for two seconds, signals every process it can see.
SIGNALLER = ("import os, signal, threading, time\n"
             "def hit():\n"
             "    end = time.time() + 2\n"
             "    while time.time() < end:\n"
             "        for p in [int(x) for x in os.listdir('/proc') if x.isdigit()]:\n"
             "            if p != os.getpid():\n"
             "                try:\n                    os.kill(p, signal.SIGALRM)\n"
             "                except OSError:\n                    pass\n"
             "        time.sleep(0.005)\n"
             "threading.Thread(target=hit, daemon=True).start()\n")


# ------------------------------------------------------------------- siblings are principals
def test_a_thread_left_by_one_candidate_cannot_time_out_its_sibling(root):
    need(root, "uid")
    attacker, sibling = pair(root)
    try:
        assert attacker.run(SIGNALLER).ok
        r = sibling.run("import time\ntime.sleep(0.05)\nprint(kept)")
        assert r.ok and r.stdout == "state\n" and not r.state_lost, r  # ok: no forged timeout (timeout_s is 4)
    finally:
        attacker.close()
        sibling.close()


def test_children_a_candidate_keeps_cannot_take_its_siblings_process_limit(root):
    need(root, "nproc")
    attacker = root.fork()
    try:
        attacker.run("import subprocess\nps = []\nwhile len(ps) < 100:\n    try:\n"
                     "        ps.append(subprocess.Popen(['sleep', '30']))\n    except OSError:\n        break")
        sibling = root.fork()  # forks and keeps the state: the process limit is per candidate
        r = sibling.run("print(kept)")
        assert r.ok and r.stdout == "state\n" and not r.state_lost, r
        sibling.close()
    finally:
        attacker.close()


def test_a_sibling_cannot_rewrite_the_output_of_a_candidates_program(root):
    need(root, "uid")
    attacker, victim = pair(root)
    results = {}

    def honest():
        results["victim"] = victim.run(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(1.0); print(\"honest\")'])")

    thread = threading.Thread(target=honest)
    thread.start()
    time.sleep(0.3)
    forged = attacker.run(  # writes into every fd 1 and every memory it can open in /proc
        "import os\nhits = 0\n"
        "for p in [x for x in os.listdir('/proc') if x.isdigit() and int(x) != os.getpid()]:\n"
        "    for what in ('fd/1', 'fd/2'):\n"
        "        try:\n"
        "            with open(f'/proc/{p}/{what}', 'w') as f:\n"
        "                f.write('forged\\n')\n"
        "            hits += 1\n"
        "        except OSError:\n            pass\n"
        "    try:\n        open(f'/proc/{p}/mem', 'rb+')\n        hits += 1\n"
        "    except OSError:\n        pass\n"
        "print(hits)")
    thread.join()
    try:
        assert forged.ok and forged.stdout == "0\n", forged
        assert results["victim"].ok and results["victim"].stdout == "honest\n", results["victim"]
    finally:
        attacker.close()
        victim.close()


def test_a_file_a_candidate_leaves_is_not_imported_by_its_sibling(root):
    need(root, "uid")
    attacker, sibling = pair(root)
    try:
        # in its own working directory (which was the shared scratch, /tmp in bubblewrap, before)
        attacker.run("open('json.py', 'w').write('raise SystemExit(3)')")
        r = sibling.run("import subprocess, sys\n"
                        "print(subprocess.run([sys.executable, '-c', 'import json']).returncode)")
        assert r.stdout == "0\n", r
    finally:
        attacker.close()
        sibling.close()


def test_a_full_scratch_costs_only_its_candidate(root):
    need(root, "uid")
    attacker, sibling = pair(root)
    try:
        r = attacker.run("f = open('fill.bin', 'wb')\nwhile True:\n    f.write(b'0' * (1 << 20))\n    f.flush()")
        assert r.outcome == "resource_limit", r  # its own tmpfs is full (or its file size limit)
        r = sibling.run("open('mine.bin', 'wb').write(b'0' * (4 << 20))\nprint('written')")
        assert r.ok and r.stdout == "written\n", r
    finally:
        attacker.close()
        sibling.close()


def test_a_fork_gets_a_copy_of_the_files_and_open_files_of_its_state(root):
    parent = root.fork()
    try:
        parent.run("open('notes.txt', 'w').write('abc')\nf = open('notes.txt')\nf.read(1)\nimport os\nos.mkdir('sub')")
        a, b = parent.fork(), parent.fork()
        ra = a.run("print(f.read(1))\nopen('notes.txt', 'w').write('changed by a')\nopen('sub/a', 'w').close()")
        rb = b.run("print(f.read(), open('notes.txt').read(), os.listdir('sub'))")
        assert ra.stdout == "b\n" and rb.stdout == "bc abc []\n", (ra, rb)  # offsets and files not shared
        for ex in (a, b):
            ex.close()
    finally:
        parent.close()


# ------------------------------------------------------------------------ the host is bounded
CHANNEL = ("import gc\n"
           "chan = next(o for o in gc.get_objects() if type(o).__name__ == 'Channel' and o.sock.fileno() >= 0)\n")


def test_tool_frames_with_huge_call_ids_stop_the_step(root):
    grab = (CHANNEL + "for _ in range(64):\n"
            "    chan.send({'op': 'tool', 'call': 'x' * (1 << 20), 'name': 'lookup', 'args': [], 'kwargs': {}})\n"
            "import time\ntime.sleep(30)")
    ex = root.fork()
    try:
        r = ex.run(grab)
        assert r.outcome == "sandbox_violation", r  # stopped at once: left alone, the sleep would time out
    finally:
        ex.close()


def test_results_the_step_never_reads_count_against_its_budget(mode, monkeypatch):
    from codetool.executor.host import step as step_module

    peak = [0]
    held = step_module.StepLedger.held

    def watched(self, conn, output):
        value = held(self, conn, output)
        peak[0] = max(peak[0], value)
        return value

    monkeypatch.setattr(step_module.StepLedger, "held", watched)
    tools = {"big": lambda: {"blob": "x" * 500_000}}
    with Executor(ExecutorConfig(isolation=mode, **CONFIG), tools=tools) as ex:
        r = ex.run(CHANNEL + "for i in range(1000):\n"
                   "    chan.send({'op': 'tool', 'call': i, 'name': 'big', 'args': [], 'kwargs': {}})\n"
                   "import time\ntime.sleep(10)")
        # what the host queued and the step did not read stays under max_step_mb (4 MiB here): an
        # answer that would not fit is refused, and the step ends at a budget (bytes or calls), not at
        # its timeout (no wall-clock bound here: the suite runs on loaded machines)
        assert r.outcome == "resource_limit" and r.error_type in ("StepLimit", "ToolLimit"), r
        assert 0 < peak[0] <= (CONFIG["max_step_mb"] << 20) + 600_000, peak


@pytest.mark.parametrize("cgroup", [pytest.param(True, marks=pytest.mark.slow), False], ids=["cgroup", "poll"])
def test_memory_is_bounded_for_the_whole_family_of_a_candidate(mode, cgroup):
    cfg = ExecutorConfig(isolation=mode, **{**CONFIG, "memory_mb": 320, "timeout_s": 10.0}, cgroup=cgroup)
    with Executor(cfg) as ex:
        need(ex, "uid")
        if cgroup:
            need(ex, "cgroup")
        # four children of 200 MiB each: every one within RLIMIT_AS, together well past the budget
        r = ex.run("import subprocess, sys\n"
                   "code = 'import time\\nb = bytearray(200 << 20)\\nfor i in range(0, len(b), 4096):\\n"
                   "    b[i] = 1\\ntime.sleep(20)'\n"
                   "ps = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(4)]\n"
                   "import time\ntime.sleep(2)\nprint([p.poll() for p in ps])")
        assert r.outcome == "resource_limit" and r.error_type == "MemoryLimit", r
        assert ex.run("print('alive')").stdout == "alive\n"


def test_the_number_of_files_is_bounded(mode):
    with Executor(ExecutorConfig(isolation=mode, **CONFIG, max_files=200)) as ex:
        need(ex, "uid")
        r = ex.run("for i in range(5000):\n    open(f'f{i}', 'w').close()")
        assert r.outcome == "resource_limit" and "No space left" in r.error_message, r


# ----------------------------------------------------------- a state cannot break its own forks
POISON = ("import json, time, os\n_dumps = json.dumps\n"
          "json.dumps = lambda obj, *a, **k: '{not json'\njson.loads = lambda *a, **k: time.sleep(30)\n"
          "os.register_at_fork(after_in_child=lambda: time.sleep(30))\n")


def test_a_state_that_poisons_the_standard_library_still_forks_and_runs(root):
    """The keeper forks and reports with C functions bound at boot: patching ``json`` (the old
    worker's protocol) or planting a fork hook (disabled) changes nothing of the protocol."""
    poisoned = root.fork()
    try:
        assert poisoned.run(POISON).ok
        child = poisoned.fork()
        r = child.run("print(kept)")
        assert r.ok and r.stdout == "state\n" and not r.state_lost, r
        _ = child.run("raise KeyError('still honest')")
        assert not _.ok and _.error_type == "KeyError", _
        child.close()
        assert poisoned.run("print('x')").ok
    finally:
        poisoned.close()


def test_a_fork_of_a_dead_state_is_not_executed_without_raising(root):
    doomed = root.fork()
    try:
        assert doomed.run("x = 1").ok
        doomed._slot.worker.ctl.close()  # the machine loses the worker (its keeper's channel is gone)
        child = doomed.fork()  # does not raise in the host
        r = child.run("print('never runs')")
        assert r.outcome == "not_executed" and not r.executed and r.state_lost, r
        assert child.run("print('fresh')").stdout == "fresh\n"  # then it goes on from a fresh state
        child.close()
        sibling = root.fork()
        assert sibling.run("print(kept)").stdout == "state\n"
        sibling.close()
    finally:
        doomed.close()


# ------------------------------------------------------------------- cheap forging routes closed
def test_an_audit_hook_cannot_forge_later_steps(root):
    ex = root.fork()
    try:
        r = ex.run("import sys\n"
                   "end = None\n"
                   "try:\n    finish('x')\nexcept BaseException as e:\n    end = type(e)\n"
                   "def hook(event, args):\n"
                   "    if event == 'exec':\n        raise end()\n"
                   "sys.addaudithook(hook)")
        assert r.ok
        r = ex.run("undefined_name")
        assert r.outcome == "runtime_error" and r.error_type == "NameError", r
    finally:
        ex.close()


def test_the_workers_modules_are_not_importable_and_builtins_reset_each_step(root):
    ex = root.fork()
    try:
        r = ex.run("import sys\nprint([m for m in sys.modules if m.startswith('sandbox_')])")
        assert r.stdout == "[]\n", r
        ex.run("import builtins\nglobals()['__builtins__'] = type('B', (dict,), {'__missing__': lambda s, k: 0})("
               "vars(builtins))")
        r = ex.run("undefined_name")
        assert r.error_type == "NameError", r
        ex.run("import sys\nsys.settrace(lambda *a: None)")
        assert ex.run("import sys\nprint(sys.gettrace())").stdout == "None\n"
        ex.run("import builtins\nbuiltins.exec = lambda *a, **k: None")  # later steps would run nothing
        assert ex.run("undefined_name").error_type == "NameError"
    finally:
        ex.close()


def test_a_step_that_catches_its_timeout_is_still_a_timeout(root):
    ex = root.fork()
    try:
        r = ex.run("import time\ntry:\n    time.sleep(5)\nexcept BaseException:\n    pass\nprint('survived')",
                   timeout_s=0.5)
        assert r.outcome == "timeout" and r.state_lost, r  # the worker is killed: nothing to catch
    finally:
        ex.close()


def test_program_output_is_cleaned_of_terminal_control_sequences(root):
    ex = root.fork()
    try:
        r = ex.run("print('a\\x1b[31mred\\x1b[0m b\\rhidden\\x1b]0;title\\x07 \\u202eevil')")
        assert r.stdout == "ared b\nhidden evil\n", r
    finally:
        ex.close()


def test_a_candidate_cannot_become_its_sibling(root):
    """A worker keeps CAP_SETUID for its copies' one switch; every other ``setresuid`` (to a
    sibling's uid, or back) is refused by the host or the root, and without ctypes the step cannot
    install a seccomp listener of its own to let its own call through."""
    need(root, "principals")
    attacker, sibling = pair(root)
    try:
        uid = sibling._slot.worker.uid
        r = attacker.run(f"import os\ntry:\n    os.setresuid({uid}, {uid}, {uid})\nexcept OSError as e:\n"
                         "    print('refused', e.errno)\nprint(os.getuid() != " + str(uid) + ")")
        assert r.stdout == "refused 1\nTrue\n", r
        assert sibling.run("print(kept)").stdout == "state\n"
    finally:
        attacker.close()
        sibling.close()
