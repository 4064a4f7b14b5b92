"""A deterministic, offline tool simulator built from ToolBench ``template_response`` sketches and
OpenAPI example responses.

ToolBench describes most APIs' responses with a type sketch such as
``{"name": "str", "items": [{"id": "int", "_list_length": 3}], "tags": ["list of str with length 2"]}``.
:class:`SimulatorBackend` turns a sketch into a concrete value: types and nesting are kept, lists
have their ``_list_length``, and every value comes from a random generator seeded by a hash of the
API and the canonical arguments (:func:`codetool.tools.names.canonical_arguments`), so the same call
always gets the same answer and argument order or ``1`` vs ``"1"`` does not change it. A string
field outside any list that is named like an argument echoes it (``symbol`` -> ``"AAPL"``). An OpenAPI
operation with an example response answers with that example. Every response is labelled
``simulated=True`` and ``source="simulator"``.

About 6% of StableToolBench sketches are JSON text cut at 1,000 characters; :func:`parse_template`
repairs them by cutting back to the last complete value and closing the open brackets.

Limits: values are plausible in type only (strings are made-up words, ids are hex, numbers are
random); nothing is consistent across APIs (an id returned by a search is not known to a details
API), and APIs without any sketch get a small generic object that echoes the arguments.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import time
from typing import Any

from codetool.tools.names import canonical_arguments
from codetool.tools.spec import APISpec, ToolResponse

_LIST_OF = re.compile(r"list of (\w+) with length (\d+)")
_WORDS = ("amber", "harbor", "silver", "maple", "orbit", "quartz", "river", "summit", "willow",
          "cobalt", "meadow", "falcon", "ember", "lagoon", "atlas", "cedar", "delta", "echo",
          "fjord", "garnet", "horizon", "iris", "juniper", "kestrel", "lumen", "nova", "onyx")


def repair_truncated_json(text: str) -> Any:
    """Parse JSON text that may have been cut off; returns ``None`` if nothing sensible remains.

    Cuts back to the last complete value and closes the brackets still open there, e.g.
    ``'{"a": "str", "b": [{"c": "int", "d'`` -> ``{"a": "str", "b": [{"c": "int"}]}``.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    stack: list[str] = []
    in_string = escaped = False
    cuts: list[tuple[int, str]] = []  # (end index, closing brackets needed there)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                cuts.append((i + 1, "".join(reversed(stack))))
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
            cuts.append((i + 1, "".join(reversed(stack))))
        elif ch in "}]":
            if stack:
                stack.pop()
            cuts.append((i + 1, "".join(reversed(stack))))
        elif ch.isalnum():
            cuts.append((i + 1, "".join(reversed(stack))))
    for end, closers in reversed(cuts[-500:]):
        try:
            return json.loads(text[:end] + closers)
        except ValueError:
            continue
    return None


@functools.lru_cache(maxsize=4096)
def _parse_text_template(text: str) -> Any:
    return repair_truncated_json(text) if text.lstrip()[:1] in ("{", "[") else text


def parse_template(template: Any) -> Any:
    """A ``template_response`` as data: JSON text (possibly truncated) is parsed, anything else is
    returned unchanged."""
    return _parse_text_template(template) if isinstance(template, str) else template


