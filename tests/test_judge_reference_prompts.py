"""Judge prompts read from the user's own checkout: a fixture checkout with placeholder text in the
reference's files and layout proves the files are read and filled (none of the official wording is here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from codetool.assemble import make_judge
from codetool.checkout import CHECKOUT_ENV
from codetool.cli import main
from codetool.config import ConfigError
from codetool.judge.config import JudgeConfig
from codetool.judge.records import AnswerRequest, CompareRequest
from codetool.judge.reference_prompts import load_reference_prompts

STB_FUNCTIONS = ["check_answer_status", "parse_answer_status", "check_task_solvable", "select_better_answer"]


def stb_checkout(root: Path) -> Path:
    """StableToolBench's evaluator layout with placeholder templates (``{{`` checks str.format)."""
    folder = root / "toolbench" / "tooleval" / "evaluators" / "tooleval_gpt-3.5-turbo_default"
    folder.mkdir(parents=True)
    status = {"type": "object", "properties": {"answer_status": {"type": "string", "enum": ["Unsure", "Unsolved",
                                                                                            "Solved"]}},
              "required": ["answer_status"]}
    functions = [{"name": n, "description": f"placeholder function {n}", "parameters": json.loads(json.dumps(status))}
                 for n in STB_FUNCTIONS[:3]]
    functions.append({"name": "select_better_answer", "description": "placeholder pick",
                      "parameters": {"type": "object", "properties": {"index": {"type": "number"}},
                                     "required": ["index"]}})
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "evaluator_name": "x", "prompt_template": "template.txt",
        "completions_kwargs": {"model": "placeholder-model", "max_tokens": 1000, "temperature": 0.2,
                               "functions": functions}}))
    blocks = {"check_answer_status": "PLACEHOLDER-1 q={query} a={answer} {{literal}}",
              "parse_answer_status": "PLACEHOLDER-2 q={query} whole={answer}",
              "check_task_solvable": "PLACEHOLDER-3 {task}",
              "select_better_answer": "PLACEHOLDER-4 q={query} zero={answer_0} one={answer_1}"}
    (folder / "template.txt").write_text("".join(
        f"<function>\n<name>{n}</name>\n<description>\n{t}\n</description>\n</function>\n\n" for n, t in blocks.items()))
    return root


def codetool_checkout(root: Path) -> Path:
    """CodeTool's eval/utils.py layout (module-level literals, never run) with placeholder text."""
    (root / "eval").mkdir(parents=True)
    tool = {"tools": [{"type": "function", "function": {
        "name": "check_answer_status", "description": "placeholder",
        "parameters": {"type": "object", "properties": {
            "answer_status": {"type": "string", "enum": ["Unsure", "Unsolved", "Solved"]},
            "reason": {"type": "string", "description": "placeholder reason"}},
            "required": ["answer_status", "reason"]}}}],
        "tool_choice": {"type": "function", "function": {"name": "check_answer_status"}}}
    (root / "eval" / "utils.py").write_text(
        "import os\nFilter_Map = {'G1_Instruction': ['692', '1001']}\n"
        f"eval_tool = {tool!r}\n"
        "EVAL_INST_V1 = '''PLACEHOLDER-V1 {query} | {answer}'''\n"
        "EVAL_INST_V2 = '''PLACEHOLDER-V2 query={query} answer={answer}'''\n"
        "raise SystemExit('never run')\n")
    (root / "eval" / "config.yaml").write_text("model: placeholder-judge\ntemperature: 0.0\n")
    return root


def test_stabletoolbench_files_are_read_and_filled(tmp_path):
    ref = load_reference_prompts("stabletoolbench", str(stb_checkout(tmp_path)))
    assert set(ref.prompts) == {"answer", "trajectory", "compare_details"}  # check_task_solvable unused
    assert ref.prompts["answer"].render(query="Q", answer="A").strip() == "PLACEHOLDER-1 q=Q a=A {literal}"
    assert ref.prompts["compare_details"].render(query="Q", answer_0="x", answer_1="y").strip() == \
        "PLACEHOLDER-4 q=Q zero=x one=y"
    with_reason, without = ref.prompts["answer"].tool(True), ref.prompts["answer"].tool(False)
    assert with_reason["function"]["parameters"]["required"] == ["answer_status", "reason"]
    assert without["function"]["parameters"]["required"] == ["answer_status"]
    assert ref.prompts["answer"].function["parameters"]["required"] == ["answer_status"]  # not mutated
    assert ref.settings == {"model": "placeholder-model", "temperature": 0.2, "max_tokens": 1000}
    assert load_reference_prompts("ours") is None


