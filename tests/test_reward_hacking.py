"""The reward-hacking suite (issue 37): every known hack, scripted, earns no more than the honest
episode it imitates, through ``train-policy``'s rollout and reward functions and ``build-trees``'
builder and labeller (the hacks and their counterparts: ``tests/reward_hacks.py``; the table with
the rewards before and after: ``docs/REWARD_HACKING.md``).

The hacks whose defence is the executor's verdict (the step must not write its own outcome,
``codetool.executor.inside.keeper``) run like the others since the executor half of issue 37.
"""

from __future__ import annotations

import pytest
import reward_hacks as rh
from transformers import AutoTokenizer


def _params():
    return [pytest.param(h, id=h.name) for h in rh.HACKS]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def task(shared_data):
    return rh.load_task(shared_data)


@pytest.mark.parametrize("hack", _params())
def test_no_hack_earns_more_than_the_honest_episode_in_train_policy(hack, tokenizer, shared_data):
    task = rh.load_task(shared_data, *hack.query)
    got = rh.rewards(rh.rollout(tokenizer, task, hack.hack))
    honest = rh.rewards(rh.rollout(tokenizer, task, hack.honest))
    assert None not in honest.values(), "the honest episode must be scored"
    for setting, value in got.items():
        # a dropped episode (None) escapes its score: only the machine may cause that
        assert value is not None, f"{hack.name}: dropped from its group under {setting}"
        if setting not in hack.legitimate_under:
            assert value <= honest[setting] + 1e-9, f"{hack.name} under {setting}: {value} > {honest[setting]}"


@pytest.mark.parametrize("hack", _params())
def test_no_hack_wins_its_sibling_pair_in_build_trees(hack, shared_data):
    record = rh.tree(rh.load_task(shared_data, *hack.query), hack)
    assert "error" not in record, record.get("error")
    if hack.honest_wins_tree:
        assert rh.outcome(record, hack) == "honest wins"
    else:
        assert rh.outcome(record, hack) != "hack wins"
    assert rh.leaf_success(record, hack, "hack") <= rh.leaf_success(record, hack, "honest")


def test_the_honest_episode_earns_the_outcome(tokenizer, task):
    got = rh.rewards(rh.rollout(tokenizer, task, (rh.CALL, rh.ANSWER)))
    assert got["outcome"] == 1.0 and got["spot"] == 1.0 and got["judged"] == 1.0


def test_a_step_that_crashes_its_own_worker_is_its_own_failure_not_the_machines(tokenizer, task):
    # os._exit kills the step's worker: a failure of the code (scored), never "not executed" (dropped)
    ep = rh.rollout(tokenizer, task, (rh.CALL + "\nimport os\nos._exit(3)", "give_up('my state is gone')"))
    assert not ep.dropped and ep.steps[0].candidate.result.outcome == "worker_lost"
    assert rh.rewards(ep)["spot"] == pytest.approx(0.5)  # the crash 0, the give_up 1


THREAD = """import threading, time
marks = open('marks.txt', 'w')
def tick():
    while True:
        marks.write('x'); marks.flush(); time.sleep(0.01)
threading.Thread(target=tick, daemon=True).start()
"""
# the route: a POSIX timer (timer_create through ctypes) whose signal handler runs in the
# worker while it waits for its next step
TIMER = """import ctypes, ctypes.util, signal
libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
marks = open('marks.txt', 'w')
def tick(signum, frame):
    marks.write('x'); marks.flush()
signal.signal(signal.SIGUSR1, tick)
class SigEvent(ctypes.Structure):
    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int), ('notify', ctypes.c_int),
                ('pad', ctypes.c_byte * 48)]
class Spec(ctypes.Structure):
    _fields_ = [('interval_s', ctypes.c_long), ('interval_ns', ctypes.c_long), ('value_s', ctypes.c_long),
                ('value_ns', ctypes.c_long)]
timer = ctypes.c_void_p()
libc.timer_create(0, ctypes.byref(SigEvent(None, int(signal.SIGUSR1), 0)), ctypes.byref(timer))
libc.timer_settime(timer, 0, ctypes.byref(Spec(0, 10_000_000, 0, 10_000_000)), None)
"""


@pytest.mark.parametrize("starter", [pytest.param(THREAD, id="thread"),
                                     pytest.param(TIMER, id="posix timer")])
def test_an_idle_candidate_runs_no_code(starter, task):
    # a candidate that acts between its steps can starve or disturb a sibling's step (issue 37: its
    # spinners turned a sibling's 1.5 s of CPU into a timeout); here it only counts its ticks
    import time

    with rh.make_executor(task) as ex:
        ran = ex.run(starter + "\nimport time\ntime.sleep(0.05)\nprint(len(open('marks.txt').read()))")
        if ran.state_lost or not ran.ok:
            # the executor refused to install it (no ctypes, no signal handler in a step's thread) or
            # killed the state that held it (a thread alive after its step): nothing of it is left
            later = ex.run("print('marks' in globals())")
            assert later.ok and later.stdout == "False\n", later
            return
        before = int(ran.stdout.strip())
        time.sleep(0.5)  # idle: no step runs (a tick every 10 ms would leave ~50 marks)
        after = int(ex.run("print(len(open('marks.txt').read()))").stdout.strip())
    assert after - before <= 3, f"the idle candidate acted {after - before} times between its steps"
