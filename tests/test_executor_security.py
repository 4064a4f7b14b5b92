"""The findings of the executor security review (issue 17), one test each: reports that the code
tries to forge, host-side caps and validation, and the kernel-level limits (seccomp, orphans).

The code here plays the attacker: it finds the worker object with ``gc`` and writes frames on its
channel, or starts threads and detached processes that outlive its step.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from codetool.executor import Executor, ExecutorConfig
from codetool.executor.host.channel import ProtocolError, log_safe, parse_frame
from codetool.executor.host.proxy import bounded_arguments
from codetool.executor.result import ARGUMENT_PREVIEW_CHARS
from tests.conftest import need

CONFIG = dict(timeout_s=3.0, grace_s=0.5, memory_mb=512, max_processes=24, max_output_chars=5000,
              scratch_mb=32, max_step_mb=4, max_tool_calls=50)

# Sandbox-side helpers the attacks use: the step's own tool channel (found with gc), and a raw
# frame writer on it.
GRAB = """import gc, json, struct
chan = next(o for o in gc.get_objects() if type(o).__name__ == 'Channel' and o.sock.fileno() >= 0)
def raw(obj):
    data = json.dumps(obj).encode()
    chan.sock.sendall(struct.pack('>I', len(data)) + data)
"""


def lookup(city: str = ""):
    return {"city": city[:10], "temp": 20}



@pytest.fixture(scope="module")
def root(mode):
    ex = Executor(ExecutorConfig(isolation=mode, **CONFIG), tools={"lookup": lookup})
    yield ex
    ex.close()


@pytest.fixture
def ex(root):
    child = root.fork()
    yield child
    child.close()


# ------------------------------------------------------------------ reports the code cannot forge
def test_a_report_sent_by_the_code_decides_nothing(ex):
    r = ex.run(GRAB + "raw({'op': 'end', 'output_dropped': 0})\nraise ValueError('real')")
    assert not r.ok and r.outcome == "runtime_error" and r.error_type == "ValueError", r
    r = ex.run(GRAB + "raw({'op': 'raised', 'error_type': 'KeyError', 'error_message': 'forged', 'kind': "
                      "'resource_limit'})\nprint('fine')")
    assert r.ok and r.stdout == "fine\n", r  # it ran to its end, whatever it reported
    r = ex.run("raise KeyError('second')")
    assert not r.ok and r.error_type == "KeyError"


def test_a_frame_that_is_not_part_of_the_protocol_stops_the_step(ex):
    r = ex.run(GRAB + "raw({'op': 'done', 'outcome': 'ok'})\nimport time\ntime.sleep(3)")
    assert not r.ok and r.outcome == "sandbox_violation" and r.state_lost
    assert ex.run("print(1)").stdout == "1\n"  # a fresh worker serves the next step


def test_replacing_the_states_methods_changes_no_later_report(ex):
    r = ex.run("import gc\nstate = next(o for o in gc.get_objects() if type(o).__name__ == 'State')\n"
               "cls = type(state)\nfor name in ('pre', 'after', 'describe', '_message', '_close'):\n"
               "    setattr(cls, name, lambda self, *a, **k: True)")
    assert r.ok
    r = ex.run("raise ValueError('the real code ran')")
    assert not r.ok and r.outcome == "runtime_error", r
    child = ex.fork()  # a fork of the tampered state reports honestly too
    try:
        assert not child.run("1/0").ok
    finally:
        child.close()


def test_a_thread_left_by_a_step_cannot_answer_for_the_next(ex):
    code = GRAB + ("import threading, time\n"
                   "def serve():\n"
                   "    while True:\n"
                   "        time.sleep(0.05)\n"
                   "        try:\n            raw({'op': 'end'})\n        except OSError:\n            pass\n"
                   "threading.Thread(target=serve, daemon=True).start()")
    r = ex.run(code)
    assert r.ok and r.state_lost, r  # its thread would outlive it: the state is killed with it
    r = ex.run("import time\ntime.sleep(0.3)\nraise ValueError('real')")
    assert not r.ok


def test_a_background_threads_tool_call_is_not_recorded_on_the_next_step(ex):
    ex.run("import threading, time\nseen = []\n"
           "def later():\n"
           "    time.sleep(0.2)\n"
           "    try:\n        lookup(city='late')\n"
           "    except ToolError as e:\n        seen.append(e.status)\n"
           "threading.Thread(target=later).start()")
    r = ex.run("import time\ntime.sleep(0.5)\nprint(seen)")
    assert r.ok and r.tool_calls == [] and r.stdout == "['step_ended']\n"


# --------------------------------------------------------------------- host-side caps and checks
def test_a_tool_call_flood_is_capped_in_calls_bytes_and_memory(ex):
    r = ex.run("while True:\n    lookup(city='y' * 1_000_000)")
    # the step is stopped at the budget (the host holds no more than max_step_mb for it)
    assert not r.ok and r.outcome == "resource_limit" and r.error_type == "StepLimit" and r.state_lost
    assert "MiB" in r.error_message and 1 <= len(r.tool_calls) <= 5  # max_step_mb=4
    call = r.tool_calls[0]
    assert len(json.dumps(call.arguments)) < ARGUMENT_PREVIEW_CHARS + 100 and len(call.arguments_sha256) == 64
    assert len(json.dumps(r.to_dict())) < 50_000
    r = ex.run("for i in range(200):\n    try:\n        lookup(city='x')\n    except BaseException:\n"
               "        pass\nfinish('done anyway')")
    assert r.outcome == "resource_limit" and "more than 50 tool calls" in r.error_message
    assert len(r.tool_calls) == 50 and not r.ok


def test_non_finite_and_oversized_numbers_never_raise_in_the_host(ex):
    r = ex.run(GRAB + "chan.send({'op': 'end', 'output_dropped': float('inf')})")
    assert r.outcome == "sandbox_violation"
    r = ex.run(GRAB + "chan.send({'op': 'end', 'output_dropped': 10**30})")
    assert r.outcome == "sandbox_violation"  # an integer beyond 64 bits
    r = ex.run(GRAB + "chan.send({'op': 'end', 'output_dropped': 1e300})")
    assert r.ok  # finite but absurd: clamped, nothing raises


def test_deeply_nested_tool_arguments_never_reach_the_record(ex):
    r = ex.run("x = []\nfor _ in range(600):\n    x = [x]\nlookup(city=x)")
    assert r.error_type == "ValueError" and "nest deeper" in r.error_message
    r = ex.run(GRAB + "x = []\nfor _ in range(600):\n    x = [x]\n"
                      "chan.send({'op': 'tool', 'call': 1, 'name': 'lookup', 'args': [], 'kwargs': {'city': x}})")
    assert r.outcome == "sandbox_violation"
    json.dumps(r.to_dict())


def test_the_answer_cap_is_enforced_by_the_host(ex):
    r = ex.run(GRAB + "chan.send({'op': 'finish', 'answer': 'a' * 3_000_000})\nraise SystemExit")
    assert r.final_answer is not None and len(r.final_answer) <= 100_003


def test_control_characters_from_the_sandbox_never_reach_a_log_line(ex, caplog):
    with caplog.at_level(logging.WARNING, logger="codetool.executor"):
        r = ex.run(GRAB + "chan.send({'op': '\\x1b[31mX\\nFAKE LOG LINE'})")
    assert r.outcome == "sandbox_violation"
    messages = [rec.getMessage() for rec in caplog.records]
    assert messages and not any("\x1b" in m or "\n" in m for m in messages)
    assert log_safe("a\x1b[2Jb\nc\u2028") == "a\\x1b[2Jb\\nc\\u2028"


def test_frame_validation_on_the_host():
    with pytest.raises(ProtocolError, match="non-finite"):
        parse_frame(b'{"op": "done", "cpu_s": Infinity}')
    with pytest.raises(ProtocolError, match="non-finite"):
        parse_frame(b'{"op": "done", "cpu_s": NaN}')
    with pytest.raises(ProtocolError, match="deeper"):
        parse_frame(b'{"op": "tool", "args": ' + b"[" * 40 + b"]" * 40 + b"}")
    with pytest.raises(ProtocolError, match="not JSON"):
        parse_frame(b"[" * 100_000)
    with pytest.raises(ProtocolError, match="64 bits"):
        parse_frame(b'{"op": "done", "cpu_s": 123456789012345678901234567890}')
    assert parse_frame(b'{"op": "done", "cpu_s": 1.5}') == {"op": "done", "cpu_s": 1.5}


def test_recorded_arguments_are_a_bounded_preview_plus_a_hash():
    small = {"city": "Paris"}
    assert bounded_arguments(small) == (small, bounded_arguments({"city": "Paris"})[1])
    preview, digest = bounded_arguments({"city": "y" * 1_000_000, "n": 3})
    assert preview["n"] == 3 and preview["city"].endswith("...[cut]") and len(preview["city"]) < 1100
    assert digest != bounded_arguments({"city": "y" * 999_999, "n": 3})[1]


# ------------------------------------------------------------------ siblings and kernel limits
def test_raw_system_calls_and_memory_access_are_out_of_reach(ex):
    """No ctypes in the step (nor in a fresh interpreter it starts, where the worker has its own
    mount namespace: the C modules are hidden), so no raw ``pidfd_getfd``, ``ptrace`` or
    ``process_vm_*`` call on a sibling; the seccomp filter refuses them anyway (its own tests)."""
    need(ex, "seccomp")
    r = ex.run("errors = []\nfor name in ('ctypes', '_ctypes', '_testcapi'):\n    try:\n        __import__(name)\n"
               "    except BaseException as e:\n        errors.append(type(e).__name__)\nprint(len(errors))\n"
               "import subprocess, sys\n"
               "print(subprocess.run([sys.executable, '-c', 'import ctypes'], capture_output=True).returncode)")
    assert r.ok and r.stdout.splitlines()[0] == "3", r
    if "hidden(proc,ctypes)" in ex.isolation:
        assert r.stdout.splitlines()[1] == "1", r


def test_exec_d_programs_hold_no_channel(ex):
    r = ex.run("import subprocess, sys\n"
               "probe = 'import os\\nfds = []\\nfor fd in range(256):\\n    try:\\n        os.fstat(fd)\\n"
               "        fds.append(fd)\\n    except OSError:\\n        pass\\nprint(fds)'\n"
               "print(subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True).stdout, end='')")
    assert r.ok and r.stdout == "[0, 1, 2]\n", r


def test_seccomp_denies_what_rlimits_cannot_hold(ex):
    need(ex, "seccomp")
    r = ex.run("import os, socket, mmap\n"
               "try:\n    socket.socket(40, socket.SOCK_STREAM)\nexcept OSError as e:\n    print('vsock', e.errno)\n"
               "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print('memfd', e.errno)\n"
               "try:\n    mmap.mmap(-1, 4096)\nexcept OSError as e:\n    print('shared mapping', e.errno)\n"
               "print('private mapping', len(mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)))\n"
               "import threading, subprocess\nt = threading.Thread(target=print, args=('thread',))\n"
               "t.start()\nt.join()\nprint(subprocess.run(['true']).returncode)")
    assert r.ok, r.error_message
    assert r.stdout.splitlines() == ["vsock 97", "memfd 1", "shared mapping 1", "private mapping 4096", "thread", "0"]


DETACH = ("import os, time\n"
          "if os.fork() == 0:\n"
          "    if os.fork() == 0:\n"
          "        os.setsid()\n"
          "        open('detached-{tag}.pid', 'w').write(str(os.getpid()))\n"
          "        while True:\n            time.sleep(0.05)\n"
          "    os._exit(0)\n"
          "time.sleep(0.3)\n")
ALIVE = ("import os\npid = int(open('detached-{tag}.pid').read())\n"
         "try:\n    state = open(f'/proc/{{pid}}/stat').read().rsplit(')', 1)[1].split()[0]\n"
         "except OSError:\n    state = 'gone'\n"
         "print(state in ('gone', 'Z', 'X'))")


def _uid_alive(uid: int) -> list[int]:
    """Host pids (not zombies) whose real uid is ``uid``."""
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


def test_a_detached_process_dies_when_its_run_returns_and_at_the_timeout_kill(ex, root):
    need(ex, "principals")  # the host finds a candidate's processes by its uid
    first = root.fork()
    uid = first._slot.worker.uid
    assert first.run(DETACH.format(tag="return")).ok
    assert _uid_alive(uid) == [first._slot.worker.pid] or len(_uid_alive(uid)) == 1  # the worker only
    first.close()
    second = root.fork()
    uid = second._slot.worker.uid
    try:
        r = second.run(DETACH.format(tag="timeout") + "while True:\n    pass", timeout_s=1.0)
        assert r.timed_out
        assert len(_uid_alive(uid)) <= 1, _uid_alive(uid)
    finally:
        second.close()
    time.sleep(0.2)
    assert _uid_alive(uid) == []


def test_detached_processes_cannot_hold_the_process_limit(ex, root, mode):
    need(ex, "uid")  # RLIMIT_NPROC only holds for the family's own uid
    hog = root.fork()
    hog.run("import os, time\nfor _ in range(40):\n    try:\n        pid = os.fork()\n    except OSError:\n"
            "        break\n    if pid == 0:\n        os.setsid()\n        time.sleep(60)\n        os._exit(0)")
    hog.close()
    child = root.fork()
    try:
        r = child.run("print('state kept')")
        assert r.ok and not r.state_lost and r.stdout == "state kept\n"
    finally:
        child.close()


def test_the_sweep_spares_live_workers_whose_zygote_closed(root):
    a = root.fork()
    a.run("kept = 'b state'")
    b = a.fork()  # b's process is a child of a's worker
    a.close()  # b is now an orphan of the family's root, but a live worker
    c = root.fork()
    c.run("pass")
    c.close()  # this kill sweeps the orphans
    try:
        r = b.run("print(kept)")
        assert r.ok and not r.state_lost and r.stdout == "b state\n"
    finally:
        b.close()
