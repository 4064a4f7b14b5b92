"""The fallback sandbox's scratch directory goes away however its family ends (codetool.executor.host.scratch).

Regression: a host SIGKILLed while its sandbox root was still starting left an empty
``codetool-sandbox-*`` directory in the temp dir (the root died of EPIPE on its ready frame before
it could clean up); test_reliability_kill left three per run of the default suite.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codetool.executor import Executor, ExecutorConfig, ExecutorError
from codetool.executor.host import family as family_module
from codetool.executor.host import scratch
from codetool.executor.kernel.procs import owner_alive

CONFIG = dict(isolation="fallback", timeout_s=5.0, memory_mb=512)
ROOT = Path(__file__).resolve().parents[1]


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("codetool-sandbox-*"))


def _settle(predicate, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _host(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh host process (TMPDIR and scratch_dir both point at ``tmp_path``)."""
    script = tmp_path.parent / f"{tmp_path.name}-host.py"
    script.write_text("import os, signal, sys\n"
                      "from codetool.executor import Executor, ExecutorConfig\n"
                      "from codetool.executor.host import scratch\n"
                      "from codetool.executor.host import family as sb\n"
                      "from codetool.executor.host.channel import Conn\n"
                      f"config = ExecutorConfig(scratch_dir={str(tmp_path)!r}, **{CONFIG!r})\n" + body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_host_killed_while_its_root_starts(tmp_path):
    # The host dies right after handing the root its sources, before the root says it is ready.
    proc = _host(tmp_path, "Conn.wait_frame = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                           "Executor(config)\n")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert _settle(lambda: not _left(tmp_path)), _left(tmp_path)


def test_host_killed_before_its_root_exists_is_reclaimed_by_the_next_start(tmp_path):
    proc = _host(tmp_path, "make = scratch.make\n"
                           "def make_then_die(*args):\n"
                           "    make(*args)\n"
                           "    os.kill(os.getpid(), signal.SIGKILL)\n"
                           "sb.scratch.make = make_then_die\n"
                           "Executor(config)\n")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (stale,) = _left(tmp_path)
    pid, start = stale.split("-")[2:4]  # codetool-sandbox-<pid>-<start>-<random>
    assert not owner_alive(int(pid), start) and owner_alive(os.getpid(), "0")
    mine = scratch.make(str(tmp_path), None)  # a live owner's directory is kept
    legacy = tmp_path / "codetool-sandbox-abc123"  # no owner in the name: never guessed at
    legacy.mkdir()
    with Executor(ExecutorConfig(scratch_dir=str(tmp_path), **CONFIG)) as ex:
        assert ex.run("print(1)").stdout == "1\n"
        assert stale not in _left(tmp_path) and Path(mine).name in _left(tmp_path)
    assert _left(tmp_path) == sorted([Path(mine).name, legacy.name])
    scratch.remove(mine)


def test_exit_without_close_and_garbage_collection(tmp_path):
    proc = _host(tmp_path, "ex = Executor(config)\nchild = ex.fork()\nchild.run('x = 1')\n")  # no close
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _settle(lambda: not _left(tmp_path)), _left(tmp_path)
    ex = Executor(ExecutorConfig(scratch_dir=str(tmp_path), **CONFIG))
    ex.fork().run("y = 2")  # the fork is dropped at once
    assert len(_left(tmp_path)) == 1
    del ex
    gc.collect()
    assert _left(tmp_path) == []


def test_a_restart_after_the_root_died_uses_a_fresh_directory(tmp_path):
    with Executor(ExecutorConfig(scratch_dir=str(tmp_path), **CONFIG)) as ex:
        ex.run("x = 1")
        (first,) = _left(tmp_path)
        os.kill(ex._slot.worker.pid, signal.SIGKILL)  # fallback mode: pids are the host's
        os.kill(ex._sandbox._proc.pid, signal.SIGKILL)
        ex._sandbox._proc.wait()
        assert _settle(lambda: ex._slot.worker.dead())
        result = ex.run("print('again')")  # the machine lost its state: this step is not executed
        assert result.outcome == "not_executed" and result.state_lost and result.error_type == "StateLost", result
        assert ex.run("print('again')").stdout == "again\n"  # the next one runs in a fresh state
        (second,) = _left(tmp_path)
        assert second != first
        ex._sandbox._abort()  # the host gives up on a live root (e.g. a request timed out)
        assert _left(tmp_path) == [] and _settle(lambda: ex._slot.worker.dead())
        assert ex.run("print('third')").outcome == "not_executed"  # the state went with the family
        assert ex.run("print('third')").stdout == "third\n" and len(_left(tmp_path)) == 1
    assert _left(tmp_path) == []


def test_a_failed_start_removes_its_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(family_module, "_sandbox_sources", lambda: b"not json")
    with pytest.raises(ExecutorError, match="did not start"):
        Executor(ExecutorConfig(scratch_dir=str(tmp_path), **CONFIG))
    assert _left(tmp_path) == []
