"""OpenAPI 3 specs -> one :class:`APISpec` per operation (RestBench TMDB and any other service).

Each operation becomes an API named ``"<METHOD> <path>"`` (RestBench's own gold-path format, e.g.
``"GET /movie/{movie_id}/credits"``) with typed path, query and header parameters (path-level
parameters are merged in, an operation's own declaration wins), JSON request-body properties as
``body`` parameters, the 200 example response kept for the simulator and the mock server, and the
200 schema turned into a ``template_response`` sketch. Local ``$ref`` pointers are resolved (a
reference cycle is cut where it closes).

CodeTool's flattened TMDB spec (``{"servers", "headers", "endpoints": [...]}``) is read too; its
path parameters are implicit in the URL template and are added here. Its ``headers`` (which
upstream carry an access token) are ignored: tokens come only from the environment.

A flag written as text is read as the text says (``required: "false"``, as RestGPT's specs write
it, is not required: :func:`spec_bool`).

Not supported: Swagger 2.0, remote ``$ref``s, form-encoded bodies, per-operation servers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from codetool import CodetoolError
from codetool.tools.simulator import schema_to_template
from codetool.tools.spec import APISpec, Parameter

HTTP_METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
_PATH_PARAM = re.compile(r"{([^{}]+)}")


class _Refs:
    """Resolves local ``#/...`` references of one document."""

    def __init__(self, document: dict):
        self.document = document

    def resolve(self, node: Any, seen: tuple[str, ...] = ()) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                if ref in seen or len(seen) >= 8:  # a cycle (or a very deep chain): cut it here
                    return {}
                target: Any = self.document
                for part in ref[2:].split("/"):
                    target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
                return self.resolve(target, seen + (ref,))
            return {k: self.resolve(v, seen) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, seen) for v in node]
        return node


