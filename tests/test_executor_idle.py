"""Issue 37: candidates cannot act while idle and leave nothing behind. Between steps no code of a
candidate runs (no timer, handler, thread or child of it survives its step), a candidate's files
cost what their blocks say and are charged to it, and a big scratch delays only its own forks.
Each test failed on the code before the keeper.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from codetool.executor import Executor, ExecutorConfig
from tests.conftest import kept_state_root, need

CONFIG = dict(timeout_s=5.0, grace_s=0.3, memory_mb=512, max_processes=24, scratch_mb=128)


@pytest.fixture(scope="module")
def root(mode):
    yield from kept_state_root(mode, CONFIG)


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            status = Path(f"/proc/{entry}/status").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and fields.get("State", "").split()[:1] != ["Z"]:
            found.append(int(entry))
    return found


# The attack: a timer whose handler, between steps, starts detached spinners (which would
# starve a sibling), and keeps doing so.
TIMER_SPINNERS = ("import os, signal, subprocess\n"
                  "def spin(*a):\n"
                  "    subprocess.Popen(['sh', '-c', 'while :; do :; done'], start_new_session=True)\n"
                  "for install in (lambda: signal.signal(signal.SIGALRM, spin),\n"
                  "                lambda: signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2),\n"
                  "                lambda: signal.setitimer(signal.ITIMER_VIRTUAL, 0.01, 0.01)):\n"
                  "    try:\n        install()\n    except BaseException:\n        pass")


def test_an_idle_candidate_runs_nothing_and_keeps_nothing_running(root):
    need(root, "principals")
    ex = root.fork()
    try:
        ex.run(TIMER_SPINNERS)
        uid = ex._slot.worker.uid
        time.sleep(0.8)  # idle: its timers, had they survived, would have fired several times
        assert _processes_of(uid) == [ex._slot.worker.pid]  # its worker, and nothing else
        r = ex.run("print(kept)")  # and its state is there (no SIGALRM ended it either)
        assert r.ok and r.stdout == "state\n" and not r.state_lost, r
    finally:
        ex.close()


def test_sparse_files_stay_sparse_in_a_fork(root):
    ex = root.fork()
    try:
        assert ex.run("for i in range(4):\n    with open(f'sparse{i}.bin', 'wb') as f:\n        f.truncate(64 << 20)").ok
        child = ex.fork()
        try:
            r = child.run("import os\nprint(sum(os.stat(f'sparse{i}.bin').st_blocks for i in range(4)), "
                          "os.path.getsize('sparse0.bin') >> 20)")
            assert r.ok and r.stdout == "0 64\n", r  # 256 MiB of holes cost no memory in the copy
        finally:
            child.close()
    finally:
        ex.close()


def test_a_forks_files_are_charged_to_the_fork(mode):
    with Executor(ExecutorConfig(isolation=mode, **CONFIG)) as ex:
        need(ex, "cgroup")
        assert ex.run("open('dense.bin', 'wb').write(b'1' * (32 << 20))").ok
        child = ex.fork()
        try:
            host = ex._sandbox._host
            usage = Path(host.cgroup_of(child._slot.worker.key), "memory.usage_in_bytes").read_text()
            assert int(usage) >= 32 << 20, usage  # the copy's 32 MiB file counts against the copy
        finally:
            child.close()


def test_a_big_scratch_delays_only_its_own_fork(mode):
    cfg = ExecutorConfig(isolation=mode, **{**CONFIG, "max_files": 12000, "start_timeout_s": 30.0})
    with Executor(cfg) as ex:
        need(ex, "principals")
        big = ex.fork()
        assert big.run("import os\nos.mkdir('d')\nfor i in range(9900):\n    open(f'd/f{i}', 'w').close()").ok
        honest = ex.fork()
        honest.run("x = 1")
        done = {}

        def fork_big():
            child = big.fork()
            done["big"] = child.run("import os\nprint(len(os.listdir('d')))")
            child.close()

        thread = threading.Thread(target=fork_big)
        thread.start()
        copies = [honest.fork() for _ in range(3)]  # while the big scratch is being copied
        results = [c.run("print(x)") for c in copies]
        thread.join()
        for c in copies:
            c.close()
        assert all(r.ok and r.stdout == "1\n" and r.attempts == 1 for r in results), results
        assert done["big"].ok and done["big"].stdout == "9900\n", done["big"]
        big.close()
        honest.close()
