"""Names and keys: ToolBench's name standardisation, Python function and parameter names, and
canonical call arguments.

Four kinds of names and keys meet here:

- **ToolBench/StableToolBench names** (``standardize``, ``change_name``, ``standardize_category``):
  the server, its response cache folders and its function names are all built from these, so they
  follow ToolBench's rules exactly (including their quirks: ``^`` survives, a leading digit gets a
  ``get_`` prefix, a few reserved words get ``is_``).
- **Function names** the policy calls: ToolBench's ``<api>_for_<tool>``, keeping the *last* 64
  characters as ToolBench does, then made a valid Python identifier; collisions inside one set of
  APIs are resolved deterministically (see :func:`assign_function_names`).
- **Parameter names**: benchmark parameter names such as ``from``, ``accept-language`` or
  ``domain[id]`` are not Python identifiers; :func:`python_parameters` maps each to one that is
  (``from_``, ``accept_language``, ``domain_id``) and back.
- **Canonical arguments** (:func:`canonical_arguments`): the key of a call for the response cache
  and the simulator's seed, insensitive to argument order and to ``1`` vs ``"1"``.

Not handled: two parameters of one API whose names differ only in characters that are cleaned away
get suffixes (``id``, ``id_2``), so the second is reachable only under its suffixed name.
"""

from __future__ import annotations

import json
import keyword
import re
from collections import defaultdict
from collections.abc import Iterable

from codetool.tools.spec import APISpec, Parameter

MAX_NAME_LENGTH = 64  # OpenAI function-name limit, kept by ToolBench
RESERVED_FUNCTIONS = ("finish", "give_up")

# ToolBench keeps CJK, ASCII letters and digits, "_" and (a quirk of its regex) "^".
_NOT_TOOLBENCH_CHAR = re.compile(r"[^\u4e00-\u9fa5a-zA-Z0-9_^]")
_CHANGED_WORDS = ("from", "class", "return", "false", "true", "id", "and")


def standardize(text: str) -> str:
    """ToolBench's ``standardize``: other characters become ``_``, runs of ``_`` collapse, lower case,
    no leading/trailing ``_``, and a leading digit gets a ``get_`` prefix.

    Example: ``"Songkick concert"`` -> ``"songkick_concert"``; ``"10000+ Anime"`` -> ``"get_10000_anime"``.
    """
    text = _NOT_TOOLBENCH_CHAR.sub("_", text)
    text = re.sub(r"_+", "_", text).lower().strip("_")
    if text and text[0].isdigit():
        text = "get_" + text
    return text


def change_name(name: str) -> str:
    """ToolBench's ``change_name``: a few reserved words (``id``, ``from``, ...) get an ``is_`` prefix."""
    return f"is_{name}" if name in _CHANGED_WORDS else name


def standardize_category(category: str) -> str:
    """ToolBench's category folder name: spaces, commas and slashes become ``_`` (``"News, Media"`` ->
    ``"News_Media"``); case is kept."""
    text = re.sub(r"[ ,/]", "_", category)
    return text.replace("__", "_")


def api_key_name(api: APISpec) -> str:
    """The API part of StableToolBench's request and cache file name: ``change_name(standardize(api))``."""
    return change_name(standardize(api.api))


def _identifier(text: str, fallback: str) -> str:
    """Make ``text`` a valid, non-keyword Python identifier (ASCII and CJK only)."""
    text = re.sub(r"[^\u4e00-\u9fa5a-zA-Z0-9_]", "_", text)
    text = re.sub(r"_+", "_", text).strip("_")
    text = re.sub(r"^[0-9_]+", "", text) if text[:1].isdigit() else text
    if not text:
        text = fallback
    if keyword.iskeyword(text):
        text += "_"
    return text


def base_function_name(api: APISpec) -> str:
    """ToolBench's function name ``<api>_for_<tool>`` (last 64 characters), as a Python identifier."""
    full = f"{api_key_name(api)}_for_{standardize(api.tool)}"
    name = _identifier(full[-MAX_NAME_LENGTH:], "api")
    if name in RESERVED_FUNCTIONS:
        name = f"{name}_api"
    return name


def _with_suffix(base: str, number: int) -> str:
    suffix = f"_{number}"
    return _identifier(base[-(MAX_NAME_LENGTH - len(suffix)):] + suffix, "api")


def assign_function_names(apis: Iterable[APISpec]) -> None:
    """Set ``api.name`` for every API: unique, at most 64 characters, valid Python identifiers.

    Names follow ToolBench's ``<api>_for_<tool>`` convention. When several APIs share a name (after
    cleaning or after keeping the last 64 characters), they are ordered by ``(category, tool, api,
    method, path)``; the first keeps the name and the others get ``_2``, ``_3``, ... so the result
    does not depend on the order of ``apis``. ``finish`` and ``give_up`` are never used.
    """
    apis = list(apis)
    groups: dict[str, list[APISpec]] = defaultdict(list)
    for api in apis:
        groups[base_function_name(api)].append(api)
    taken = set(groups) | set(RESERVED_FUNCTIONS)
    for base in sorted(groups):
        members = sorted(groups[base], key=lambda a: (a.category, a.tool, a.api, a.method, a.path))
        members[0].name = base
        number = 2
        for api in members[1:]:
            while _with_suffix(base, number) in taken:
                number += 1
            api.name = _with_suffix(base, number)
            taken.add(api.name)
            number += 1


def python_parameters(api: APISpec) -> dict[str, Parameter]:
    """Python argument name -> parameter, in signature order (required first, then optional).

    Names are the benchmark's names made into identifiers (``from`` -> ``from_``,
    ``accept-language`` -> ``accept_language``); duplicates get ``_2``, ``_3``.
    """
    out: dict[str, Parameter] = {}
    ordered = [p for p in api.parameters if p.required] + [p for p in api.parameters if not p.required]
    for param in ordered:
        name = _identifier(param.name, "arg")
        if name in out:
            number = 2
            while f"{name}_{number}" in out:
                number += 1
            name = f"{name}_{number}"
        out[name] = param
    return out


_PLAIN_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def _canonical_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if value is None or isinstance(value, str) and value.strip().lower() in ("none", "null"):
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            return text.lower()
        if _PLAIN_NUMBER.fullmatch(text):
            return _canonical_value(float(text)) if "." in text else str(int(text))
        return value
    if isinstance(value, dict):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    return str(value)


def canonical_arguments(arguments: dict | None) -> str:
    """A canonical text form of call arguments, for cache keys and simulator seeds.

    Key order does not matter, and scalars are compared as text: ``1``, ``1.0`` and ``"1"`` are the
    same, as are ``True``, ``"true"`` and ``"True"``. Strings that are not plain numbers or
    booleans are kept as they are (``"01234"`` stays distinct from ``1234``).
    """
    return json.dumps(_canonical_value(dict(arguments or {})), sort_keys=True, ensure_ascii=False)