def spec_bool(value: Any) -> bool:
    """An OpenAPI flag as the spec means it: ``True``/``False``, or the same written as text
    (``"false"``, ``"True"``, ``"no"``, ``"0"``: RestGPT's specs write ``required: "false"``).
    Anything else that is not plainly false (a missing flag, ``None``, ``""``) is false."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "y", "on")
    return bool(value)


def _parameter(raw: dict) -> Parameter:
    schema = raw.get("schema") or {}
    location = str(raw.get("in", "query"))
    default = schema.get("default", raw.get("example", schema.get("example")))
    return Parameter(name=str(raw.get("name", "")), type=str(schema.get("type") or "string"),
                     description=str(raw.get("description") or "").strip(), default=default,
                     required=spec_bool(raw.get("required")) or location == "path", location=location,
                     enum=list(schema["enum"]) if isinstance(schema.get("enum"), list) else None)


def _merge_parameters(path: str, *groups: list[dict] | None) -> list[Parameter]:
    merged: dict[tuple[str, str], Parameter] = {}
    for group in groups:
        for raw in group or []:
            if isinstance(raw, dict) and raw.get("name"):
                param = _parameter(raw)
                merged[(param.name, param.location)] = param
    for name in _PATH_PARAM.findall(path):  # declared or not, a template variable is a path parameter
        if (name, "path") not in merged:
            kind = "integer" if name.endswith("_number") else "string"
            merged[(name, "path")] = Parameter(name=name, type=kind, description="path parameter",
                                               required=True, location="path")
    params = list(merged.values())
    return [p for p in params if p.required] + [p for p in params if not p.required]


def _body_parameters(body: Any) -> list[Parameter]:
    if not isinstance(body, dict):
        return []
    schema = ((body.get("content") or {}).get("application/json") or {}).get("schema") or {}
    listed = schema.get("required")  # JSON Schema: a list of names (a bare flag here means nothing)
    required = {str(n) for n in listed} if isinstance(listed, list) else set()
    return [Parameter(name=name, type=str(prop.get("type") or "string"), description=str(prop.get("description") or ""),
                      default=prop.get("default"), required=name in required, location="body")
            for name, prop in (schema.get("properties") or {}).items() if isinstance(prop, dict)]


def _success_response(responses: Any) -> tuple[Any, Any]:
    """(schema, example) of the 200/201/default JSON response."""
    if not isinstance(responses, dict):
        return None, None
    if "content" in responses:  # CodeTool's flat spec stores the 200 response object directly
        chosen = responses
    else:
        chosen = next((responses[c] for c in ("200", "201", "default") if c in responses), {})
    media = ((chosen or {}).get("content") or {}).get("application/json") or {}
    example = media.get("example")
    if example is None and isinstance(media.get("examples"), dict):
        first: Any = next(iter(media["examples"].values()), {})
        example = first.get("value") if isinstance(first, dict) else None
    return media.get("schema"), example


def _api(*, tool: str, method: str, path: str, url: str, description: str, params: list[Parameter],
         responses: Any) -> APISpec:
    schema, example = _success_response(responses)
    return APISpec(category="openapi", tool=tool, api=f"{method.upper()} {path}", description=description,
                   parameters=params, method=method.upper(), url=url, path=path,
                   template_response=schema_to_template(schema) if schema else None, example_response=example)


def _from_openapi(document: dict, tool: str) -> list[APISpec]:
    refs = _Refs(document)
    server = str(((document.get("servers") or [{}])[0] or {}).get("url", "")).rstrip("/")
    apis = []
    for path, item in (document.get("paths") or {}).items():
        item = refs.resolve(item)
        for method, op in item.items():
            if method.lower() not in HTTP_METHODS or not isinstance(op, dict):
                continue
            params = _merge_parameters(path, item.get("parameters"), op.get("parameters"))
            params += _body_parameters(op.get("requestBody"))
            parts = [t.strip() for t in (op.get("summary"), op.get("description")) if isinstance(t, str) and t.strip()]
            if len(parts) == 2 and parts[0][-1] not in ".!?:":
                parts[0] += "."
            text = " ".join(parts)
            apis.append(_api(tool=tool, method=method, path=path, url=server + path, description=text,
                             params=params, responses=op.get("responses")))
    return apis


def _from_flat_endpoints(document: dict, tool: str) -> list[APISpec]:
    server = str(((document.get("servers") or [{}])[0] or {}).get("url", "")).rstrip("/")
    apis = []
    for ep in document.get("endpoints") or []:
        url = str(ep.get("url", ""))
        path = url[len(server):] if server and url.startswith(server) else "/" + url.split("://", 1)[-1].split("/", 1)[-1]
        params = _merge_parameters(path, ep.get("parameters")) + _body_parameters(ep.get("requestBody"))
        apis.append(_api(tool=tool, method=str(ep.get("method", "GET")), path=path, url=url,
                         description=str(ep.get("description") or "").strip(), params=params,
                         responses=ep.get("responses")))
    return apis


def load_openapi(path: Path, tool: str | None = None) -> list[APISpec]:
    """One :class:`APISpec` per operation of an OpenAPI 3 document (or CodeTool's flat TMDB spec).

    Args:
        path (`Path`): a JSON (or ``.yaml``/``.yml``) spec file.
        tool (`str`, *optional*): the tool name; defaults to ``info.title`` (or the file name).

    Raises:
        CodetoolError: the file is missing, not JSON, or not an OpenAPI 3 document.
    """
    path = Path(path)
    if not path.is_file():
        from codetool.tools.data import fetch_hint

        raise CodetoolError(f"OpenAPI spec not found: {path}. Run '{fetch_hint(path)}' or set CODETOOL_DATA to "
                            "the folder that holds it.")
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            document = yaml.safe_load(text)
        else:
            document = json.loads(text)
    except RecursionError:
        raise CodetoolError(f"{path} is nested too deeply to be an OpenAPI spec.") from None
    except Exception as e:  # ValueError (UnicodeDecodeError too), yaml.YAMLError
        raise CodetoolError(f"{path} does not parse ({type(e).__name__}: {str(e)[:120]}).") from None
    return openapi_from_document(document, path, tool)


def openapi_from_document(document: Any, path: Path, tool: str | None = None) -> list[APISpec]:
    """:func:`load_openapi` on a document already read from ``path`` (named in errors).

    Raises:
        CodetoolError: ``document`` is not an OpenAPI 3 document (Swagger 2.0 is named as such).
    """
    if not isinstance(document, dict):
        raise CodetoolError(f"{path}: expected an OpenAPI object, got {type(document).__name__}.")
    tool = tool or str((document.get("info") or {}).get("title") or Path(path).stem)
    if "endpoints" in document:
        return _from_flat_endpoints(document, tool)
    if str(document.get("openapi", "")).startswith("3") and isinstance(document.get("paths"), dict):
        return _from_openapi(document, tool)
    if "swagger" in document:
        raise CodetoolError(f"{path}: a Swagger {document.get('swagger')} spec; convert it to OpenAPI 3 first "
                            "(e.g. npx swagger2openapi spec.json -o openapi.json).")
    raise CodetoolError(f"{path}: not an OpenAPI 3 document (no 'openapi: 3.x' and 'paths'); Swagger 2.0 "
                        f"specs must be converted first (e.g. with swagger2openapi).")


def operation_key(method: str, path: str) -> str:
    """A name-insensitive key of an operation: ``GET /movie/{movie_id}`` and CodeTool's
    ``GET_movie_movie_id`` both give ``get_movie_movie_id``."""
    return re.sub(r"[^a-z0-9]+", "_", f"{method} {path}".lower()).strip("_")
