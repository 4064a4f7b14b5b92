"""The one prompt loader (codetool.prompts): every packaged prompt, its placeholders, and the
refusals of a missing or an unknown one."""

from __future__ import annotations

from importlib import resources

import pytest

from codetool import CodetoolError, prompts

# Every packaged prompt and its placeholders, in order. A prompt file that gains, loses or renames
# a placeholder changes what its caller must pass: update the caller and this table together.
PLACEHOLDERS = {
    "decide_answer": [], "decide_fast": ["tool"], "decide_system": ["functions"], "decide_user": ["query"],
    "final_answer": ["query", "log"], "final_answer_no_information": [],
    "final_answer_reference": ["info", "query"], "final_answer_reference_step": ["step", "issue", "info"],
    "final_answer_reference_system": [],
    "judge_answer": ["query", "answer"], "judge_compare": ["query", "answer_a", "answer_b"],
    "judge_compare_details": ["query", "answer_a", "answer_b"],
    "judge_trajectory": ["query", "trajectory", "answer"],
    "mode_default": [], "mode_direct": [], "mode_force": [], "mode_necessary": [], "mode_no_tool": [],
    "mode_reason": [], "mode_sparse": [],
    "policy_format_code_only": [], "policy_format_step_text": [], "policy_observation": ["observation"],
    "policy_observation_hidden": [], "policy_system": ["step_format", "tools"], "policy_user": ["query"],
    "prm_prefix": ["query", "tools", "history"], "prm_reference_history": ["previous_steps", "parent_result"],
    "prm_reference_system": ["tools", "history", "query"], "prm_suffix": ["candidate_plan", "candidate", "candidate_output"],
    "prm_suffix_hidden": ["candidate_plan", "candidate"],
    "probe_prefill_none": [], "probe_prefill_tool": [], "reply_prefix": ["prefix"],
}


def _packaged() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files("codetool.prompts").iterdir() if p.name.endswith(".txt"))


def test_the_table_names_every_packaged_prompt():
    assert _packaged() == sorted(PLACEHOLDERS)


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_every_prompt_fills_with_its_placeholders_and_keeps_other_braces(name):
    text = prompts.load(name)
    assert prompts.placeholders(text) == PLACEHOLDERS[name]
    filled = prompts.render(name, **{p: f"<{p}>" for p in PLACEHOLDERS[name]})
    assert prompts.placeholders(filled) == []
    # every other brace is text: the judges' JSON examples come through as written
    assert filled.count("{") == text.count("{") - sum(text.count("{" + p + "}") for p in PLACEHOLDERS[name])
    assert filled == text if not PLACEHOLDERS[name] else filled != text


def test_json_examples_are_text_and_the_fill_is_one_pass():
    template = 'Reply {"answer_status": "Solved"} for {query}; then {answer}.'
    out = prompts.fill(template, {"query": "what is {answer}?", "answer": "42"})
    assert out == 'Reply {"answer_status": "Solved"} for what is {answer}?; then 42.'


def test_a_missing_or_unknown_placeholder_is_refused_with_the_file_named():
    with pytest.raises(CodetoolError, match=r"codetool/prompts/policy_system.txt: placeholder \{tools\} has no value"):
        prompts.render("policy_system", step_format="x")
    with pytest.raises(CodetoolError, match=r"codetool/prompts/policy_user.txt: no placeholder \{tools\}"):
        prompts.render("policy_user", query="q", tools="t")
    with pytest.raises(CodetoolError, match=r"my.txt: placeholder \{b\}"):
        prompts.fill("{a} {b}", {"a": 1}, source="my.txt")
    with pytest.raises(CodetoolError, match="no prompt codetool/prompts/nope.txt; the prompts are: decide_answer"):
        prompts.load("nope")


def test_load_is_verbatim():
    raw = resources.files("codetool.prompts").joinpath("judge_answer.txt").read_text(encoding="utf-8")
    assert prompts.load("judge_answer") == raw and raw.endswith("\n")
