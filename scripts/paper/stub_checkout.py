"""A placeholder checkout in LimOkii/CodeTool's layout, for the paper path's CPU rehearsal only.

    python scripts/paper/stub_checkout.py runs/paper-qwen2.5-7b/stub-CodeTool

The judge reads its instruction and function from a clone of CodeTool (``--judge.reference_dir``);
CodeTool's wording is never shipped here, so the rehearsal writes the same file layout with
placeholder text: the commands, the file reading and the judge's forced function call run as on a
GPU node, and the verdicts mean nothing (the judge is the 135M model anyway).
"""

import sys
from pathlib import Path

TOOL = {"tools": [{"type": "function", "function": {
    "name": "check_answer_status", "description": "Placeholder: label the answer.",
    "parameters": {"type": "object", "properties": {
        "answer_status": {"type": "string", "enum": ["Unsure", "Unsolved", "Solved"]},
        "reason": {"type": "string", "description": "why"}},
        "required": ["answer_status", "reason"]}}}],
    "tool_choice": {"type": "function", "function": {"name": "check_answer_status"}}}


def main(root: Path) -> None:
    (root / "eval").mkdir(parents=True, exist_ok=True)
    (root / "eval" / "utils.py").write_text(
        "# placeholder text in CodeTool's layout (scripts/paper/stub_checkout.py); never run\n"
        "Filter_Map = {}\n"
        f"eval_tool = {TOOL!r}\n"
        "EVAL_INST_V2 = '''Placeholder instruction. Query: {query}\\nAnswer: {answer}\\nIs the query solved?'''\n")
    (root / "eval" / "config.yaml").write_text("model: placeholder-judge\ntemperature: 0.0\n")
    print(f"placeholder CodeTool checkout in {root}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
