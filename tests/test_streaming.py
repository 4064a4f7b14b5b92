"""Units of a long job in threads (issue 39): a slow callback never holds back the next unit."""

from __future__ import annotations

import threading
import time

import pytest

from codetool.streaming import Delivery, Finisher, stream

WAIT_S = 20.0  # a safety net only: the tests assert what started, never how long anything took


def test_a_slow_callback_does_not_hold_back_the_next_items():
    """The callback of the first result waits until every item has started; before issue 39 it
    ran in the thread that starts items, so only the first two ever started while it waited."""
    started, all_started, seen = [], threading.Event(), []

    def work(x):
        started.append(x)
        if len(started) == 8:
            all_started.set()
        return x

    def on_result(x):
        seen.append((x, all_started.wait(WAIT_S) if not seen else True))

    stream(work, range(8), 2, on_result)
    assert sorted(x for x, _ in seen) == list(range(8))
    assert seen[0][1], "the items were not started while the first result was being handled"


def test_a_callback_that_raises_stops_the_stream():
    def on_result(x):
        if x == 1:
            raise OSError("disk full")

    started = []
    with pytest.raises(OSError, match="disk full"):
        stream(lambda x: started.append(x) or time.sleep(0.01) or x, range(50), 1, on_result)
    assert len(started) < 50


def test_admit_holds_back_new_items():
    """``admit`` (a memory cap) keeps at most one item running beside the others it admits."""
    running, peak, asked, lock = [0], [0], [], threading.Lock()

    def work(x):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return x

    def admit(n):
        asked.append(n)
        return n < 2

    out = []
    stream(work, range(10), 5, out.append, admit=admit, recheck_s=0.01)
    assert sorted(out) == list(range(10)) and peak[0] <= 2 and max(asked) <= 2


def test_delivery_keeps_the_order_and_one_thread():
    threads, got = set(), []
    delivery = Delivery(lambda x: (threads.add(threading.get_ident()), got.append(x)))
    for i in range(20):
        delivery.put(i)
    delivery.close()
    assert got == list(range(20)) and len(threads) == 1 and threading.get_ident() not in threads


def test_finisher_runs_beside_and_lands_one_at_a_time():
    landing, peak, landed = [0], [0], []
    gate = threading.Barrier(4, timeout=WAIT_S)  # the four jobs run at the same time, or this breaks

    def job(x):
        gate.wait()
        return x * 10

    def land(x):
        landing[0] += 1
        peak[0] = max(peak[0], landing[0])
        landed.append(x)
        landing[0] -= 1

    finisher = Finisher(4, land)
    for x in range(4):
        finisher.submit(job, x)
    finisher.close()
    assert sorted(landed) == [0, 10, 20, 30] and peak[0] == 1

    failing = Finisher(2, landed.append)
    failing.submit(lambda x: 1 / x, 0)
    with pytest.raises(ZeroDivisionError):
        failing.close()
