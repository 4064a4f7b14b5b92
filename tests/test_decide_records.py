"""The decision benchmark's per-query record: typed in memory, the same ``records.jsonl`` line on disk."""

import json

from codetool.decide.metrics import threshold_row
from codetool.decide.records import Cost, DecisionRecord, RouteCosts

# A records.jsonl line as eval-decision writes it (keys in their order on disk).
LINE = {
    "id": "stb-G1_instruction-7", "query": "Validate +1 555 0100.", "needs_tool": True, "gold": ["is_valid_for_phone"],
    "group": "G1_instruction", "category": "G1_instruction", "tools_from": None, "n_functions": 2,
    "options": ["NONE", "is_valid_for_phone", "format_for_phone"], "choice": "is_valid_for_phone",
    "confidence": 0.75, "method": "logprobs", "logprobs": [-2.0, -0.5, -3.0], "null_logprobs": [-0.5, -2.0, -2.0],
    "samples": [], "top": [["is_valid_for_phone", 0.75], ["NONE", 0.2]], "route": "fast",
    "costs": {"decision": {"tokens": 120, "seconds": 0.5}, "direct": {"tokens": 40, "seconds": 0.25},
              "fast": {"tokens": 300, "seconds": 2.0}, "search": None},
    "direct_answer": "It looks valid.", "answer": None, "answer_correct": None,
    "fast_first_action": "is_valid_for_phone", "fast_fallback": None, "search_first_action": None,
}


def test_record_round_trip_keeps_the_line():
    record = DecisionRecord.from_dict(LINE)
    assert record.item_id == "stb-G1_instruction-7" and record.costs.fast == Cost(300, 2.0)
    assert record.costs.search is None and record.costs.route("direct") == Cost(40, 0.25)
    assert json.dumps(record.to_dict()) == json.dumps(LINE)  # same keys, same order, same values


def test_metrics_read_the_typed_record():
    record = DecisionRecord.from_dict(LINE)
    row = threshold_row([record], 0.5, 0.5)  # confidence 0.75 >= 0.5: the fast route, 120 + 300 tokens
    assert row["routes"] == {"direct": 0, "fast": 1, "search": 0}
    assert row["tokens_per_query"] == 420 and row["seconds_per_query"] == 2.5
    assert row["tool_invocation_accuracy"] == 1.0
    unmeasured = DecisionRecord(needs_tool=True, gold=["a"], choice="a", confidence=0.1, method="logprobs",
                                costs=RouteCosts(Cost(10, 0.1)))
    assert threshold_row([unmeasured], 0.5, 0.5)["tokens_per_query"] is None  # the search route was not run
