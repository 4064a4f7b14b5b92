"""Constrained step decoding (issue 16): CallConstraint, its logits mask on a tiny tokenizer, the
transformers backend with n > 1 and prompts of different lengths, and the request an
OpenAI-compatible server receives."""

from __future__ import annotations

import re

import pytest
import torch

from codetool import CodetoolError
from codetool.models.call_mask import CallLogitsProcessor, TokenTrie
from codetool.models.constraint import DONE, CallConstraint
from codetool.models.openai_backend import OpenAIBackend
from codetool.models.transformers_backend import TransformersBackend
from tests.test_models_openai import StubServer

NAMES = ("get_weather_for_city", "search_movie")
FENCE = "```python\n"


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return TransformersBackend(str(tiny_model_dir), max_batch_size=16)


@pytest.fixture(scope="module")
def trie(backend):
    return TokenTrie(backend.tokenizer)


def opening_ok(constraint: CallConstraint, text: str) -> bool:
    """The text starts with an allowed opening, or is a cut-off prefix of one."""
    return constraint.allows(text)


def test_openings_regex_and_prefix_states():
    c = CallConstraint.for_functions(NAMES)
    assert c.names == (*NAMES, "finish", "give_up")
    assert c.regex() == r"((result) = )?(get_weather_for_city\(|search_movie\(|finish\(|give_up\()(.|\n)*"
    for good in ["search_movie(query='x')\nprint(1)", "result = finish('done')", "give_up(", "search_mo"]:
        assert c.allows(good), good
    for bad in ["print(1)", "import json", "resul = search_movie(", "search_movie (", " finish(", "searchx"]:
        assert not c.allows(bad), bad
    assert c.advance(0, "result = give_up(") == DONE and c.advance(0, "finish") not in (None, DONE)
    for text in ["result = search_movie(q=1)\n", "finish()"]:
        assert re.fullmatch(c.regex(), text)
    assert not re.fullmatch(c.regex(), "x = search_movie(")
    with pytest.raises(CodetoolError, match="identifiers"):
        CallConstraint(("not a name",))
    with pytest.raises(CodetoolError, match="at least one"):
        CallConstraint(())


def test_trigger_regex_and_allows():
    c = CallConstraint.for_functions(NAMES, trigger=FENCE)
    assert c.regex().startswith(r"[^`]*```python\n((result) = )?")
    assert re.fullmatch(c.regex(), "Plan: look it up.\n```python\nresult = search_movie('x')\n```")
    assert not re.fullmatch(c.regex(), "Plan.\n```python\nimport os\n```")
    assert c.allows("Plan: anything goes before the fence ``")
    assert c.allows("Plan.\n```python\nresult = sea") and not c.allows("Plan.\n```python\nimport")


def test_line_shape_and_assignment():
    c = CallConstraint.for_functions(NAMES, shape="line")
    assert c.regex() == (r"((result) = )?(get_weather_for_city\(|search_movie\(|finish\(|give_up\()[^\n]*\)\n"
                         r"(print\((result)\)\n)?```")
    for good in ["search_movie(q=(1, 2))\n```", "result = search_movie('x')\nprint(result)\n```",
                 "finish(result)\n```"]:
        assert re.fullmatch(c.regex(), good) and c.advance(0, good) == DONE, good
    for bad in ["search_movie(q=1\n", "search_movie(1)\nprint(2)", "search_movie(1)\n\n", "finish(1)x\n"]:
        assert not c.allows(bad), bad
    assert c.allows("search_movie(q=(1, 2)") and c.allows("result = search_movie(1)\npri")
    first = CallConstraint.for_functions(NAMES, ends=False, shape="line", assign=True)
    assert first.names == NAMES
    assert first.regex() == r"((result) = )(get_weather_for_city\(|search_movie\()[^\n]*\)\n(print\((result)\)\n)```"
    assert first.allows("result = search_movie(1)\nprint(result)\n```")
    for bad in ["search_movie(", "result = finish(", "result = search_movie(1)\n```"]:
        assert not first.allows(bad), bad
    last = CallConstraint.for_functions([], shape="line", answer_openings=('"', "result"))
    assert last.names == ("finish", "give_up")
    assert last.regex() == r'((result) = )?(give_up\(|finish\("|finish\(result)[^\n]*\)\n(print\((result)\)\n)?```'
    for good in ['finish("Paris is sunny.")\n```', "finish(result)\n```", "finish(result['a'])\n```"]:
        assert re.fullmatch(last.regex(), good) and last.advance(0, good) == DONE, good
    for bad in ["finish(answer)", "finish(x", "finish(res + 1"]:
        assert not last.allows(bad), bad
    with pytest.raises(CodetoolError, match="shape"):
        CallConstraint(NAMES, shape="grammar")
    with pytest.raises(CodetoolError, match="target"):
        CallConstraint(NAMES, targets=(), assign=True)


