"""Progress callbacks (codetool.progress): the parts tick them, the commands draw them."""

from __future__ import annotations

from codetool.commands import progress_bar
from codetool.decide.labelled import DecisionItem
from codetool.decide.necessity import label_items
from codetool.judge.llm import LLMJudge
from codetool.judge.records import AnswerRequest, ScriptedJudge
from codetool.models.backends import ScriptedBackend
from codetool.progress import ticker


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
    judge.judge_answers([AnswerRequest("new", "one")])  # one batch: no bar
    assert rec.totals == [3]


def test_necessity_labels_tick_per_no_tool_batch(tmp_path):
    items = [DecisionItem(f"w-{i}", f"What is {i} plus {i}?", True, [], [], "when2tool", "when2tool",
                          answer=str(2 * i), benchmark="when2tool") for i in range(5)]
    rec = Recorder()
    labels = label_items(items, ScriptedBackend(["\\boxed{2}"], cycle=True), ScriptedJudge(), tmp_path / "labels.jsonl",
                         batch_size=2, progress=rec)
    assert len(labels) == 5 and rec.totals == [3] and rec.units == [2, 2, 1]


def test_the_commands_bar_adds_every_call_to_one_bar(monkeypatch):
    from types import SimpleNamespace

    class FakeProgress:
        """Stands in for rich's Progress: one task list, totals and advances recorded."""

        def __init__(self, *columns):
            self.tasks, self.calls = [], []

        def __enter__(self):
            seen.append(self)
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, description, total):
            self.tasks.append(SimpleNamespace(description=description, total=total, completed=0))
            return len(self.tasks) - 1

        def update(self, job, advance=0, total=None):
            task = self.tasks[job]
            task.completed += advance
            task.total = task.total if total is None else total

    seen: list[FakeProgress] = []
    monkeypatch.setattr("rich.progress.Progress", FakeProgress)
    with progress_bar("judge x") as progress:
        first = progress(2)
        first()
        second = progress(3)
        second("unit")
        second("unit")
    [bar] = seen
    assert [(t.description, t.total, t.completed) for t in bar.tasks] == [("judge x", 5, 3)]
