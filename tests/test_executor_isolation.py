"""docs/DESIGN.md §5 threats and the isolation layers, in both modes.

Tests that need a layer the active isolation lacks (e.g. a mount namespace in the fallback mode,
or a uid drop when the tests do not run as root) skip and say which layer is missing; the layers
actually active are read from ``Executor.isolation``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codetool.executor import Executor, ExecutorConfig
from tests.conftest import need

REPO = Path(__file__).resolve().parents[1]
CONFIG = dict(timeout_s=2.0, grace_s=0.5, memory_mb=512, max_file_mb=8, max_open_files=64,
              max_processes=24, max_output_chars=5000, scratch_mb=32)



@pytest.fixture(scope="module")
def root(mode):
    ex = Executor(ExecutorConfig(isolation=mode, **CONFIG))
    yield ex
    ex.close()


@pytest.fixture
def ex(root):
    child = root.fork()
    yield child
    child.close()


def need_protection(ex: Executor) -> None:
    """Skip where nothing separates the code from the host user (fallback, host not root)."""
    if "bwrap" not in ex.isolation and "uid" not in ex.isolation:
        pytest.skip(f"the code runs as the host user without namespaces ({ex.isolation})")


def uid_processes(uid: int, zombies: bool = False) -> list[tuple[int, str]]:
    """(pid, state) of every host process whose real uid is ``uid`` (zombies only if asked: a
    killed child stays one until its parent, the worker, reaps it at its next run or fork)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("Uid", "").split()[:1] == [str(uid)] and (zombies or fields["State"].split()[0] != "Z"):
                found.append((int(entry), fields["State"].split()[0]))
    return found


def settle(predicate, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.02)
    return predicate()


# -------------------------------------------------------------------------- secrets and files
def test_no_host_environment_anywhere(ex, canary_env):
    need_protection(ex)
    # A host process whose *exec* environment holds the canary (os.environ changes made at run time
    # never show in /proc/<pid>/environ, so plant it in a real one).
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**os.environ, "OPENAI_API_KEY": canary_env})
    try:
        code = (
            "import os\nleaks, readable = [], 0\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self']:\n"
            "    try:\n        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
            "    except OSError:\n        continue\n"
            "    readable += 1\n"
            "    if b'KEY' in data or b'TOKEN' in data or b'sk-canary' in data:\n        leaks.append(pid)\n"
            f"print(leaks, {holder.pid} in [int(p) for p in os.listdir('/proc') if p.isdigit()] and 'seen', "
            "sorted(k for k in os.environ if 'KEY' in k))"
        )
        r = ex.run(code)
        assert r.ok, r
        assert r.stdout.startswith("[] ") and r.stdout.endswith(" []\n") and canary_env not in r.stdout
    finally:
        holder.kill()
        holder.wait()