def test_mask_allows_exactly_the_tokens_that_keep_an_opening(trie):
    c = CallConstraint.for_functions(NAMES)
    vocab = len(trie.texts)
    processor = CallLogitsProcessor(trie, [c], prompt_width=0, vocab_size=vocab)
    line = CallConstraint.for_functions(NAMES, shape="line")
    cases = [(c, p) for p in ["", "result", "result = ", "get_weather_for_c", "finis"]] + [
        (line, p) for p in ["", "search_movie(", "search_movie(q=f(1)", "result = search_movie(1)\n",
                            "result = search_movie(1)\npr"]]
    for constraint, prefix in cases:
        state = constraint.advance(0, prefix)
        mask = processor._mask(constraint, ("in", state))
        expected = [bool(text) and constraint.allows(prefix + text) for text in trie.texts]
        assert mask.tolist() == expected, prefix
        assert any(expected)
    # from the start, every allowed token spells the beginning of an opening, and each name is reachable
    start = processor._mask(c, ("in", 0))
    firsts = {trie.texts[i][0] for i in range(vocab) if start[i]}
    assert firsts == {"g", "s", "f", "r"}


def test_processor_follows_rows_of_a_left_padded_batch(backend, trie):
    """Four rows (prompts of different lengths, left-padded), fed one token per call as generate()
    does: each row's mask equals the brute-force check of its own constraint on its own text."""
    tok, pad, vocab = backend.tokenizer, backend.pad_id, len(trie.texts)
    c = CallConstraint.for_functions(NAMES)
    t = CallConstraint.for_functions(NAMES, trigger=FENCE)
    # 9 generated tokens each: a name half written, a free row, a fence just opened, a fence half
    # written (only tokens that would finish it and go astray are out), a call already open.
    rows = [(c, [5, 6], "result = search_movie(query=1)"), (None, [7], "import os, sys, json, re, time"),
            (t, [8, 9, 10], "```python\nsearch"), (t, [11], "P.\n```python"),
            (c, [12, 13, 14, 15], 'finish(answer + " and more")')]
    generated = [tok(text, add_special_tokens=False)["input_ids"] for _, _, text in rows]
    steps = 9
    width = max(len(p) for _, p, _ in rows)
    prompts = [[pad] * (width - len(p)) + p for _, p, _ in rows]
    ids = torch.tensor([p + g[:steps] for p, g in zip(prompts, generated)])
    processor = CallLogitsProcessor(trie, [r[0] for r in rows], prompt_width=width, vocab_size=vocab)
    for end in range(width, width + steps + 1):
        scores = processor(ids[:, :end], torch.zeros(len(rows), vocab))
    for r, ((constraint, _, _), gen) in enumerate(zip(rows, generated)):
        so_far = "".join(trie.texts[i] for i in gen[:steps])
        allowed = scores[r].eq(0).tolist()
        if constraint is None or constraint.advance(0, so_far.split(FENCE)[-1]) == DONE:
            assert all(allowed), r
            continue
        before_trigger = bool(constraint.trigger) and FENCE not in so_far
        expected = [(bool(x) or before_trigger) and constraint.allows(so_far + x) for x in trie.texts]
        assert allowed == expected, (r, so_far)
        assert any(expected) and not all(expected)


