"""The reference re-run of a trajectory's chosen steps, step by step while its episode goes on
(issue 39): the same entries as the re-run of the finished trajectory, its calls made once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from conformance_stubs import StubEnv

from codetool.executor import Executor, ExecutorConfig
from codetool.search.records import Candidate, Step, Trajectory
from codetool.search.reference import ReferenceRunner, reference_steps
from codetool.search.reference_stepwise import StepwiseReference, StepwiseReferences
from codetool.search.search import SearchTask

TEXTS = ["```python\nr = get_weather_for_weatherapi(city='Oslo')\nprint(r['temp'])\n```",
         "no code here",
         "```python\nprint(r['humidity'])\n```",
         "```python\nprint(geocode_for_geo(place='Rome'))\n```"]


class CountingEnv(StubEnv):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def functions(self):
        funcs = super().functions()
        weather = funcs["get_weather_for_weatherapi"]

        def counted(city):
            self.calls.append(city)
            return weather(city)
        funcs["get_weather_for_weatherapi"] = counted
        return funcs


def _make(task):
    return Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=task.env.functions())


def _traj(texts):
    return Trajectory(query_id="q", query="query", steps=[
        Step(index=i, candidates=[Candidate(index=0, text=t, code=None, chosen=True)]) for i, t in enumerate(texts)])


def _at_the_end(texts):
    task = SearchTask("q", "query", CountingEnv())
    with ReferenceRunner.for_task(task, _make) as runner:
        return reference_steps(_traj(texts), runner), task.env.calls


def test_steps_run_as_they_are_chosen_give_the_entries_of_the_finished_trajectory():
    want, calls_at_end = _at_the_end(TEXTS)
    assert [e["status"] for e in want] == [0, 1, 1, 1]  # a code-less step, a KeyError, a printed error payload
    task = SearchTask("q", "query", CountingEnv())
    with ThreadPoolExecutor(2) as pool:
        ref = StepwiseReference(task, _make, pool.submit)
        for n in range(1, len(TEXTS)):  # after each step but the last, as the episode calls it
            ref.add(_traj(TEXTS[:n]))
        traj = _traj(TEXTS)
        assert ref.finish(traj)
    assert traj.extra["reference_steps"] == want
    assert task.env.calls == calls_at_end == ["Oslo"]  # the one call, made once, as at the end


def test_a_path_that_does_not_continue_the_steps_seen_is_re_run_from_scratch():
    other = ["```python\nr = get_weather_for_weatherapi(city='Rome')\nprint(r['temp'])\n```", *TEXTS[1:]]
    want, _ = _at_the_end(other)
    task = SearchTask("q", "query", CountingEnv())
    with ThreadPoolExecutor(2) as pool:
        ref = StepwiseReference(task, _make, pool.submit)
        ref.add(_traj(TEXTS[:2]))
        traj = _traj(other)
        assert ref.finish(traj)
    assert traj.extra["reference_steps"] == want


def test_a_runner_that_cannot_start_leaves_no_reference_steps(caplog):
    def broken(task):
        raise RuntimeError("no sandbox")

    with ThreadPoolExecutor(1) as pool:
        ref = StepwiseReference(SearchTask("q", "query", StubEnv()), broken, pool.submit)
        ref.add(_traj(TEXTS[:1]))
        traj = _traj(TEXTS[:2])
        with caplog.at_level(logging.WARNING):
            assert not ref.finish(traj)
    assert "reference_steps" not in traj.extra
    assert "the reference re-run of its steps failed (RuntimeError: no sandbox)" in caplog.text


def test_a_job_that_stops_closes_the_runners_of_unfinished_episodes():
    made = []

    def make(task):
        made.append(_make(task))
        return made[-1]

    refs = StepwiseReferences(make, workers=2)
    traj = _traj(TEXTS[:2])
    refs.on_step(SearchTask("q", "query", StubEnv()), traj)  # an episode that will never finish
    refs.close()  # the job stops: what ran is waited for, the runner closed
    assert made and all(ex.closed for ex in made)
    assert refs.take(traj) is None


def test_at_most_workers_episodes_hold_a_runner_and_a_freed_slot_goes_to_the_next_step():
    refs = StepwiseReferences(_make, workers=1)
    first, second = _traj(TEXTS[:1]), _traj(TEXTS[:1])
    try:
        refs.on_step(SearchTask("q", "query", StubEnv()), first)
        refs.on_step(SearchTask("q2", "query", StubEnv()), second)  # the slot is taken
        assert refs.take(second) is None  # it is re-run once it ends, as before
        ref = refs.take(first)
        assert ref is not None and ref.finish(_traj(TEXTS[:2]))  # its end frees the slot
        later = _traj(TEXTS[:2])
        refs.on_step(SearchTask("q3", "query", StubEnv()), later)  # a later step takes it
        taken = refs.take(later)
        assert taken is not None
        taken.close()
    finally:
        refs.close()


def test_runners_take_only_the_place_of_episodes_the_job_no_longer_has():
    spare = [0]  # a long job in its bulk: every episode slot holds an episode
    refs = StepwiseReferences(_make, workers=4, spare=lambda: spare[0])
    early, late = _traj(TEXTS[:1]), _traj(TEXTS[:2])
    try:
        refs.on_step(SearchTask("q", "query", StubEnv()), early)
        assert refs.take(early) is None  # re-run at its end, as before
        spare[0] = 1  # its last wave: one episode slot is free
        refs.on_step(SearchTask("q2", "query", StubEnv()), late)
        ref = refs.take(late)
        assert ref is not None and ref.finish(_traj(TEXTS[:3]))
    finally:
        refs.close()


def test_a_stopped_job_releases_the_episodes_that_had_ended_and_their_runners_count_until_then():
    """An episode that ended hands its re-run to the finisher (``take``) and frees its slot only
    when its ``finish`` returns (before: at ``take``, so more runners than ``workers`` were open);
    if the job stops while that re-run's program waits in the pool, ``close`` cancels the program
    and the ``finish`` returns (before: it waited forever, and the process never exited)."""
    import threading

    refs = StepwiseReferences(_make, workers=1)
    submitted, submit = [], refs._submit
    refs._submit = lambda job: submitted.append(submit(job)) or submitted[-1]  # type: ignore[method-assign]
    gate = threading.Event()
    refs._submit(gate.wait)  # the pool's one thread is busy: the episode's program queues
    try:
        ended, other = _traj(TEXTS[:1]), _traj(TEXTS[:1])
        refs.on_step(SearchTask("q", "query", StubEnv()), ended)
        assert len(submitted) == 2 and not submitted[1].running()
        queued = submitted[1]
        ref = refs.take(ended)
        assert ref is not None
        refs.on_step(SearchTask("q2", "query", StubEnv()), other)  # its slot is not free yet
        assert refs.take(other) is None
        done = []
        finisher = threading.Thread(target=lambda: done.append(ref.finish(_traj(TEXTS[:2]))), daemon=True)
        finisher.start()
        closer = threading.Thread(target=refs.close, daemon=True)
        closer.start()  # the job stops: the queued program is cancelled
        for _ in range(6000):  # a safety limit, not a measured time
            if queued.cancelled():
                break
            threading.Event().wait(0.01)
        assert queued.cancelled()
    finally:
        gate.set()
    closer.join(60)
    finisher.join(60)
    assert done == [False] and not finisher.is_alive()
    assert ended.extra.get("reference_steps") is None
