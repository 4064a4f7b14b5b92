"""The grounded check (issue 37): a final answer earns the grounded outcome only when it uses what a
successful tool call returned. Adversarial answers against hand-built host records."""

from __future__ import annotations

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
