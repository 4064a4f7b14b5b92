"""``codetool.rewards.score_items``: the one check that a PRM scorer answered one score per item."""

from __future__ import annotations

import pytest

from codetool.rewards import PRMItem, ScorerFault, machine_failure, score_items


class ByCandidate:
    """Scores each item by a table of its candidate code; records every call; ``extra`` scores
    more (positive) or fewer (negative) than items."""

    def __init__(self, table: dict[str, float], extra: int = 0):
        self.table, self.extra, self.calls = table, extra, []

    def score(self, items):
        self.calls.append(list(items))
        scores = [self.table[it.candidate] for it in items]
        return scores + [0.5] * self.extra if self.extra >= 0 else scores[: self.extra]


def _items(*codes: str) -> list[PRMItem]:
    return [PRMItem(query="q", tools="", candidate=code) for code in codes]


def test_one_score_per_item_in_the_items_order_as_floats():
    scorer = ByCandidate({"a()": 1, "b()": 0.25, "c()": 0.5})  # an int is a score too: 1.0
    scores = score_items(scorer, _items("b()", "c()", "a()"))
    assert scores == [0.25, 0.5, 1.0] and all(type(s) is float for s in scores)
    assert [[it.candidate for it in call] for call in scorer.calls] == [["b()", "c()", "a()"]]  # one call


def test_no_items_asks_the_scorer_nothing():
    scorer = ByCandidate({})
    assert score_items(scorer, []) == [] and scorer.calls == []


@pytest.mark.parametrize(("extra", "returned"), [(-1, 2), (1, 4), (-3, 0)])
def test_a_reply_of_another_length_is_the_scorers_fault_naming_both_counts(extra, returned):
    scorer = ByCandidate({"a()": 0.1, "b()": 0.2, "c()": 0.3}, extra=extra)
    with pytest.raises(ScorerFault, match=f"returned {returned} scores for 3 items") as e:
        score_items(scorer, _items("a()", "b()", "c()"))
    assert machine_failure(e.value)  # the machine's failure, never the policy's