@pytest.mark.parametrize("temperature,shape", [(1.0, "opening"), (0.0, "opening"), (1.0, "line")])
def test_generate_n_samples_prompts_of_different_lengths(backend, temperature, shape):
    c = CallConstraint.for_functions(["f_a", "g_b"], shape=shape)
    prompts = ["hi", "a much longer prompt, with many more words in it, to force left padding of the other",
               [{"role": "system", "content": "sys"}, {"role": "user", "content": "third"}]]
    out = backend.generate(prompts, n=3, temperature=temperature, top_p=0.9, max_new_tokens=12, constraint=c,
                           seed=0)
    assert [len(row) for row in out] == [3, 3, 3]
    opened = 0
    for row in out:
        for comp in row:
            assert opening_ok(c, comp.text), comp.text
            opened += bool(re.match(r"(result = )?(f_a|g_b|finish|give_up)\(", comp.text))
    assert opened >= 6  # short names: nearly every sample opens its call within 12 tokens


def test_generate_per_prompt_constraints_leave_free_rows_alone(backend):
    c = CallConstraint.for_functions(["f_a"])
    free = backend.generate(["hello", "x"], n=2, temperature=0.0, max_new_tokens=8)
    mixed = backend.generate(["hello", "x"], n=2, temperature=0.0, max_new_tokens=8, constraint=[None, c])
    assert [x.text for x in mixed[0]] == [x.text for x in free[0]]
    assert all(opening_ok(c, x.text) for x in mixed[1])
    with pytest.raises(CodetoolError, match="one .or None. per prompt"):
        backend.generate(["a", "b"], constraint=[c])


@pytest.fixture
def stub():
    server = StubServer()
    yield server
    server.close()


@pytest.mark.parametrize("field,expected", [
    ("structured_outputs", lambda r: {"structured_outputs": {"regex": r}}),
    ("guided_regex", lambda r: {"guided_regex": r}),
    ("regex", lambda r: {"regex": r}),
    ("none", lambda r: {}),
])
def test_openai_request_carries_the_constraint(field, expected):
    # The field is probed first: the stub plays a server that applies it (SGLang's is regex).
    stub = StubServer("sglang" if field == "regex" else "vllm")
    c1, c2 = CallConstraint.for_functions(["f_a"]), CallConstraint.for_functions(["g_b"], trigger=FENCE)
    b = OpenAIBackend(stub.url, model="m", retries=0, timeout=5.0, constraint_field=field)
    b.generate(["p1", "p2", "p3"], n=2, max_new_tokens=5, constraint=[c1, c2, None])
    bodies = {body["messages"][0]["content"]: body for path, _, body in stub.requests if path.endswith("/completions")}
    fields = ("structured_outputs", "guided_regex", "regex")
    for prompt, constraint in [("p1", c1), ("p2", c2)]:
        got = {k: v for k, v in bodies[prompt].items() if k in fields}
        assert got == expected(constraint.regex())
    assert not any(k in bodies["p3"] for k in fields)
    with pytest.raises(CodetoolError, match="constraint_field"):
        OpenAIBackend(stub.url, model="m", constraint_field="grammar")
    stub.close()


