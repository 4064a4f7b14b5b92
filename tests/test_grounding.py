"""The grounded check (issue 37): a final answer earns the grounded outcome only when it uses what a
successful tool call returned. Adversarial answers against hand-built host records."""

from __future__ import annotations

import json

import pytest

from codetool.executor.result import ToolCall
from codetool.grounding import answer_uses_results, salient_items
from codetool.rewards import grounded_success

QUERY = ("I'm working on a logistics project and need to check the health of the SQUAKE API. Can you verify "
         "the API health by calling the 'Checkhealth' API endpoint? Also list the projects.")
TOOLS = ["checkhealth_for_squake", "projects_for_squake"]


def call(name: str, response: str, status: str = "ok", **arguments) -> ToolCall:
    return ToolCall(name, arguments=dict(arguments), status=status, response=response)


HEALTH = call("checkhealth_for_squake", '{"result": "Kestrel Ember", "api": "Checkhealth", "input": {}}')
PROJECTS = call("projects_for_squake", '{"result": "Juniper Falcon", "api": "Projects", "input": {}}')
COUNT = call("projects_for_squake", '{"projects": 1000, "updated": "2024-05-01", "owner": "Marisol Quant"}')


def grounded(answer, calls, tool_names=TOOLS, query=QUERY):
    return grounded_success(answer, calls, tool_names, query=query)


def test_an_answer_that_states_what_the_tool_returned_is_grounded():
    assert grounded("The health check answered: Kestrel Ember.", [HEALTH])
    assert grounded("kestrel ember", [HEALTH])  # case and punctuation do not matter
    assert grounded("There are 1000 projects.", [COUNT])
    assert grounded("The owner is Marisol Quant.", [PROJECTS, COUNT])  # any successful call will do


def test_an_answer_unrelated_to_every_result_earns_nothing():
    # a valid call, then an invented answer (the finish('Kestrel Ember, 42 units') after an
    # unrelated call): the projects call returned Juniper Falcon, not Kestrel Ember
    assert not grounded("Kestrel Ember, 42 units", [PROJECTS])
    assert not grounded("The API is healthy and everything works.", [HEALTH])


def test_pasting_the_whole_raw_response_uses_it():
    # what finish(str(result)) writes: it carries the tool's content, so it is grounded (the judge,
    # not this check, rules whether forwarding a payload answers the query: docs/REWARD_HACKING.md)
    assert grounded("{'result': 'Kestrel Ember', 'api': 'Checkhealth', 'input': {}}", [HEALTH])


def test_quoting_only_the_query_text_or_the_response_keys_earns_nothing():
    # "Checkhealth" is in the response, but the query already said it; "result"/"api" are keys
    assert not grounded("I verified the SQUAKE API health via the Checkhealth endpoint.", [HEALTH])
    assert not grounded("result api input", [HEALTH])
    assert not grounded("The projects list for your logistics project.", [PROJECTS])


def test_numbers_match_whatever_their_thousands_separators():
    for answer in ("1,000 projects", "1000 projects", "1_000 projects", "1\u00a0000 projects", "1000.0 projects"):
        assert grounded(answer, [COUNT]), answer
    assert not grounded("1,001 projects", [COUNT])
    assert grounded("updated on 2024-05-01", [COUNT])


def test_an_echoed_argument_is_not_information_from_the_tool():
    # a simulator (and many real APIs) echo their input: an answer made of what the code sent is invented
    echo = call("checkhealth_for_squake", '{"result": "ok", "input": {"note": "Saffron Lattice 77"}}',
                note="Saffron Lattice 77")
    assert not grounded("Saffron Lattice 77", [echo])


def test_only_successful_calls_of_listed_tools_count():
    failed = call("checkhealth_for_squake", '{"result": "Kestrel Ember"}', status="api_error")
    other = call("lookup", '{"result": "Kestrel Ember"}')
    assert not grounded("Kestrel Ember", [failed])
    assert not grounded("Kestrel Ember", [other])
    assert grounded("Kestrel Ember", [other], tool_names=None)  # None: any recorded call is listed
    assert grounded("anything at all", [], tool_names=[])       # a query that offers no tools
    assert not grounded("   ", [HEALTH])


def test_small_integers_and_stopwords_are_not_salient():
    assert salient_items("It is the 3 of them and they are here") == set()
    assert salient_items("Kestrel 1,000 3.5") == {"kestrel", "1000", "3.5"}
    # a response that says "yes 1" cannot ground an answer that says "yes, 1 result"
    assert not answer_uses_results("yes, 1 result", [call("checkhealth_for_squake", '{"ok": "yes", "n": 1}')])


@pytest.mark.parametrize("answer", ["", None])
def test_no_answer_is_never_grounded(answer):
    assert not grounded(answer, [HEALTH])


