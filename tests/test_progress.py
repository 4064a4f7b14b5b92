"""Progress callbacks (codetool.progress): the parts tick them, the commands draw them."""

from __future__ import annotations

import pytest

from codetool.commands import job_progress
from codetool.decide.labelled import DecisionItem
from codetool.decide.necessity import label_items
from codetool.judge.llm import LLMJudge
from codetool.judge.records import AnswerRequest, ScriptedJudge
from codetool.models.backends import ScriptedBackend
from codetool.progress import Heartbeat, JobProgress, note_work, ticker


class Recorder:
    """A ProgressFactory that records the totals it was told and the units it was ticked with."""

    def __init__(self):
        self.totals, self.units = [], []

    def __call__(self, total):
        self.totals.append(total)
        return self.units.append


def test_no_progress_is_a_tick_that_does_nothing():
    tick = ticker(None, 5)
    assert tick("unit") is None
    rec = Recorder()
    ticker(rec, 3)("a")
    assert (rec.totals, rec.units) == ([3], ["a"])


def test_the_llm_judge_ticks_once_per_batch_sent():
    rec = Recorder()
    judge = LLMJudge(ScriptedBackend(['{"answer_status": "Solved", "reason": "ok"}'], cycle=True), mode="json", batch_size=2,
                     progress=rec)
    verdicts = judge.judge_answers([AnswerRequest(f"q{i}", f"a{i}") for i in range(5)])
    assert [v.label for v in verdicts] == ["Solved"] * 5
    assert rec.totals == [3] and rec.units == [2, 2, 1]
    judge.judge_answers([AnswerRequest(f"q{i}", f"a{i}") for i in range(5)])  # all cached: nothing sent
    assert rec.totals == [3]
    judge.judge_answers([AnswerRequest("new", "one")])  # one batch counts too (before: none, so a long
    assert rec.totals == [3, 1] and rec.units[-1] == 1  # single batch logged "0/0 batches" for minutes)


def test_necessity_labels_tick_per_no_tool_batch(tmp_path):
    items = [DecisionItem(f"w-{i}", f"What is {i} plus {i}?", True, [], [], "when2tool", "when2tool",
                          answer=str(2 * i), benchmark="when2tool") for i in range(5)]
    rec = Recorder()
    labels = label_items(items, ScriptedBackend(["\\boxed{2}"], cycle=True), ScriptedJudge(), tmp_path / "labels.jsonl",
                         batch_size=2, progress=rec)
    assert len(labels) == 5 and rec.totals == [3] and rec.units == [2, 2, 1]


def test_every_call_of_the_factory_adds_to_one_count():
    job = JobProgress("judge x", "batches")
    with job_progress(job, terminal=False) as progress:
        first = progress(2)
        first()
        second = progress(3)
        second("unit")
        second("unit")
    assert (job.units, job.total_units, job.fraction()) == (3, 5, 0.6)
    assert job.counts() == "3/5 batches"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_work_inside_units_moves_the_fraction_and_early_ends_are_credited():
    """Before (issue 40): the trees bar counted finished trees; trees grow together, so it stood at
    0% until the stage ended."""
    clock = FakeClock()
    job = JobProgress("trees", "trees", "nodes", work_per_unit=7, scale=2, used=lambda r: r["used"], clock=clock)
    tick = job.factory()(2)  # two binary trees of depth 3: 1 + 2 + 4 = 7 expansions each at most
    clock.now = 10.0
    job.add_work(2)  # both roots expanded: 4 nodes
    assert job.fraction() == 2 / 14 and job.eta() == pytest.approx(60.0)  # 10 s for 1/7 of the work
    assert job.line() == "trees: 0/2 trees, 4/~28 nodes (14%), elapsed 0:10, ETA ~1:00"
    job.add_work(3)
    tick({"used": 4})  # tree 1 ended early after 4 expansions: its other 3 are credited
    assert job.fraction() == (5 + 3) / 14
    job.add_work(1)
    tick({"used": 2})
    assert job.fraction() == 1.0 and job.units == 2


def test_without_a_terminal_the_counts_are_logged_every_interval(monkeypatch):
    """A job whose output goes to a file (nohup, Slurm) logs its counts at least every
    LOG_INTERVAL_S seconds even while one step runs long (the interval is shortened here)."""
    import codetool.progress as progress_module

    lines = []
    beat = Heartbeat(lambda: f"line {len(lines)}", interval_s=0.01, log=lines.append)
    with beat:
        while len(lines) < 3:
            beat.stopped.wait(0.01)
    assert lines[:3] == ["line 0", "line 1", "line 2"] and len(lines) >= 4  # and once more at the end
    assert progress_module.LOG_INTERVAL_S <= 60
    monkeypatch.setattr(progress_module, "LOG_INTERVAL_S", 0.01)
    job = JobProgress("run", "queries", "steps", work_per_unit=2)
    seen = []
    monkeypatch.setattr(progress_module.logger, "info", lambda fmt, text: seen.append(text))
    with job_progress(job, terminal=False) as factory:
        factory(1)
        note_work(1)  # the sampler finished a step
        while not any("1/~2 steps" in line for line in seen):
            Heartbeat(lambda: "", 0).stopped.wait(0.01)
    assert seen[-1].startswith("run: 0/1 queries, 1/~2 steps (50%), elapsed ")