def test_search_sends_one_constraint_per_query(shared_data):
    from codetool.executor import Executor, ExecutorConfig
    from codetool.models.backends import ScriptedBackend
    from codetool.search.config import SearchConfig
    from codetool.search.expand import Node, expand
    from codetool.search.search import SearchTask
    from codetool.tools.backends import make_tool_backend
    from codetool.tools.environment import ToolEnvironment
    from codetool.tools.loaders import load_stabletoolbench

    queries = load_stabletoolbench("G1_instruction", shared_data)[:2]
    tasks = [SearchTask(q.query_id, q.query, ToolEnvironment.from_query(q, make_tool_backend("simulator")))
             for q in queries]
    policy = ScriptedBackend(['finish("done")\n```'], cycle=True)
    nodes = [Node(Executor(ExecutorConfig(isolation="fallback", timeout_s=10), tools=t.env.functions()), [], t)
             for t in tasks]
    try:
        for constrain, code_prefix in [("off", True), ("call", True), ("call", False)]:
            cfg = SearchConfig(constrain=constrain, code_prefix=code_prefix)
            rows = expand(policy, nodes, 2, cfg)
            for row in rows:
                for e in row:
                    if e.state is not None:
                        e.state.close()
            sent = policy.calls[-1][1].get("constraint")
            if constrain == "off":
                assert sent is None
                continue
            # a first step must assign a listed tool's result (no finish/give_up yet)
            assert [c.names for c in sent] == [tuple(a.name for a in t.env.apis) for t in tasks]
            assert all(c.trigger == ("" if code_prefix else FENCE) and c.assign for c in sent)
        later = [Node(n.state, [{"code": "x = 1", "observation": ""}], n.task) for n in nodes]
        for max_steps, names in [(3, [(*(a.name for a in t.env.apis), "finish", "give_up") for t in tasks]),
                                 (2, [("finish", "give_up")] * 2)]:  # the last step must answer
            for row in expand(policy, later, 1, SearchConfig(constrain="line", max_steps=max_steps)):
                for e in row:
                    if e.state is not None:
                        e.state.close()
            sent = policy.calls[-1][1]["constraint"]
            assert [c.names for c in sent] == names
            assert all(c.shape == "line" and not c.assign for c in sent)
    finally:
        for state in (n.state for n in nodes):
            state.close()


def test_literal_arguments_allow_only_literal_values():
    """``arguments="literal"``: keyword or bare literal values only; the regex and the character
    automaton accept exactly the same complete replies."""
    c = CallConstraint.for_functions(NAMES, shape="line", arguments="literal", answer_openings=('"', "result"))
    good = ['search_movie(query="Up", year=2009)\n```', 'result = search_movie("Up")\nprint(result)\n```',
            'get_weather_for_city(city="a",)\n```', 'give_up()\n```', 'finish("it is sunny", 2)\n```',
            'finish(result["x"])\n```', 'search_movie(n=-1.5)\n```']
    bad = ['search_movie(query: str)\n```', 'search_movie(query="Up)\n```', 'search_movie(query=Up)\n```',
           'search_movie(query="a"))\n```', 'search_movie(x)\n```', 'search_movie("a" )\n```',
           'search_movie("a\\"b")\n```', 'search_movie(,)\n```']
    for text in good:
        assert re.fullmatch(c.regex(), text) and c.advance(0, text) == DONE, text
    for text in bad:
        assert not re.fullmatch(c.regex(), text) and c.advance(0, text) is None, text


def test_literal_automaton_and_regex_agree_on_random_replies():
    import random

    c = CallConstraint.for_functions(["f"], shape="line", arguments="literal", answer_openings=('"', "result"))
    pieces = ["f(", "finish(", 'finish("', "finish(result", "give_up(", '"', "a", "=", "1", ".", ",", " ", ")",
              "\n", "```", "print(result)\n", "x:", "\\"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 9)))
        state, end = 0, None
        for i, ch in enumerate(text):  # the automaton stops checking once the end marker came
            state = c.step(state, ch)
            if state is None or state == DONE:
                end = i + 1 if state == DONE else None
                break
        if end is not None:
            assert re.fullmatch(c.regex(), text[:end]), text[:end]
        else:
            assert not re.fullmatch(c.regex(), text), text


def test_search_passes_the_argument_rule():
    from codetool.search.config import SearchConfig

    cfg = SearchConfig(constrain="line")
    assert cfg.constrain_arguments == "literal"