def test_home_and_project_files_are_out_of_reach(ex):
    need_protection(ex)
    r = ex.run("import os\nprint(os.path.expanduser('~'), os.getcwd())")
    assert r.ok and "/root" not in r.stdout
    r = ex.run("print(sorted(os.listdir('/root')))")
    assert not r.ok and r.error_type in ("FileNotFoundError", "PermissionError"), r
    r = ex.run("import codetool")
    assert r.error_type == "ModuleNotFoundError"
    need(ex, "bwrap")  # below: what only a mount namespace hides (world-readable host files)
    for path in (REPO / "pyproject.toml", REPO / "codetool" / "secrets.py", Path("/etc/hostname")):
        r = ex.run(f"open({str(path)!r}).read()")
        assert r.error_type == "FileNotFoundError", (path, r)
    r = ex.run(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nimport codetool.tools.backends")
    assert r.error_type == "ModuleNotFoundError"


def test_writes_stay_in_the_scratch_directory(ex):
    r = ex.run("open('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read())")
    assert r.ok and r.stdout == "ok\n"
    need_protection(ex)
    for target in ("/usr/lib/codetool-x", str(REPO / "codetool-x"), "/etc/codetool-x"):
        r = ex.run(f"open({target!r}, 'w').write('x')")
        # not permitted, or (bubblewrap) the folder does not exist in the sandbox at all
        assert r.error_type in ("PermissionError", "OSError", "FileNotFoundError"), (target, r)
        assert not Path(target).exists()


def test_attribute_tricks_give_nothing_more(ex, canary_env):
    code = ("walk = ().__class__.__base__.__subclasses__()\n"
            "wrap = [c for c in walk if c.__name__ == '_wrap_close'][0]\n"
            "g = wrap.__init__.__globals__\n"
            "print(sorted(k for k in g['environ'] if 'KEY' in k), g['getuid']())")
    r = ex.run(code)
    assert r.ok and r.stdout.startswith("[] ") and canary_env not in r.stdout
    if "uid" in ex.isolation:
        assert r.stdout.split()[-1] != "0"


def test_shell_runs_unprivileged_and_sees_no_secrets(ex, canary_env):
    r = ex.run("import subprocess\nout = subprocess.run(['sh', '-c', 'id -u; env'], capture_output=True, text=True)\n"
               "print(out.stdout)")
    assert r.ok and canary_env not in r.stdout and "KEY" not in r.stdout
    if "uid" in ex.isolation:
        assert r.stdout.split()[0] != "0"


def test_no_network(ex):
    need(ex, "net")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        r = ex.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert not r.ok, r
        r = ex.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
        assert not r.ok and r.outcome == "sandbox_violation", r
    finally:
        listener.close()


# ----------------------------------------------------------------------------------- limits
def test_each_rlimit_is_enforced(ex):
    assert ex.run("a = bytearray(600 * 2**20)").error_type == "MemoryError"
    r = ex.run("f = open('big.bin', 'wb')\nfor _ in range(20):\n    f.write(b'0' * 2**20)\n    f.flush()")
    assert r.outcome == "resource_limit" and "File too large" in r.error_message, r
    r = ex.run("files = [open('/dev/null') for _ in range(100)]")
    assert r.outcome == "resource_limit" and "Too many open files" in r.error_message, r
    ex.run("for f in files:\n    f.close()\ndel files")
    if "nproc" in ex.isolation:
        r = ex.run("import subprocess\nps = []\nfor _ in range(40):\n"
                   "    ps.append(subprocess.Popen(['sleep', '5']))")
        assert r.outcome == "resource_limit", r
        copy = ex.fork()  # the step's processes died with it: the copy has the state and room
        first = copy.run("print('ps' in globals())")
        assert first.stdout == "True\n" and not first.state_lost, first
        copy.close()
        ex.run("for p in ps:\n    p.kill()\n    p.wait()")
    if "bwrap" in ex.isolation:  # the scratch tmpfs has a size (scratch_mb)
        r = ex.run("for i in range(8):\n    open(f'part{i}.bin', 'wb').write(b'0' * 7 * 2**20)")
        assert r.outcome == "resource_limit" and "No space left" in r.error_message, r
        ex.run("import glob, os\nfor p in glob.glob('*.bin'):\n    os.remove(p)")


def test_the_cpu_limit_stops_a_step(mode):
    with Executor(ExecutorConfig(isolation=mode, cpu_time_s=1, timeout_s=20)) as ex:
        ex.run("kept = 7")
        r = ex.run("while True:\n    pass")
        assert r.outcome == "resource_limit" and r.error_type == "CPULimit" and r.state_lost, r  # not the timeout
        after = ex.run("print('kept' in globals())")  # its worker was killed; a fresh one runs the next step
        assert after.ok and after.stdout == "False\n" and not after.state_lost


def test_a_worker_near_its_cpu_limit_is_refreshed_with_its_state(mode):
    with Executor(ExecutorConfig(isolation=mode, cpu_time_s=2, timeout_s=20)) as ex:
        ex.run("kept = 7")
        r = ex.run("import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end:\n    pass")
        assert r.ok, r
        after = ex.run("print(kept)")  # the worker was refreshed by a fork: counters at zero
        assert after.ok and after.stdout == "7\n" and not after.state_lost


def test_hard_kill_loses_state_and_recovers(ex):
    ex.run("kept = 1")
    r = ex.run("while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass")
    assert r.outcome == "timeout" and r.state_lost and "killed" in r.error_message
    after = ex.run("print('kept' in globals())")
    assert after.ok and after.stdout == "False\n"


def test_fork_bomb_is_contained(mode):
    with Executor(ExecutorConfig(isolation=mode, **CONFIG)) as ex:
        need(ex, "nproc")
        r = ex.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
        assert r.outcome == "timeout", r  # it starves itself: its processes' CPU time reaches the limit
        assert ex.run("print('alive')").stdout == "alive\n"
        uid = ex._slot.worker.uid
        assert settle(lambda: len(uid_processes(uid)) <= 1), uid_processes(uid)


def test_huge_unpicklable_and_binary_values(ex):
    r = ex.run("import threading\nlock = threading.Lock()\ngen = (i for i in range(3))\n"
               "f = lambda v: v + 1\nhandle = open('/dev/null')\nbig = 'a' * 10**8\nprint(big)")
    assert r.ok and r.output_truncated and len(r.stdout) < CONFIG["max_output_chars"] + 200
    child = ex.fork()
    try:
        r = child.run("print(f(1), next(gen), lock.acquire(), len(big), handle.fileno() > 0)")
        assert r.stdout == "2 0 True 100000000 True\n"
    finally:
        child.close()
    r = ex.run("print('\\udcff lone', 'ok')\nimport sys\nsys.stdout.buffer.write(b'\\xff\\xfe')")
    assert r.ok and "lone ok" in r.stdout
    json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")


def test_killing_everything_in_reach_spares_the_host(mode):
    with Executor(ExecutorConfig(isolation=mode, **CONFIG)) as ex:
        need_protection(ex)  # as the host user without namespaces, kill(-1) would end this test run
        siblings = [ex.fork(), ex.fork()]
        r = siblings[0].run("import os, signal\nos.kill(-1, signal.SIGKILL)")
        assert r.ok  # kill(-1) spares the caller; it reaches every process of the caller's uid
        for executor in (ex, siblings[1]):
            first = executor.run("print('alive')")
            if "principals" in ex.isolation:  # another principal: nothing reached it
                assert first.ok and not first.state_lost and first.stdout == "alive\n", first
            elif "uid" in ex.isolation:  # one uid for the family: lost state is reported
                assert first.state_lost and (first.ok or first.outcome == "worker_lost"), first
            assert executor.run("print('alive')").stdout == "alive\n"
        for sibling in siblings:
            sibling.close()


# ---------------------------------------------------------------------------------- reaping
def test_closing_reaps_everything(mode):
    ex = Executor(ExecutorConfig(isolation=mode, **CONFIG))
    if "principals" not in ex.isolation:
        ex.close()
        pytest.skip("without a uid per principal the host cannot list a candidate's processes")
    children = [ex.fork() for _ in range(3)]
    uids = [child._slot.worker.uid for child in children]
    for child in children:  # what a step leaves running dies when its run returns
        r = child.run("import subprocess\np = subprocess.Popen(['sleep', '60'], start_new_session=True)")
        assert r.ok
        assert len(uid_processes(child._slot.worker.uid)) == 1  # its worker, nothing else
    children[0].close()
    assert settle(lambda: uid_processes(uids[0]) == [])
    assert all(len(uid_processes(uid)) == 1 for uid in uids[1:])  # the siblings' workers are untouched
    for child in children[1:]:
        child.close()
    root_uid = ex._slot.worker.uid
    ex.close()
    assert settle(lambda: all(uid_processes(uid) == [] for uid in uids + [root_uid]))


def test_a_dead_host_leaves_nothing_behind(mode, tmp_path):
    script = tmp_path / "host.py"
    script.write_text(
        "import sys, time\n"
        "from codetool.executor import Executor, ExecutorConfig\n"
        f"ex = Executor(ExecutorConfig(isolation={mode!r}, scratch_dir={str(tmp_path)!r}))\n"
        "child = ex.fork()\n"
        "child.run('kept = 1')\n"
        "print(child._slot.worker.uid, flush=True)\n"
        "time.sleep(60)\n")
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        uid = host.stdout.readline().strip()
    finally:
        host.kill()  # SIGKILL: no atexit, no finalizer; the sandbox root must notice on its own
        host.wait()
    if uid == "None":
        pytest.skip("without a sandbox uid the host cannot list the family's processes")
    assert settle(lambda: uid_processes(int(uid)) == [], timeout=5.0), uid_processes(int(uid))
    assert settle(lambda: not list(tmp_path.glob("codetool-sandbox-*")))


def test_the_root_never_kills_outside_its_family(root):
    # The root kills by principal (a key the host gave it), never by a pid a worker reported (a
    # fork's pid comes from the root's own view of the copy); unknown keys touch nothing.
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        for key in (bystander.pid, 1, 0, os.getpid(), root._sandbox._ready.get("pid", 0), os.getuid()):
            for op in ("end", "release", "begin"):
                root._sandbox._call({"op": op, "key": key}) if op != "begin" else root._sandbox._tell(
                    {"op": op, "key": key})
        assert bystander.poll() is None and root._sandbox.alive
        assert not root.run("pass").state_lost  # the family's workers were not touched either
        child = root.fork()
        assert child.run("print('alive')").stdout == "alive\n"
        child.close()
    finally:
        bystander.kill()
        bystander.wait()
