"""Trajectories to and from StableToolBench's converted-answer layout.

StableToolBench's evaluator reads ``model_predictions_converted/<method>/<group>.json``: a mapping
``query_id -> {"query", "available_tools", "answer"}`` where ``available_tools`` are function
schemas (``name``, ``description``, ``parameters``; the last one ``Finish``) and ``answer`` is
``{"method", "total_steps", "final_answer", "answer_details"}``. ``answer_details`` is a chain of
nodes ``{"role", "message", "next": [node]}``: ``system``, ``user``, then ``assistant`` nodes
(thoughts) and ``tool`` nodes whose message is ``{"name", "arguments" (JSON text), "response"}``
(or the ``str()`` of such a dict, possibly cut short); a ``Finish`` tool node ends an answered
episode and its ``arguments`` equal ``final_answer`` (ToolBench's JSON text
``{"return_type": "give_answer" | "give_up_and_restart", "final_answer": ...}``); ``total_steps``
counts the nodes. The evaluator counts only ``tool`` nodes as steps and calls an answer without a
final ``Finish`` node Unsolved.

Export (:func:`trajectory_to_converted`): one ``assistant`` node per chosen step (its code, then
what it printed), one ``tool`` node per tool call of that step (``name``, ``arguments`` as indented
JSON, ``response``), and a ``Finish`` node for ``finish`` and ``give_up`` episodes. Import
(:func:`converted_to_trajectory`): as in ToolBench, a step is one tool call together with the
``assistant`` thought before it, if any (the candidate's ``text``; ``code`` stays ``None``, so
SCEP skips imported runs); a thought without a call is a step of its own; a final ``Finish`` node sets ``final_answer`` and ``finish_type``. What the structured
fields cannot hold exactly (cut-short message strings, the raw final-answer text, the user
message, the answer's own ``method`` and ``total_steps``) is kept in ``extra["stabletoolbench"]``
and on the tool-call dicts, so ``export(import(x)) == x`` for every file of StableToolBench's
results (tested on the six gpt-3.5-turbo CoT groups and the data example).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.jsonl import read_json
from codetool.search.records import Candidate, ImportedCall, ImportedResult, Step, Trajectory
from codetool.secrets import redact_obj

logger = logging.getLogger(__name__)

# Keys of our available_tools entries that are ours, not part of a function schema.
_OUR_TOOL_KEYS = ("tool", "api", "method", "path", "url", "category")
_NAME = re.compile(r"""^\{'name':\s*(['"])(.*?)\1""", re.DOTALL)
_RETURN_TYPE = re.compile(r'"return_type"\s*:\s*"(\w+)"')
_ANSWER_START = re.compile(r'"final_answer"\s*:\s*"')

FINISH_SCHEMA = {
    "name": "Finish",
    "description": "Call this once at the end of the task. With return_type 'give_answer', pass the "
                   "complete answer for the user in final_answer; with 'give_up_and_restart', give up.",
    "parameters": {
        "type": "object",
        "properties": {
            "return_type": {"type": "string", "enum": ["give_answer", "give_up_and_restart"]},
            "final_answer": {"type": "string", "description": "the answer shown to the user (give_answer)"},
        },
        "required": ["return_type"],
    },
}


def _function_schema(entry: dict[str, Any]) -> dict[str, Any]:
    schema = {k: v for k, v in entry.items() if k not in _OUR_TOOL_KEYS}
    schema.setdefault("name", entry.get("name", ""))
    if "description" not in schema:
        schema["description"] = (f'API "{entry.get("api", "")}" of tool "{entry.get("tool", "")}"'
                                 if entry.get("tool") else "")
    schema.setdefault("parameters", {"type": "object", "properties": {}, "required": [], "optional": []})
    return schema


def _finish_arguments(traj: Trajectory) -> str:
    if traj.finish_type == "give_up" and traj.extra.get("answer_procedure") != "reference":
        return json.dumps({"return_type": "give_up_and_restart"}, indent=2)
    return json.dumps({"return_type": "give_answer", "final_answer": traj.final_answer or ""}, indent=2,
                      ensure_ascii=False)


def _tool_message(call: dict[str, Any]) -> dict[str, Any] | str:
    if "stb_message" in call:  # imported, kept verbatim
        return call["stb_message"]
    arguments = call.get("arguments_text")
    if arguments is None:
        arguments = json.dumps(call.get("arguments") or {}, indent=2, ensure_ascii=False)
    response = call.get("response") or call.get("content")
    if response is None or (response == "" and call.get("status", "ok") != "ok"):
        response = json.dumps({"error": call.get("error") or "", "response": ""})
    elif not isinstance(response, str):
        response = json.dumps(response, ensure_ascii=False)
    return {"name": call.get("name", ""), "arguments": arguments, "response": response}


def trajectory_to_converted(traj: Trajectory) -> dict[str, Any]:
    """One entry of a converted-answer file for ``traj`` (see the module docstring)."""
    meta = traj.extra.get("stabletoolbench", {})
    nodes: list[dict[str, Any]] = [{"role": "system", "message": meta.get("system_message", "")},
                                   {"role": "user", "message": meta.get("user_message", "")}]
    for step in traj.steps:
        cand = step.chosen_candidate
        result = cand.result
        if not isinstance(result, ImportedResult) or result.assistant:
            message = cand.text if cand.code is None else cand.code
            printed = result.stdout if cand.code is not None and result is not None else None
            nodes.append({"role": "assistant", "message": message + (f"\nOutput:\n{printed}" if printed else "")})
        for call in result.tool_calls if result is not None else []:
            nodes.append({"role": "tool", "message": _tool_message(call.to_dict())})
    final_answer = meta.get("final_answer_raw")
    # an answer written after the search (CodeTool's practice) is exported as a Finish call, so
    # StableToolBench's evaluator judges it as ours does
    ended = traj.finish_type in ("finish", "give_up") or (
        traj.extra.get("answer_source") == "generated" and bool((traj.final_answer or "").strip()))
    if "finish_message" in meta:
        nodes.append({"role": "tool", "message": meta["finish_message"]})
    elif ended and meta.get("has_finish", True):
        arguments = final_answer if final_answer is not None else _finish_arguments(traj)
        nodes.append({"role": "tool", "message": {"name": "Finish", "arguments": arguments, "response": ""}})
    if final_answer is None:
        final_answer = _finish_arguments(traj) if ended else ""
    chain: list[dict[str, Any]] = []
    for node in reversed(nodes):
        node["next"] = chain
        chain = [node]
    if meta.get("last_without_next"):  # an imported chain whose last node had no "next" key
        nodes[-1].pop("next", None)
    tools = [_function_schema(t) for t in traj.available_tools]
    if not any(t["name"] == "Finish" for t in tools):
        tools.append(json.loads(json.dumps(FINISH_SCHEMA)))
    return {"query": traj.query, "available_tools": tools,
            "answer": {"method": meta.get("answer_method", traj.method),
                       "total_steps": meta.get("total_steps", len(nodes)),
                       "final_answer": final_answer, "answer_details": chain}}


def _parse_message(message: Any) -> dict[str, Any]:
    """A tool node's message as a call dict; ``stb_message`` keeps the message verbatim when the
    call dict would not render back to it exactly (a ``str()`` message, possibly cut short)."""
    parsed: Any = message
    truncated = False
    if isinstance(message, str):
        try:
            parsed = ast.literal_eval(message)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            match = _NAME.match(message)
            parsed, truncated = {"name": match.group(2) if match else ""}, True
    if not isinstance(parsed, dict):
        parsed = {"name": ""}
    call: dict[str, Any] = {"name": str(parsed.get("name", ""))}
    if "arguments" in parsed:
        call["arguments_text"] = parsed["arguments"]
        try:
            call["arguments"] = json.loads(parsed["arguments"])
        except (TypeError, json.JSONDecodeError):
            call["arguments"] = None
    if "response" in parsed:
        call["response"] = parsed["response"]
    call["status"] = _response_status(parsed["response"]) if "response" in parsed else "unknown"
    if truncated:
        call["truncated"] = True
    if _tool_message(call) != message:
        call["stb_message"] = message
    return call


def _response_status(response: Any) -> str:
    try:
        body = json.loads(response) if isinstance(response, str) else response
    except json.JSONDecodeError:
        return "ok"
    if isinstance(body, dict) and body.get("error"):
        return "api_error"
    return "ok"


def _read_final_answer(raw: str) -> tuple[str, str]:
    """``(finish_type, answer text)`` from ToolBench's final-answer JSON text (possibly cut short)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        kind, answer = str(data.get("return_type", "give_answer")), str(data.get("final_answer", ""))
    else:
        match = _RETURN_TYPE.search(raw)
        kind = match.group(1) if match else "give_answer"
        start = _ANSWER_START.search(raw)
        answer = raw[start.end():] if start else raw
        try:  # undo JSON escapes of a cut-short string
            answer = json.loads('"' + answer.rstrip("\\").removesuffix('"') + '"')
        except json.JSONDecodeError:
            pass
    if kind == "give_up_and_restart" or (not isinstance(data, dict) and "give_up_and_restart" in raw):
        return "give_up", answer
    return "finish", answer


def converted_to_trajectory(query_id: str, entry: dict[str, Any], *, group: str | None = None,
                            method: str = "") -> Trajectory:
    """A :class:`Trajectory` from one entry of a converted-answer file.

    Args:
        query_id (`str`): the entry's key.
        entry (`dict`): ``{"query", "available_tools", "answer"}``.
        group (`str`, *optional*): the test group (the file's stem).
        method (`str`, *optional*): the run's name (the folder's name); the answer's own
            ``method`` field is kept in ``extra["stabletoolbench"]["answer_method"]``.

    Raises:
        CodetoolError: the entry lacks a field, or its chain branches.
    """
    try:
        answer, details = entry["answer"], entry["answer"]["answer_details"]
        query, tools = entry["query"], entry["available_tools"]
    except (KeyError, TypeError):
        raise CodetoolError(f"converted answer {query_id}: expected keys query, available_tools and "
                            f"answer.answer_details; got {sorted(entry) if isinstance(entry, dict) else entry!r:.80}."
                            ) from None
    chain = []
    nodes = details
    while nodes:
        if len(nodes) > 1:
            raise CodetoolError(f"converted answer {query_id}: the answer branches ({len(nodes)} next nodes); "
                                f"StableToolBench's converter reduces answers to one path first.")
        chain.append(nodes[0])
        nodes = nodes[0].get("next") or []
    if len(chain) < 2 or chain[0].get("role") != "system" or chain[1].get("role") != "user":
        raise CodetoolError(f"converted answer {query_id}: the chain must start with system and user nodes.")
    meta: dict[str, Any] = {"answer_method": answer.get("method", ""), "total_steps": answer.get("total_steps"),
                            "final_answer_raw": answer.get("final_answer", ""),
                            "system_message": chain[0].get("message", ""), "user_message": chain[1].get("message", "")}
    if "next" not in chain[-1]:  # StableToolBench's get_steps never reads such a node: keep the shape
        meta["last_without_next"] = True
    body = chain[2:]
    finish = None
    if body and body[-1].get("role") == "tool":
        last = _parse_message(body[-1]["message"])
        if last["name"] == "Finish":
            finish, body = last, body[:-1]
            expected = {"name": "Finish", "arguments": meta["final_answer_raw"], "response": ""}
            if chain[-1]["message"] != expected:
                meta["finish_message"] = chain[-1]["message"]
    steps: list[Step] = []
    for node in body:
        role = node.get("role")
        if role == "assistant":
            steps.append(_step(len(steps), str(node.get("message") or ""), True))
        elif role == "tool":
            # A ToolBench step is one call, with the thought before it if there was one.
            prev = steps[-1].candidates[0].result if steps else None
            if not isinstance(prev, ImportedResult) or not prev.assistant or prev.tool_calls:
                steps.append(_step(len(steps), "", False))
            result = steps[-1].candidates[0].result
            assert isinstance(result, ImportedResult)  # every step _step makes holds one
            result.tool_calls.append(ImportedCall(_parse_message(node["message"])))
        else:
            raise CodetoolError(f"converted answer {query_id}: unknown node role {role!r}.")
    if finish is None:
        finish_type, final_answer = "max_steps", None
        meta["has_finish"] = False
    else:
        finish_type, final_answer = _read_final_answer(meta["final_answer_raw"])
    traj = Trajectory(query_id=str(query_id), query=query, benchmark="stabletoolbench", group=group,
                      method=method or answer.get("method", ""), steps=steps, final_answer=final_answer,
                      finish_type=finish_type, available_tools=list(tools))
    traj.extra["stabletoolbench"] = meta
    return traj


def _step(index: int, text: str, assistant: bool) -> Step:
    result = ImportedResult(assistant=assistant)
    return Step(index=index, candidates=[Candidate(index=0, text=text, code=None, result=result, chosen=True)],
                chosen=0)


def import_converted(path: str | Path) -> list[Trajectory]:
    """Trajectories from ``<method>/<group>.json`` (one file) or a ``<method>/`` folder of them.

    Raises:
        CodetoolError: the path is missing or a file is not a converted-answer mapping.
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise CodetoolError(f"no converted-answer files at {path}; pass model_predictions_converted/<method>/"
                            f"<group>.json or its folder.")
    out: list[Trajectory] = []
    for file in files:
        data = read_json(file, "a converted-answer file (query_id -> answer)")
        if not isinstance(data, dict):
            raise CodetoolError(f"{file}: expected a mapping query_id -> answer, got {type(data).__name__}.")
        try:
            out.extend(converted_to_trajectory(qid, entry, group=file.stem, method=file.parent.name)
                       for qid, entry in data.items())
        except CodetoolError as e:
            raise CodetoolError(f"{file}: {e}") from None
    logger.info("imported %d converted answers from %s", len(out), path)
    return out


def export_converted(trajs: list[Trajectory], out_dir: str | Path, method: str | None = None) -> list[Path]:
    """Write ``<out_dir>/<method>/<group>.json`` files for StableToolBench's evaluator (redacted).

    Args:
        method (`str`, *optional*): the folder name (default: each trajectory's ``method``).

    Returns:
        The files written, one per (method, group); a trajectory without a group goes to ``all.json``.
    """
    files: dict[Path, dict[str, Any]] = {}
    for traj in trajs:
        folder = _safe(method or traj.method or "method")
        target = Path(out_dir) / folder / f"{_safe(traj.group or 'all')}.json"
        files.setdefault(target, {})[traj.query_id] = trajectory_to_converted(traj)
    for target, data in files.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(redact_obj(data), ensure_ascii=False, indent=2))
        tmp.replace(target)
    return sorted(files)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_") or "x"
