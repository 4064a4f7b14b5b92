"""The answer checker: right, wrong, reformatted and adversarial answers (hand-made keys)."""

from __future__ import annotations

import pytest

from codetool.world.answers import (
    check_answer,
    episode_success,
    find_dates,
    find_numbers,
    given_values,
)

MILES = {"kind": "number", "value": 503.93, "decimals": 2, "given": [811.0]}
POPULATION = {"kind": "number", "value": 1377497, "decimals": 0, "given": []}
DATE = {"kind": "date", "value": "2025-10-12", "given": ["2025-09-13"]}
WEEKDAY = {"kind": "text", "value": "Friday", "domain": "weekday", "given": []}
CITY = {"kind": "text", "value": "Rookhaven", "domain": "city", "given": []}


@pytest.mark.parametrize("key,answer", [
    (MILES, "503.93 miles"), (MILES, "811 km is 503.93 mi."), (MILES, "503.930"), (MILES, "about 503.93"),
    (POPULATION, "1377497 people"), (POPULATION, "The population is 1,377,497."),
    (DATE, "2025-10-12"), (DATE, "October 12, 2025"), (DATE, "12 Oct 2025"), (DATE, "29 days after 2025-09-13 is 2025-10-12"),
    (WEEKDAY, "Friday"), (WEEKDAY, "It is a friday."), (CITY, "Rookhaven"), (CITY, "in rookhaven (C204)"),
])
def test_right_and_reformatted_answers_pass(key, answer):
    assert check_answer(key, answer)


@pytest.mark.parametrize("key,answer", [
    (MILES, "503.9 miles"), (MILES, "504 miles"), (MILES, "811"), (MILES, ""), (MILES, None),
    (POPULATION, "1377496"), (POPULATION, "1 377 497"), (DATE, "2025-10-13"), (DATE, "October 2025"),
    (WEEKDAY, "Thursday"), (WEEKDAY, "Fri"), (CITY, "Velmora"),
])
def test_wrong_answers_fail(key, answer):
    assert not check_answer(key, answer)


@pytest.mark.parametrize("key,answer", [
    (MILES, "503.93 or 503.94 or 510.2"),                                  # a list of candidates
    (MILES, " ".join(f"{x / 100:.2f}" for x in range(50000, 51000))),       # every number near it
    (MILES, "{'value': 503.93, 'unit': 'mi', 'km': 811.5}"),                # a whole response with other numbers
    (POPULATION, "1377497 people, elevation 1136 m"),
    (DATE, "2025-10-12, 2025-10-13 or 2025-10-14"), (DATE, "2025-10-12 or October 13, 2025"),
    (WEEKDAY, "Monday Tuesday Wednesday Thursday Friday Saturday Sunday"), (WEEKDAY, "Friday or Saturday"),
    (CITY, "Rookhaven, Velmora, Quillfield, Brassport"),
])
def test_answers_that_list_competing_values_fail(key, answer):
    assert not check_answer(key, answer)


def test_values_the_query_gave_may_be_repeated_and_ids_are_not_numbers():
    assert check_answer(MILES, "811 km = 503.93 mi")                  # 811 is the query's
    assert check_answer(POPULATION, "city C204 has 1377497 people")    # C204 is an id, not a number
    assert check_answer(DATE, "from 2025-09-13 to 2025-10-12")
    assert check_answer(POPULATION, "As of 2025-03-01: 1377497")       # a date is no competing number
    assert given_values("number", "How many miles is 811 km?") == [811.0]
    assert given_values("date", "What is the date 29 days after 2025-09-13?") == ["2025-09-13"]
    assert find_numbers("-3.4 C, 1,234.5 and FL-C204-0312-2") == [-3.4, 1234.5]
    assert [d.isoformat() for d in find_dates("March 5, 2025 and 2025-03-06")[0]] == ["2025-03-06", "2025-03-05"]


def test_a_text_value_inside_a_longer_member_is_not_a_second_answer():
    vale = {"kind": "text", "value": "Umbria Vale", "domain": "city", "given": []}
    assert check_answer(vale, "Umbria Vale") and not check_answer(vale, "Umbria")


def test_episode_success_needs_a_finish_and_a_key():
    extra = {"answer": WEEKDAY}
    assert episode_success(extra, "finish", "Friday") is True
    assert episode_success(extra, "max_steps", "Friday") is False
    assert episode_success({}, "finish", "Friday") is None


def test_a_key_of_unknown_kind_or_domain_is_a_bug_not_a_failure():
    with pytest.raises(ValueError, match="kind"):
        check_answer({"kind": "colour", "value": "red"}, "red")
    with pytest.raises(ValueError, match="domain"):
        check_answer({"kind": "text", "value": "red", "domain": "colour"}, "red")
