"""The world's query generator: seeded, prefix-stable, split by template, every answer reachable
through the tools by the query's own scripted solution."""

from __future__ import annotations

import pytest

from codetool.tools.environment import ToolEnvironment
from codetool.world import (
    SPLITS,
    TEMPLATES,
    WorldBackend,
    check_answer,
    generate,
    load_queries,
    templates,
)
from codetool.world.queries import TOOLS_PER_QUERY


def test_the_same_seed_gives_the_same_queries_and_another_seed_others():
    a, b = generate("train", 24, seed=3), generate("train", 24, seed=3)
    assert [(q.query, q.key, q.calls, q.tools) for q in a] == [(q.query, q.key, q.calls, q.tools) for q in b]
    other = generate("train", 24, seed=4)
    assert sum(x.query != y.query for x, y in zip(a, other)) >= 20


def test_queries_are_prefix_stable_and_templates_take_turns():
    long, short = generate("heldout", 20), generate("heldout", 8)
    assert [q.query for q in long[:8]] == [q.query for q in short]
    names = [t.name for t in templates("heldout")]
    assert [q.template for q in long] == [names[i % len(names)] for i in range(20)]
    assert len({q.query for q in long}) == 20 and len({q.query_id for q in long}) == 20
    assert long[3].query_id == "heldout-0003"


def test_no_template_is_in_both_splits_and_no_query_text_either():
    train, heldout = {t.name for t in templates("train")}, {t.name for t in templates("heldout")}
    assert train and heldout and not train & heldout and len(TEMPLATES) == len(train) + len(heldout)
    assert {t.split for t in TEMPLATES} == set(SPLITS)
    texts = {s: {q.query for q in generate(s, 60)} for s in SPLITS}
    assert not texts["train"] & texts["heldout"]
    assert {q.template for q in generate("train", 60)} == train
    assert {q.template for q in generate("heldout", 60)} == heldout


def test_a_query_needs_one_to_four_calls_and_offers_their_tools():
    for split in SPLITS:
        for q in generate(split, 48):
            assert 1 <= len(q.calls) <= 4
            assert {name for name, _ in q.calls} <= set(q.tools)
            assert len(q.tools) == len(set(q.tools)) == TOOLS_PER_QUERY
            assert all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                       for _, args in q.calls for v in args.values())  # literal arguments only


@pytest.mark.parametrize("split", SPLITS)
def test_every_answer_is_reachable_by_the_scripted_calls_through_the_tool_seam(split):
    """Each scripted call goes through ToolEnvironment (argument binding) and WorldBackend (the
    normal ``call(api, arguments)`` seam); the last response holds the key's value, and the
    demonstration's answer passes the checker."""
    backend = WorldBackend()
    for bq, wq in zip(load_queries(split, 48), generate(split, 48)):
        env = ToolEnvironment(bq.apis, backend)
        last = None
        for name, args in wq.calls:
            response = env.call(name, (), args)
            assert response.ok, (wq.query_id, name, response.error)
            last = response.content
        key = bq.extra["answer"]
        assert key == wq.key and check_answer(key, wq.answer)
        value = key["value"]
        assert (f"{value}" in last) or (f'"{value}"' in last), (wq.query_id, value, last)
        assert not check_answer(key, "I could not find it.")


def test_benchmark_queries_carry_the_key_and_the_world_tools():
    [q] = load_queries("heldout", 1, offset=5)
    assert q.query_id == "heldout-0005" and q.benchmark == "world" and q.group == "heldout"
    assert q.extra["template"] == templates("heldout")[5].name and q.extra["answer"]["kind"] in ("number", "text", "date")
    assert [a.name for a in q.apis] == generate("heldout", 6)[5].tools
    assert all(a.category == "world" and a.parameters for a in q.apis if a.name != "list_cities")
    with pytest.raises(ValueError, match="split"):
        load_queries("test", 2)
    with pytest.raises(ValueError, match="limit"):
        load_queries("train", 0)


def test_scripted_solution_runs_in_the_sandbox_as_a_policy_step_would(tmp_path):
    from codetool.executor import Executor, ExecutorConfig
    from codetool.policy.warmstart import call_code

    [bq], [wq] = load_queries("heldout", 1, offset=1), generate("heldout", 2)[1:]  # distance in miles: 4 calls
    env = ToolEnvironment(bq.apis, WorldBackend())
    with Executor(ExecutorConfig(isolation="fallback", timeout_s=20), tools=env.functions()) as ex:
        for name, args in wq.calls:
            result = ex.run(call_code(name, args))
            assert result.ok and result.tool_calls[0].status == "ok"
        done = ex.run(f'finish("{wq.answer}")')
    assert done.final_answer == wq.answer and check_answer(wq.key, done.final_answer)
    assert len(env.calls) == 4 and all(c.status == "ok" for c in env.calls)
