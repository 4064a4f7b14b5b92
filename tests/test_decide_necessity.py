"""Tool-necessity labels from a scripted run without tools: the judge rule, the grounded check,
labels by construction, resume, and keys kept out of labels.jsonl."""

from __future__ import annotations

import json

import pytest

from codetool import CodetoolError
from codetool.decide.labelled import DecisionItem
from codetool.decide.necessity import boxed, grounded_match, label_items
from codetool.judge.records import ScriptedJudge
from codetool.models.backends import ScriptedBackend

REPLIES = {"weather": "It is probably sunny.", "Dark Knight": "Christian Bale played Batman.",
           "6 times 7": "6 x 7 = \\boxed{42}", "prime": "\\boxed{8}", "haiku": "unused"}


def item(item_id, query, benchmark, answer=None, needs_tool=True):
    return DecisionItem(item_id, query, needs_tool, [], [], benchmark, benchmark, answer=answer, benchmark=benchmark)


ITEMS = [item("stb-1", "What is the weather in Paris now?", "stabletoolbench"),
         item("rb-1", "Who was the lead actor in The Dark Knight?", "restbench-tmdb"),
         item("w2t-1", "What is 6 times 7?", "when2tool", answer="42"),
         item("w2t-2", "What is the 4th prime?", "when2tool", answer="7"),
         item("free-1", "Write a haiku about rain.", "tool_free", needs_tool=False)]


def policy(canary=""):
    def reply(prompt):
        text = prompt[-1]["content"]
        assert "function" not in prompt[0]["content"].split("Do not call")[0]  # no tools are offered
        return next(v for k, v in REPLIES.items() if k in text) + canary
    return ScriptedBackend(reply)


def judge():
    return ScriptedJudge(lambda req: "Solved" if "Bale" in req.answer else "Unsolved")


def test_labels_follow_each_benchmarks_rule(tmp_path, canary_env):
    backend, scripted = policy(f" key {canary_env}"), judge()
    labels = label_items(ITEMS, backend, scripted, tmp_path / "labels.jsonl")
    got = {k: (v.needs_tool, v.rule, v.verdict) for k, v in labels.items()}
    assert got == {"stb-1": (True, "judge", "Unsolved"), "rb-1": (False, "judge", "Solved"),
                   "w2t-1": (False, "reference", "match"), "w2t-2": (True, "reference", "no_match"),
                   "free-1": (False, "given", None)}
    assert [r.query for r in scripted.answer_calls] == [ITEMS[0].query, ITEMS[1].query]  # the judge sees two
    prompts = [m[-1]["content"] for call in backend.calls for m in call[0]]
    assert not any("haiku" in p for p in prompts)  # a given label runs nothing
    text = (tmp_path / "labels.jsonl").read_text()
    assert canary_env not in text and len(text.splitlines()) == 5
    assert json.loads(text.splitlines()[0])["id"] == "free-1"


def test_a_rerun_resumes_and_rules_can_be_overridden(tmp_path):
    out = tmp_path / "labels.jsonl"
    label_items(ITEMS[:2], policy(), judge(), out)
    silent = ScriptedBackend(lambda p: (_ for _ in ()).throw(AssertionError("ran again")))
    again = label_items(ITEMS[:2], silent, None, out)  # nothing left to run: no judge needed either
    assert {k: v.needs_tool for k, v in again.items()} == {"stb-1": True, "rb-1": False}
    given = label_items(ITEMS[:1], silent, None, tmp_path / "given.jsonl", rules={"stabletoolbench": "given"})
    assert given["stb-1"].needs_tool and given["stb-1"].rule == "given"
    with pytest.raises(CodetoolError, match="needs a judge"):
        label_items(ITEMS[:1], policy(), None, tmp_path / "x.jsonl")


def test_grounded_match():
    assert boxed("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}" and boxed("no box") is None
    assert grounded_match("\\boxed{42.0}", "42") and grounded_match("\\boxed{1,000}", "1000")
    assert grounded_match("\\boxed{\\text{Paris}}", "paris") and not grounded_match("\\boxed{8}", "7")
    assert grounded_match("The capital is Paris.", "Paris") and not grounded_match("It is Lyon.", "Paris")
