"""Render APIs as Python function stubs for the policy's prompt.

Each API becomes ``def <name>(<typed parameters>) -> <type>:`` with a docstring holding the API's
description, one line per parameter (type, required or optional, description, example or allowed
values) and a short sketch of the response. Required parameters come first and have no default;
optional ones show the documented default when it is a short literal, else ``None``, and an
argument left out is not sent to the API at all. ``finish(answer)`` and ``give_up(reason)`` close
every rendering. The output is valid Python (``ast.parse`` accepts it) and depends only on the APIs.

Function names come from :func:`codetool.tools.names.assign_function_names` (ToolBench's
``<api>_for_<tool>``); parameter names from :func:`codetool.tools.names.python_parameters`.
Descriptions are cut to 300 characters and response sketches to 300, to keep prompts short.
The ``compact`` style keeps the signature and a one-line docstring (description and response
sketch cut to 100 characters each): about a third of the tokens, for small models on a CPU. The
``brief`` style is one line per function, the signature and a comment of at most 60 characters:
for large tool sets (RestBench-TMDB's 54 operations) in a small model's context.
"""

from __future__ import annotations

import json
from typing import Any

from codetool.tools.names import assign_function_names, python_parameters
from codetool.tools.simulator import parse_template
from codetool.tools.spec import APISpec, Parameter

MAX_DESCRIPTION_CHARS = 300
MAX_SKETCH_CHARS = 300
COMPACT_CHARS = 100
RENDER_STYLES = ("full", "compact", "brief")
BRIEF_CHARS = 60
_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
             "object": "dict"}

FINISH_STUBS = '''def finish(answer: str) -> None:
    """Give the final answer to the user and end the task. Call it once, with the complete answer."""


def give_up(reason: str) -> None:
    """Stop without an answer, when the task cannot be solved with these tools; say why."""
'''


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _doc_safe(text: str) -> str:
    """Text that cannot end or break a triple-quoted docstring."""
    return text.replace("\\", "\\\\").replace('"""', "'''")


def sketch_response(sketch: Any, limit: int = MAX_SKETCH_CHARS) -> str:
    """A compact picture of a response: ``{"name": str, "items": [{"id": int}, ...]}``."""

    def walk(node: Any, depth: int) -> str:
        if depth > 4:
            return "..."
        if isinstance(node, dict):
            inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {walk(v, depth + 1)}"
                              for k, v in node.items() if k != "_list_length")
            return "{" + inner + "}"
        if isinstance(node, list):
            if not node:
                return "[]"
            head = node[0]
            if isinstance(head, str) and head.startswith("list of "):
                return f"[{head[8:].split(' ')[0]}, ...]"
            return f"[{walk(head, depth + 1)}, ...]"
        if isinstance(node, str):
            kinds = {"str": "str", "int": "int", "float": "float", "bool": "bool", "NoneType": "None",
                     "empty list": "[]"}
            return kinds.get(node, json.dumps(node, ensure_ascii=False)[:40])
        return type(node).__name__ if not isinstance(node, bool) else "bool"

    text = walk(sketch, 0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _default_literal(param: Parameter) -> str:
    """The signature default of an optional parameter: a short literal, else ``None``."""
    value = param.default
    if isinstance(value, str) and param.type in ("integer", "number"):
        try:
            value = int(value) if param.type == "integer" else float(value)
        except ValueError:
            return "None"
    if isinstance(value, str) and param.type == "boolean" and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if isinstance(value, (str, int, float, bool)) and len(repr(value)) <= 40 and value != "":
        return repr(value)
    return "None"


def _param_line(name: str, param: Parameter) -> str:
    kind = _PY_TYPES.get(param.type, "str")
    text = _clip(param.description, 150)
    if param.enum:
        text += f" One of: {', '.join(map(str, param.enum[:12]))}."
    elif param.required and param.default not in (None, ""):
        text += f" Example: {_clip(repr(param.default), 60)}."
    where = "" if param.location in ("query", "") else f", in {param.location}"
    status = "required" if param.required else "optional"
    return f"        {name} ({kind}, {status}{where}): {text.strip()}".rstrip()


def _returns(api: APISpec) -> tuple[str, str]:
    """(annotation, sketch) of the response."""
    sketch = parse_template(api.template_response)
    if sketch in (None, "", {}) and api.example_response is not None:
        sketch = api.example_response
    if isinstance(sketch, dict) and sketch:
        return "dict", sketch_response(sketch)
    if isinstance(sketch, list):
        return "list", sketch_response(sketch)
    return "dict | list | str", "JSON data or text"


def render_function(api: APISpec, style: str = "full") -> str:
    """One API as a Python stub (``api.name`` must be set; see ``assign_function_names``).

    Args:
        style (`str`, *optional*, defaults to ``"full"``): ``full`` or ``compact`` (module docstring).
    """
    if style not in RENDER_STYLES:
        raise ValueError(f"render style must be one of {RENDER_STYLES}, got {style!r}.")
    params = python_parameters(api)
    signature = []
    for name, param in params.items():
        annotation = _PY_TYPES.get(param.type, "str")
        signature.append(f"{name}: {annotation}" if param.required
                         else f"{name}: {annotation} | None = {_default_literal(param)}")
    annotation, sketch = _returns(api)
    if style == "brief":
        summary = _clip(api.description, BRIEF_CHARS) or f"{api.api} ({api.tool})."
        return f"def {api.name}({', '.join(signature)}) -> {annotation}: ...  # {' '.join(summary.split())}"
    if style == "compact":
        summary = _clip(api.description, COMPACT_CHARS) or f"{api.api} ({api.tool})."
        return (f"def {api.name}({', '.join(signature)}) -> {annotation}:\n"
                f'    """{_doc_safe(summary)} Returns {_doc_safe(_clip(sketch, COMPACT_CHARS))}"""')
    summary = _clip(api.description, MAX_DESCRIPTION_CHARS) or f"Call {api.api} of {api.tool}."
    lines = [f"def {api.name}({', '.join(signature)}) -> {annotation}:", f'    """{_doc_safe(summary)}', ""]
    origin = (f"Endpoint: {api.method} {api.path or api.url}" if api.category == "openapi"
              else f"Tool: {api.tool} (category {api.category}), API: {api.api}")
    if api.tool_description:
        origin += f". About the tool: {_clip(api.tool_description, 150)}"
    lines.append(f"    {_doc_safe(origin)}")
    if params:
        lines.append("    Args:")
        lines += [_doc_safe(_param_line(name, param)) for name, param in params.items()]
    lines += ["    Returns:", f"        {_doc_safe(sketch)}", '    """']
    return "\n".join(lines)


def render_tools(apis: list[APISpec], style: str = "full") -> str:
    """All APIs as Python stubs, in the given order, followed by ``finish`` and ``give_up``.

    Function names are assigned first when any API has none (``assign_function_names``).
    """
    if any(not api.name for api in apis):
        assign_function_names(apis)
    blocks = [render_function(api, style) for api in apis]
    blocks.append(FINISH_STUBS.rstrip("\n"))
    return {"brief": "\n", "compact": "\n\n"}.get(style, "\n\n\n").join(blocks) + "\n"
