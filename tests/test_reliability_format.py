"""Linear-time PRM prefix truncation (codetool.prm.format.fewest_dropped_steps, issue 19)."""

from __future__ import annotations

import pytest

from codetool.prm.format import PRMFormat, PromptEncoder
from codetool.rewards import PRMItem


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from codetool.prm.folder import new_prm

    return new_prm(str(tiny_model_dir), PRMFormat(), dtype="float32", device="cpu")[1]


def _one_at_a_time(enc: PromptEncoder, item: PRMItem, budget: int) -> int:
    """The old quadratic rule, as the reference: drop one more oldest step until it fits."""
    dropped = 0
    ids = enc._render_prefix(item, 0, enc.fmt.max_tools_chars, len(item.query))
    while len(ids) > budget and dropped < len(item.history):
        dropped += 1
        ids = enc._render_prefix(item, dropped, enc.fmt.max_tools_chars, len(item.query))
    return dropped


@pytest.mark.parametrize("n_steps, out_len", [(3, 10), (12, 40), (40, 5), (25, 300), (60, 0)])
def test_same_steps_dropped_as_the_one_at_a_time_rule(tokenizer, n_steps, out_len):
    fmt = PRMFormat(max_length=400, max_suffix_length=96)
    enc = PromptEncoder(tokenizer, fmt)
    history = [{"code": f"x{i} = call_{i}(city='Paris')", "output": "o" * ((i * 7) % (out_len + 1))}
               for i in range(n_steps)]
    item = PRMItem(query="weather?", tools="def f(): ...", history=history, candidate="f()", candidate_output="")
    got = enc.encode(item)
    assert len(got.prefix_ids) <= fmt.prefix_budget
    assert got.dropped_steps == _one_at_a_time(enc, item, fmt.prefix_budget)


def test_twenty_thousand_steps_encode_with_a_handful_of_renders(tokenizer, monkeypatch):
    """The issue's 0.66 MB body (20,000 history entries) stalled the server for minutes: the
    prefix was rendered and tokenised again for every step dropped. Now a few renders settle it."""
    enc = PromptEncoder(tokenizer, PRMFormat(max_length=1024, max_suffix_length=128))
    renders = []
    real = enc._render_prefix
    monkeypatch.setattr(enc, "_render_prefix", lambda *a: renders.append(a[1]) or real(*a))
    history = [{"code": "x = 1", "output": "ok"} for _ in range(20_000)]
    item = PRMItem(query="q", tools="", history=history, candidate="f()", candidate_output="")
    got = enc.encode(item)
    assert len(renders) <= 40, f"{len(renders)} renders of the prefix"  # log2(20,000) ~ 15 per search
    assert got.truncated and 19_000 < got.dropped_steps < 20_000
    assert len(got.prefix_ids) <= enc.fmt.prefix_budget
