"""The HTTP side of the tool backends: one request as a :class:`ToolResponse`, and the two
clients built on it.

- :func:`http_call`: a request that never raises; a hang is a ``timeout``, an HTTP error (HTML
  page or not) an ``http_error`` with a one-line reason, a non-JSON body comes back as text, and a
  body larger than ``max_body_bytes`` is cut there (``truncated=True``). What is the service's
  failure, not an answer to the arguments (a hang, a failed or broken connection, HTTP
  502/503/504) is marked ``outage``: the executor never charges it to the step's code. An HTTP 429
  is not: the callers' own rate brought it (the client waits and retries it first). Every wait
  ends by the caller's :data:`~codetool.tools.spec.CALL_DEADLINE` when one is set.
- :class:`StableToolBenchClient`: POSTs StableToolBench's ``/virtual`` request (``category``,
  ``tool_name``, ``api_name``, ``tool_input``, ``strip``, ``toolbench_key``) to a user-given URL;
  the key comes from an environment variable; timeouts and retries with backoff.
- :class:`HTTPBackend`: plain HTTP for OpenAPI services (TMDB), bearer token from the environment;
  path parameters are checked against their declared type (:func:`path_segment`).

Keys are sent only in headers/bodies of the request, never logged, and redacted from every error
message and response. Not done: rate limiting, RapidAPI's own key headers, request signing, or
non-JSON request bodies.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any
from urllib.parse import quote

from codetool import CodetoolError
from codetool.retry import RetryPolicy
from codetool.secrets import redact
from codetool.tools.names import api_key_name, standardize
from codetool.tools.spec import APISpec, ToolResponse, remaining_s

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_RETRY_HTTP = (429, 502, 503, 504)
_OUTAGE_HTTP = (502, 503, 504)  # the service (or its gateway) failed: ToolResponse.outage


def _http_reason(status: int, text: str, content_type: str) -> str:
    """One line for the model: what went wrong, without a page of HTML."""
    head = text.lstrip()[:200]
    if "html" in content_type.lower() or head.startswith("<"):
        return f"HTTP {status} from the API (an HTML error page)"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for field in ("status_message", "message", "error", "detail"):
            if isinstance(data.get(field), str) and data[field].strip():
                return f"HTTP {status}: {' '.join(data[field].split())[:200]}"
    first = " ".join(head.split())
    return f"HTTP {status}: {first[:200]}" if first else f"HTTP {status}"


def http_call(client, method: str, url: str, *, source: str, timeout_s: float, max_body_bytes: int,
              params: dict | None = None, json_body: Any = None, headers: dict | None = None) -> ToolResponse:
    """One HTTP request as a ToolResponse (never raises); the body is read up to ``max_body_bytes``
    and the whole exchange must finish within ``timeout_s``."""
    import httpx

    start = time.perf_counter()
    timeout_s = remaining_s(timeout_s)
    if timeout_s <= 0:
        return ToolResponse("timeout", error="no time was left to call the API", source=source, outage=True)
    deadline = time.monotonic() + timeout_s
    cut = False
    try:
        with client.stream(method, url, params=params, json=json_body, headers=headers, timeout=timeout_s) as r:
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > max_body_bytes:
                    cut = True
                    break
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("overall deadline passed")
            body = b"".join(chunks)[:max_body_bytes]
            status, content_type = r.status_code, r.headers.get("content-type", "")
    except httpx.TimeoutException:
        return ToolResponse("timeout", error=f"the API did not answer within {timeout_s:g} s",
                            latency_s=time.perf_counter() - start, source=source, outage=True)
    except Exception as e:  # noqa: BLE001 - a request never raises (httpx.InvalidURL is no HTTPError)
        # the service or the network failed (outage), or the request itself was bad (a URL, a
        # header or text the arguments made unsendable, an unsupported scheme): the model's to fix
        outage = isinstance(e, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError, OSError))
        return ToolResponse("error", error=redact(f"request failed: {type(e).__name__}: {e}")[:300],
                            latency_s=time.perf_counter() - start, source=source, outage=outage)
    text = redact(body.decode("utf-8", errors="replace"))
    latency = time.perf_counter() - start
    if status >= 400:
        return ToolResponse("http_error", content=text, error=redact(_http_reason(status, text, content_type)),
                            latency_s=latency, source=source, http_status=status, truncated=cut,
                            outage=status in _OUTAGE_HTTP)
    return ToolResponse("ok", content=text, latency_s=latency, source=source, http_status=status, truncated=cut)


def _client(client):
    if client is not None:
        return client
    import httpx

    return httpx.Client(follow_redirects=True, trust_env=False)


class StableToolBenchClient:
    """Client of a StableToolBench-compatible server (its ``/virtual`` endpoint, or our mock).

    Args:
        url (`str`): the endpoint, e.g. ``http://127.0.0.1:8080/virtual``.
        key_env (`str`, *optional*, defaults to `"TOOLBENCH_KEY"`): environment variable holding
            the ToolBench key (sent as the ``toolbench_key`` field and header; may be unset).
        timeout_s (`float`, *optional*, defaults to `60`): per attempt (less when the caller's
            :data:`~codetool.tools.spec.CALL_DEADLINE` is nearer).
        retries (`int`, *optional*, defaults to `2`): extra attempts after an outage (a timeout, a
            failed connection, HTTP 502/503/504) or an HTTP 429 (not after 500: a dead API stays
            dead; not after a request the arguments made unsendable), with exponential backoff
            from ``backoff_s`` (:class:`codetool.retry.RetryPolicy`, at most 60 s a wait), while
            the caller's deadline leaves time for the wait and another try.
        strip (`str`, *optional*, defaults to `"truncate"`): StableToolBench's observation
            compression mode, passed through.
    """

    name = "server"
    real = True

    def __init__(self, url: str, *, key_env: str = "TOOLBENCH_KEY", timeout_s: float = 60.0, retries: int = 2,
                 backoff_s: float = 1.0, strip: str = "truncate", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 client=None):
        if not url.startswith(("http://", "https://")):
            raise CodetoolError(f"StableToolBench server url must start with http:// or https://, got {url!r}.")
        self.url, self.key_env, self.timeout_s, self.retries = url, key_env, timeout_s, retries
        self.backoff_s, self.strip, self.max_body_bytes = backoff_s, strip, max_body_bytes
        self.retry = RetryPolicy(retries, backoff_s)
        self.client = _client(client)

    def payload(self, api: APISpec, arguments: dict) -> dict:
        """The request body without the key (StableToolBench sends names in ToolBench's standard form)."""
        return {"category": api.category, "tool_name": standardize(api.tool), "api_name": api_key_name(api),
                "tool_input": json.dumps(arguments, ensure_ascii=False), "strip": self.strip}

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        key = os.environ.get(self.key_env, "")
        body = dict(self.payload(api, arguments), toolbench_key=key)
        headers = {"toolbench_key": key} if key else {}
        total = 0.0
        for attempt in range(self.retry.retries + 1):
            response = http_call(self.client, "POST", self.url, source=self.name, timeout_s=self.timeout_s,
                                 max_body_bytes=self.max_body_bytes, json_body=body, headers=headers)
            total += response.latency_s
            transient = response.outage or response.http_status == 429  # (not a request the arguments broke)
            wait = self.retry.wait_s(attempt + 1)
            if not transient or attempt == self.retry.retries or remaining_s(wait + 1.0) < wait + 1.0:
                break  # (no time left before the caller's deadline for a wait and another try)
            time.sleep(wait)
        response.latency_s = total
        if not response.ok:
            return response
        try:
            data = json.loads(response.content)
        except ValueError:
            return response  # not the server protocol: pass the text through
        if not isinstance(data, dict) or "response" not in data and "error" not in data:
            return response
        content = data.get("response")
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        error = str(data.get("error") or "").strip()
        status = "api_error" if error else "ok"
        return ToolResponse(status, content=redact(content), error=redact(error)[:300] or None, latency_s=total,
                            source=self.name, simulated=bool(data.get("simulated", False)),
                            http_status=response.http_status, truncated=response.truncated)


class HTTPBackend:
    """Plain HTTP calls to an OpenAPI service (RestBench's TMDB, or our mock of it).

    Args:
        base_url (`str`, *optional*): replaces the spec's server, e.g. ``http://127.0.0.1:8000``;
            the request URL is ``base_url + api.path``. Without it, ``api.url`` is used.
        token_env (`str` or `None`, *optional*, defaults to `"TMDB_ACCESS_TOKEN"`): environment
            variable holding the token; sent as ``Authorization: Bearer <token>`` (or in
            ``key_header``) when set. ``None`` sends no credential.
        key_header (`str`, *optional*): send the raw token in this header instead of a bearer token.
        timeout_s (`float`, *optional*, defaults to `30`): for the whole exchange.
    """

    name = "http"
    real = True

    def __init__(self, base_url: str | None = None, *, token_env: str | None = "TMDB_ACCESS_TOKEN",
                 key_header: str | None = None, timeout_s: float = 30.0,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, client=None):
        self.base_url = base_url.rstrip("/") if base_url else None
        self.token_env, self.key_header, self.timeout_s = token_env, key_header, timeout_s
        self.max_body_bytes = max_body_bytes
        self.client = _client(client)

    def request_parts(self, api: APISpec, arguments: dict) -> tuple[str, dict, dict, dict | None]:
        """(url, query params, headers, JSON body) for one call, without credentials.

        Raises:
            ValueError: a path parameter that does not fit its declared type (see :func:`path_segment`).
        """
        declared = {p.name: p for p in api.parameters}
        url = (self.base_url + api.path) if self.base_url and api.path else (api.url or "")
        params, headers, body = {}, {}, {}
        for name, value in arguments.items():
            where = declared[name].location if name in declared else "query"
            if where == "path":
                url = url.replace("{" + name + "}", path_segment(declared[name], value))
            elif where == "header":
                headers[name] = str(value)
            elif where == "body":
                body[name] = value
            else:
                params[name] = json.dumps(value) if isinstance(value, (dict, list)) else value
        return url, params, headers, body or None

    def call(self, api: APISpec, arguments: dict) -> ToolResponse:
        try:
            url, params, headers, body = self.request_parts(api, arguments)
        except ValueError as e:
            return ToolResponse("invalid_arguments", error=str(e), source=self.name)
        if not url.startswith(("http://", "https://")) or "{" in url:
            return ToolResponse("invalid_arguments" if "{" in url else "error",
                                error=f"cannot build the URL of {api.api}: got {url or 'no URL'!r}", source=self.name)
        token = os.environ.get(self.token_env, "") if self.token_env else ""
        if token:
            headers[self.key_header or "Authorization"] = token if self.key_header else f"Bearer {token}"
        return http_call(self.client, api.method, url, source=self.name, timeout_s=self.timeout_s,
                         max_body_bytes=self.max_body_bytes, params=params, json_body=body, headers=headers)


_INTEGER = re.compile(r"-?\d{1,19}")
_NUMBER = re.compile(r"-?\d{1,30}(\.\d{1,30})?([eE][-+]?\d{1,3})?")


def path_segment(param, value: Any) -> str:
    """``value`` as one URL path segment for the path parameter ``param``, checked against its
    declared type: an ``integer`` is digits, a ``number`` a decimal, a ``boolean`` true/false, an
    enum one of its values; any value is refused if it is empty, ``.`` or ``..``, or holds a
    slash, a backslash or a control character (so no value can reach another path of the API
    host, with the host's credentials), then percent-encoded.

    Raises:
        ValueError: with a one-line reason the model can act on.
    """
    kind = (param.type or "string").lower()
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"path parameter {param.name!r} must be a single value, got a {type(value).__name__}")
    if kind == "integer" and not _INTEGER.fullmatch(text):
        raise ValueError(f"path parameter {param.name!r} must be an integer, got {text[:40]!r}")
    if kind == "number" and not _NUMBER.fullmatch(text):
        raise ValueError(f"path parameter {param.name!r} must be a number, got {text[:40]!r}")
    if kind == "boolean" and text.lower() not in ("true", "false"):
        raise ValueError(f"path parameter {param.name!r} must be true or false, got {text[:40]!r}")
    if param.enum and text not in {str(v) for v in param.enum}:
        raise ValueError(f"path parameter {param.name!r} must be one of {[str(v) for v in param.enum][:10]}, "
                         f"got {text[:40]!r}")
    if text in ("", ".", "..") or any(c in text for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"path parameter {param.name!r} cannot be {text[:40]!r} (no empty value, dot segment, "
                         f"slash or control character)")
    return quote(text, safe="")
