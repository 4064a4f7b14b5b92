"""``step_usage`` counts the wait the kernel has not published yet: ``/proc/<pid>/task/<tid>/schedstat``
adds a wait only when the thread next gets a CPU, so a step the machine keeps waiting would read
as a step that had its time."""

import io
import types

from codetool.executor.kernel import schedstat


def _fake_proc(monkeypatch, threads: dict[int, dict], clock: list[float]):
    """``threads``: tid -> {"ran": ns, "waited": ns, "state": "R" | "S", "ticks": n} of process 100,
    whose main thread (tid 100, the keeper) is left out by ``step_usage``."""

    def listdir(path):
        assert path == "/proc/100/task", path
        return ["100"] + [str(t) for t in threads]

    def fake_open(path, *args, **kwargs):
        tid = int(path.split("/")[4])
        t = threads[tid]
        if path.endswith("schedstat"):
            return io.StringIO(f"{t['ran']} {t['waited']} 7\n")
        rest = [t["state"]] + ["0"] * 10 + [str(t["ticks"]), "0"] + ["0"] * 40
        return io.StringIO(f"{tid} (python) " + " ".join(rest))

    monkeypatch.setattr(schedstat.os, "listdir", listdir)
    monkeypatch.setattr(schedstat, "open", fake_open, raising=False)
    monkeypatch.setattr(schedstat, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))


def test_a_runnable_thread_whose_counters_stand_still_is_waiting(monkeypatch):
    threads = {101: {"ran": 30_000_000, "waited": 500_000_000, "state": "R", "ticks": 3}}
    clock = [10.0]
    _fake_proc(monkeypatch, threads, clock)
    seen: dict = {}
    assert schedstat.step_usage(100, [], seen)[0] == 0.5  # first look: what the kernel published
    clock[0] = 10.7
    wait, cpu, running = schedstat.step_usage(100, [], seen)
    assert abs(wait - 1.2) < 1e-9 and running == 1  # 0.5 published + 0.7 since the counters stood still
    threads[101].update(ran=31_000_000, waited=1_300_000_000)  # it got the CPU: the kernel published 1.3
    clock[0] = 10.8
    assert abs(schedstat.step_usage(100, [], seen)[0] - 1.3) < 1e-9  # counted once, not 1.3 + 0.8


def test_a_sleeping_or_running_thread_adds_no_wait(monkeypatch):
    threads = {101: {"ran": 30_000_000, "waited": 200_000_000, "state": "S", "ticks": 3},
               102: {"ran": 10_000_000, "waited": 100_000_000, "state": "R", "ticks": 1}}
    clock = [5.0]
    _fake_proc(monkeypatch, threads, clock)
    seen: dict = {}
    schedstat.step_usage(100, [], seen)
    clock[0] = 6.0
    threads[102]["ran"] += 900_000_000  # 102 ran the whole second; 101 slept it
    assert schedstat.step_usage(100, [], seen)[0] == 0.2
    assert schedstat.step_usage(100, [])[0] == 0.2  # without ``seen``: what the kernel published


def test_runnable_tells_a_thread_that_waits_for_a_cpu_from_one_that_sleeps(monkeypatch):
    """What ``host.step`` decides a silent keeper from at the backstop: a thread in state ``R`` (the
    keeper included) waits for the machine; when all sleep, nothing of the step is the machine's."""
    threads = {101: {"ran": 0, "waited": 0, "state": "S", "ticks": 0}}
    clock = [0.0]
    _fake_proc(monkeypatch, threads, clock)
    monkeypatch.setattr(schedstat, "open", lambda path, *a, **k: io.StringIO(
        f"1 (python) {threads.get(int(path.split('/')[4]), {'state': 'S'})['state']} 0 0"), raising=False)
    assert not schedstat.runnable([100])
    threads[101]["state"] = "R"
    assert schedstat.runnable([100])