def test_a_guess_list_is_not_grounded():
    # stuffing the answer with every candidate value shares an item with almost any response
    numbers = " ".join(str(n) for n in range(10, 1001))
    assert not grounded(f"The count is one of {numbers}.", [COUNT])
    vocabulary = ("Amber Harbor Silver Maple Orbit Quartz River Summit Willow Cobalt Meadow Falcon Ember Lagoon Atlas "
                  "Cedar Delta Echo Fjord Garnet Horizon Iris Juniper Kestrel Lumen Nova Onyx")  # the simulator's words
    assert not grounded(f"The API is healthy: {vocabulary}", [HEALTH])
    # at most nine items found in no response per item found in one
    nine = "walnut pepper copper violet tundra canyon glacier prairie lantern"
    assert grounded(f"Kestrel {nine}", [HEALTH])
    assert not grounded(f"Kestrel {nine} beacon", [HEALTH])
    assert grounded(f"Kestrel Ember {nine} beacon", [HEALTH])


def test_a_call_whose_arguments_record_was_cut_grounds_nothing():
    # the record keeps a preview of long arguments; a response that echoes the part it lost would
    # ground an answer the code made up (the simulator echoes every argument under "input")
    from codetool.executor.host.proxy import bounded_arguments

    sent = {"a": "x" * 700 + " Saffron Lattice 77", "b": "y" * 700, "c": "z" * 700}
    preview, digest = bounded_arguments(sent)
    assert "Saffron" not in str(preview)
    response = '{"result": "Amber River", "input": ' + json.dumps(sent)[:900] + "}"
    cut = ToolCall("checkhealth_for_squake", arguments=preview, response=response, arguments_sha256=digest)
    assert not grounded("Saffron Lattice 77", [cut])
    assert not grounded("Amber River", [cut])  # what it returned may be the lost part too
    # a record without a hash: the preview's cut mark says the same
    assert not grounded("Saffron Lattice 77", [ToolCall("checkhealth_for_squake", arguments=preview, response=response)])
    whole, whole_digest = bounded_arguments({"a": "short"})
    kept = ToolCall("checkhealth_for_squake", arguments=whole, response='{"result": "Amber River"}',
                    arguments_sha256=whole_digest)
    assert grounded("Amber River", [kept])


def test_what_the_code_sent_earlier_is_not_information_from_a_later_call():
    # a stateful service stores what one call sent and returns it from another
    store = call("projects_for_squake", '{"stored": true}', note="Saffron Lattice 77")
    listing = call("checkhealth_for_squake", '{"notes": ["Saffron Lattice 77"], "owner": "Marisol Quant"}')
    assert not grounded("Saffron Lattice 77", [store, listing])
    assert grounded("Marisol Quant", [store, listing])
    # an item a response gave first and the code passed on is still the tool's
    first = call("projects_for_squake", '{"owner": "Marisol Quant"}')
    second = call("checkhealth_for_squake", '{"projects_of": "Marisol Quant", "count": 1200}', owner="Marisol Quant")
    assert grounded("Marisol Quant", [first, second])
    assert grounded("1,200 projects", [first, second])


def test_an_escape_in_the_arguments_cannot_hide_an_echo():
    # the arguments' JSON writes a newline as \n, gluing "n" to the next word; a tool that echoes
    # the text raw must still be seen echoing it
    echo = call("checkhealth_for_squake", "a\nSaffron Lattice", note="a\nSaffron Lattice")
    assert not grounded("Saffron Lattice", [echo])


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"raw": value}


def test_the_honest_answers_of_the_data_examples_stay_grounded(shared_data):
    # ToolBench's and StableToolBench's example answers (ChatGPT runs, full responses): every answer
    # that uses a response must stay grounded under the guess-list bound (the calibration of
    # MAX_UNUSED_PER_USED); the two that say the search failed use none
    files = sorted((shared_data / "ToolBench" / "data_example" / "answer").glob("*/*.json"))
    files += sorted((shared_data / "StableToolBench" / "data_example" / "answer").glob("*/*/*.json"))
    verdicts = {}
    for path in files:
        generation = json.loads(path.read_text())["answer_generation"]
        final = _json(generation["final_answer"])  # a run that never called Finish has no JSON here
        if final.get("return_type") != "give_answer":
            continue
        messages = generation["train_messages"][-1]
        calls, pending = [], {}
        for m in messages:
            if m["role"] == "assistant" and m.get("function_call"):
                pending = m["function_call"]
            elif m["role"] == "function" and pending.get("name") != "Finish":
                calls.append(ToolCall(pending["name"], arguments=_json(pending.get("arguments") or "{}"),
                                      response=str(_json(m["content"]).get("response", m["content"]))[:1000]))
        query = next(m["content"] for m in messages if m["role"] == "user")
        verdicts[path.name] = answer_uses_results(final["final_answer"], calls, query=query,
                                                  tool_names=[f["name"] for f in generation["function"]])
    assert len(verdicts) == 14
    assert {name for name, ok in verdicts.items() if not ok} == {"59_ChatGPT_DFS_woFilter_w2.json",
                                                                "21_ChatGPT_DFS_woFilter_w2.json"}