def test_codetool_files_are_read_with_ast_never_run(tmp_path):
    ref = load_reference_prompts("codetool", str(codetool_checkout(tmp_path)))
    assert ref.prompts["answer"].render(query="Q", answer="A") == "PLACEHOLDER-V2 query=Q answer=A"
    assert ref.prompts["answer"].tool(True)["function"]["parameters"]["required"] == ["answer_status", "reason"]
    assert ref.filtered("g1_instruction") == ["692", "1001"] and ref.filtered("G2_category") is None
    assert ref.settings == {"instruction": "v2", "model": "placeholder-judge", "temperature": 0.0}
    v1 = load_reference_prompts("codetool", str(tmp_path), instruction="v1")
    assert v1.prompts["answer"].render(query="Q", answer="A") == "PLACEHOLDER-V1 Q | A"


def test_without_a_checkout_the_command_fails_in_one_line(tmp_path, monkeypatch, capsys):
    for name in CHECKOUT_ENV.values():
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="git clone it") as err:
        make_judge(JudgeConfig(model="http://127.0.0.1:9/v1", prompts="stabletoolbench"))
    assert "https://github.com/THUNLP-MT/StableToolBench" in str(err.value)
    assert "CODETOOL_STABLETOOLBENCH_DIR" in str(err.value)
    with pytest.raises(ConfigError, match="eval/utils.py not found"):
        load_reference_prompts("codetool", str(tmp_path))
    traj = tmp_path / "t.jsonl"
    traj.write_text(json.dumps({"query_id": "1", "query": "q", "final_answer": "a", "finish_type": "finish"}) + "\n")
    status = main(["eval", str(traj), "--out", str(tmp_path / "o"), "--judge.prompts", "codetool",
                   "--judge.model", "http://127.0.0.1:9/v1"])
    err_text = capsys.readouterr().err.strip()
    assert status != 0 and len(err_text.splitlines()) == 1 and "https://github.com/LimOkii/CodeTool" in err_text


def test_each_reference_repository_has_its_own_variable(tmp_path, monkeypatch):
    """$CODETOOL_STABLETOOLBENCH_DIR names the StableToolBench clone, $CODETOOL_CODETOOL_DIR the
    CodeTool one (the judge's prompts and the reference final answers read the same clone)."""
    from codetool.checkout import reference_dir

    monkeypatch.setenv("CODETOOL_STABLETOOLBENCH_DIR", str(stb_checkout(tmp_path / "stb")))
    monkeypatch.setenv("CODETOOL_CODETOOL_DIR", str(codetool_checkout(tmp_path / "ct")))
    assert load_reference_prompts("stabletoolbench").root == str(tmp_path / "stb")
    assert load_reference_prompts("codetool").root == str(tmp_path / "ct")
    assert reference_dir("") == tmp_path / "ct" and reference_dir("", "stabletoolbench") == tmp_path / "stb"
    monkeypatch.delenv("CODETOOL_CODETOOL_DIR")
    with pytest.raises(ConfigError, match="CODETOOL_CODETOOL_DIR"):
        load_reference_prompts("codetool")