def schema_to_template(schema: Any, depth: int = 0) -> Any:
    """Turn an (already ``$ref``-resolved) JSON schema into a ToolBench-style type sketch."""
    if not isinstance(schema, dict) or depth > 8:
        return "str"
    kind = schema.get("type")
    if isinstance(schema.get("properties"), dict) or kind == "object":
        return {k: schema_to_template(v, depth + 1) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        item = schema_to_template(schema.get("items", {}), depth + 1)
        return [dict(item, _list_length=2)] if isinstance(item, dict) else [f"list of {item} with length 2"]
    return {"integer": "int", "number": "float", "boolean": "bool"}.get(kind if isinstance(kind, str) else "", "str")


class _Generator:
    """Fills a sketch with values from one seeded random generator."""

    def __init__(self, rng: random.Random, arguments: dict, max_list_length: int):
        self.rng = rng
        self.arguments = {str(k).lower(): v for k, v in arguments.items()}
        self.max_list_length = max_list_length

    def value(self, sketch: Any, key: str = "", in_list: bool = False) -> Any:
        if isinstance(sketch, dict):
            return {k: self.value(v, k, in_list) for k, v in sketch.items() if k != "_list_length"}
        if isinstance(sketch, list):
            return self.items(sketch, key)
        if isinstance(sketch, str):
            return self.scalar(sketch, key, echo=not in_list)
        return sketch  # literal numbers, booleans, None

    def items(self, sketch: list, key: str) -> list:
        out: list = []
        for item in sketch:
            match = _LIST_OF.fullmatch(item.strip()) if isinstance(item, str) else None
            if isinstance(item, dict) and "_list_length" in item:
                count = min(int(item.get("_list_length") or 0), self.max_list_length)
                out.extend(self.value(item, key, in_list=True) for _ in range(count))
            elif match:
                count = min(int(match.group(2)), self.max_list_length)
                out.extend(self.scalar(match.group(1), key, echo=False) for _ in range(count))
            else:
                out.append(self.value(item, key, in_list=True))
        return out

    def scalar(self, sketch: str, key: str, echo: bool = True) -> Any:
        kind = sketch.strip()
        match = _LIST_OF.fullmatch(kind)
        if match:
            count = min(int(match.group(2)), self.max_list_length)
            return [self.scalar(match.group(1), key, echo=False) for _ in range(count)]
        rng = self.rng
        if kind == "str":
            return self.text(key, echo)
        if kind == "int":
            return rng.randint(1950, 2024) if "year" in key.lower() else rng.randint(0, 1000)
        if kind == "float":
            return round(rng.uniform(0, 100), 2)
        if kind == "bool":
            return rng.random() < 0.5
        if kind in ("NoneType", "None"):
            return None
        if kind in ("empty list", "list"):
            return []
        if kind == "dict":
            return {}
        return sketch  # a literal string in the sketch

    def text(self, key: str, echo: bool = False) -> str:
        echoed = self.arguments.get(key.lower()) if echo and key else None
        if isinstance(echoed, (str, int, float)) and not isinstance(echoed, bool):
            return str(echoed)  # e.g. a top-level "symbol": the symbol the caller asked for
        rng, lower = self.rng, key.lower()
        if any(part in lower for part in ("url", "link", "image", "thumbnail", "href")):
            return f"https://example.com/{lower or 'item'}/{rng.getrandbits(32):08x}"
        if "date" in lower or lower.endswith("_at") or "time" in lower:
            return f"{rng.randint(2000, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if "email" in lower:
            return f"{rng.choice(_WORDS)}{rng.randint(1, 99)}@example.com"
        if lower == "id" or lower.endswith("id") or lower.endswith("_key"):
            return f"{rng.getrandbits(48):012x}"
        return f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS).title()}"


def _seed(api: APISpec, arguments: dict, seed: int) -> int:
    blob = f"{seed}|{api.category}|{api.tool}|{api.api}|{canonical_arguments(arguments)}".encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


class SimulatorBackend:
    """Answers every call offline from the API's example response or ``template_response``.

    Args:
        seed (`int`, *optional*, defaults to `0`): mixed into every call's seed; change it to get a
            different (still deterministic) world.
        max_list_length (`int`, *optional*, defaults to `100`): cap on ``_list_length`` (a few
            sketches ask for hundreds of items).
        use_examples (`bool`, *optional*, defaults to `True`): answer with the OpenAPI example
            response when the API has one.
    """

    name = "simulator"
    real = False  # its answers are never recorded into a response cache

    def __init__(self, *, seed: int = 0, max_list_length: int = 100, use_examples: bool = True):
        self.seed = seed
        self.max_list_length = max_list_length
        self.use_examples = use_examples

    def simulate(self, api: APISpec, arguments: dict) -> Any:
        """The simulated response body (JSON-able data) for one call."""
        if self.use_examples and api.example_response is not None:
            return json.loads(json.dumps(api.example_response))
        rng = random.Random(_seed(api, arguments, self.seed))
        generator = _Generator(rng, arguments, self.max_list_length)
        sketch = parse_template(api.template_response)
        if sketch is None or sketch == "" or sketch == {}:
            return {"result": generator.text("result"), "api": api.api, "input": dict(sorted(arguments.items()))}
        return generator.value(sketch)

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        start = time.perf_counter()
        try:
            body = self.simulate(api, arguments)
            content = json.dumps(body, ensure_ascii=False) if not isinstance(body, str) else body
        except Exception as e:  # a malformed sketch must not break the call
            return ToolResponse("error", error=f"simulator failed: {type(e).__name__}: {e}"[:300],
                                latency_s=time.perf_counter() - start, source=self.name, simulated=True)
        return ToolResponse("ok", content=content, latency_s=time.perf_counter() - start,
                            source=self.name, simulated=True)