def test_the_reference_prompt_and_function_are_sent_as_the_reference_sends_them(tmp_path, monkeypatch):
    from test_judge import _fake_server

    seen = []

    def reply(body):
        seen.append(body)
        name = body["tool_choice"]["function"]["name"]
        args = {"index": 1} if name == "select_better_answer" else {
            "answer_status": "Unsure" if name == "check_answer_status" else "Solved", "reason": "r"}
        call = {"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return ({"choices": [{"index": 0, "message": {"content": None, "tool_calls": [call]}}]}, 200)
    server, url = _fake_server(reply)
    monkeypatch.setenv("CODETOOL_STABLETOOLBENCH_DIR", str(stb_checkout(tmp_path / "stb")))
    try:
        judge = make_judge(JudgeConfig(model=url, prompts="stabletoolbench", cache=str(tmp_path / "c.jsonl")))
        assert judge.describe()["prompts"] == "stabletoolbench" and judge.mode == "tools"
        first, second = judge.judge_answers([AnswerRequest("Q", "A", None, 0, reason=True),
                                             AnswerRequest("Q", "A", '{"whole": 1}', 0, reason=False)])
        assert (first.label, second.label) == ("Unsure", "Solved")
        seen.sort(key=lambda body: "whole" in body["messages"][0]["content"])  # one batch: sent concurrently
        assert seen[0]["messages"] == [{"role": "user", "content": "\nPLACEHOLDER-1 q=Q a=A {literal}\n"}]
        assert seen[0]["tools"][0]["function"]["name"] == "check_answer_status"
        assert "reason" in seen[0]["tools"][0]["function"]["parameters"]["properties"]
        assert seen[1]["messages"][0]["content"] == '\nPLACEHOLDER-2 q=Q whole={"whole": 1}\n'
        assert "reason" not in seen[1]["tools"][0]["function"]["parameters"]["properties"]
        pref = judge.compare_many([CompareRequest("Q", "a", "b", 0, details_a="DA", details_b="DB", allow_tie=False)])
        assert pref[0].winner == "b" and seen[2]["messages"][0]["content"].strip() == "PLACEHOLDER-4 q=Q zero=DA one=DB"
        calls = len(seen)
        judge.judge_answers([AnswerRequest("Q", "A", None, 0, reason=True)])  # cached
        judge.judge_answers([AnswerRequest("Q", "A", None, 0, reason=False)])  # another function: a new call
        assert len(seen) == calls + 1
    finally:
        server.shutdown()


def test_codetool_prompts_under_codetool_protocol(tmp_path):
    from test_judge import _fake_server

    seen = []

    def reply(body):
        seen.append(body)
        args = json.dumps({"answer_status": "Solved", "reason": "r"})
        call = {"id": "c0", "type": "function", "function": {"name": "check_answer_status", "arguments": args}}
        return ({"choices": [{"index": 0, "message": {"content": None, "tool_calls": [call]}}]}, 200)
    server, url = _fake_server(reply)
    try:
        cfg = JudgeConfig(model=url, prompts="codetool", protocol="codetool",
                          reference_dir=str(codetool_checkout(tmp_path / "ct")), cache=str(tmp_path / "c.jsonl"))
        assert (cfg.rounds, cfg.temperature, cfg.max_new_tokens) == (1, 0.0, 1000)
        judge = make_judge(cfg)
        assert judge.judge_answer("Q", "A").label == "Solved"
        assert seen[0]["messages"][0]["content"] == "PLACEHOLDER-V2 query=Q answer=A"
        assert seen[0]["temperature"] == 0.0 and seen[0]["tools"][0]["function"]["description"] == "placeholder"
        assert judge.reference.filtered("G1_instruction") == ["692", "1001"]
    finally:
        server.shutdown()


def test_no_secret_reaches_a_reference_prompt(tmp_path, canary_env):
    from test_judge import _fake_server

    seen = []

    def reply(body):
        seen.append(json.dumps(body))
        call = {"id": "c0", "type": "function", "function": {
            "name": "check_answer_status", "arguments": json.dumps({"answer_status": "Solved", "reason": "r"})}}
        return ({"choices": [{"index": 0, "message": {"content": None, "tool_calls": [call]}}]}, 200)
    server, url = _fake_server(reply)
    try:
        judge = make_judge(JudgeConfig(model=url, prompts="stabletoolbench", cache=str(tmp_path / "c.jsonl"),
                                       reference_dir=str(stb_checkout(tmp_path / "stb"))))
        judge.judge_answers([AnswerRequest(f"q {canary_env}", f"key={canary_env}", None, 0),
                             AnswerRequest("q", "a", json.dumps({"k": canary_env}), 0)])
        judge.compare_many([CompareRequest("q", "a", "b", 0, details_a=canary_env, details_b="x", allow_tie=False)])
        assert len(seen) >= 3 and not any(canary_env in body for body in seen)
        assert canary_env not in (tmp_path / "c.jsonl").read_text()
    finally:
        server.shutdown()
