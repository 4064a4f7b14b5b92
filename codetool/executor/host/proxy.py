"""The host side of the tool proxy: perform one call that the sandboxed code asked for.

The code calls ``search_movies("x", page=2)``; the worker sends the name and the JSON arguments
here. :func:`perform_tool_call` maps positionals to parameter names, calls the host callable in a
daemon thread with a timeout, turns whatever comes back into ``(status, content, error)`` for the
code, and records a :class:`~codetool.executor.result.ToolCall`. It never raises: a callable that
raises, hangs, or returns something that is not JSON becomes a tool failure the code can catch.
It also says whether the failure was an *outage* (the callable gave no answer within the tool
timeout, or returned a ``ToolResponse`` marked ``outage``): the step that met one is the machine's
(``host.step``), never the code's. A callable that raises is no outage: it refused these arguments.

Limit: a hung callable cannot be stopped from Python; its thread is abandoned (it is a daemon)
and the code gets a ``timeout`` error. Callables should carry their own network timeouts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from codetool.executor.host.channel import log_safe
from codetool.executor.result import ARGUMENT_PREVIEW_CHARS, RESPONSE_PREVIEW_CHARS, ToolCall
from codetool.secrets import redact
from codetool.tools.spec import CALL_DEADLINE, TOOL_STATUSES, ToolResponse

logger = logging.getLogger(__name__)

CHAIN_SHARE = 0.8  # of tool_timeout_s, the callable's own deadline (CALL_DEADLINE): the rest is its fallbacks'
STOP_CHECK_S = 0.25  # how often ``stop`` is asked while a call runs

MAX_ERROR_CHARS = 500


class _BadArguments(Exception):
    pass


def bind_arguments(name: str, func: Callable, args: list, kwargs: dict) -> tuple[tuple, dict, dict]:
    """Map the code's arguments onto ``func``'s signature.

    Positionals are turned into keywords by parameter name (only positional-only parameters stay
    positional). A callable that takes ``*args`` does its own binding (e.g. the functions of
    ``codetool.tools.ToolEnvironment``), so its arguments are passed on unchanged.

    Returns:
        ``(positional, keywords, recorded)``: what to call ``func`` with, and the arguments by name
        for the :class:`ToolCall` record.
    Raises:
        _BadArguments: positionals for a callable without a signature, or arguments that do not fit.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        if args:
            raise _BadArguments(f"{name}() takes keyword arguments only; call it as {name}(name=value)") from None
        return (), dict(kwargs), dict(kwargs)
    params = signature.parameters
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        named = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        recorded = dict(zip(named, args))
        if len(args) > len(named):
            recorded["*args"] = list(args[len(named):])
        return tuple(args), dict(kwargs), {**recorded, **kwargs}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        if args and not any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values()):
            raise _BadArguments(f"{name}() takes keyword arguments only; call it as {name}(name=value)") from None
        raise _BadArguments(f"{name}(): {exc}") from None
    positional, keywords = [], {}
    for pname, value in bound.arguments.items():
        kind = params[pname].kind
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
        else:
            keywords[pname] = value
    recorded = {**{p: v for p, v in bound.arguments.items() if params[p].kind is inspect.Parameter.POSITIONAL_ONLY},
                **keywords}
    return tuple(positional), keywords, recorded


def bounded_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``(preview, sha256)`` of a call's arguments (JSON values, already depth-checked).

    The preview is the arguments themselves when their JSON fits ``ARGUMENT_PREVIEW_CHARS``;
    otherwise each value whose JSON is longer than its share is replaced by the start of that JSON
    and ``...[cut]``, so a record never holds more than a few KiB whatever the code sent."""
    text = json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
    if len(text) <= ARGUMENT_PREVIEW_CHARS:
        return arguments, digest
    keys = list(arguments)[:20]
    share = max(40, ARGUMENT_PREVIEW_CHARS // max(1, len(keys)))
    preview: dict[str, Any] = {}
    for key in keys:
        value = arguments[key]
        encoded = json.dumps(value, ensure_ascii=False)
        if len(encoded) > share:
            value = (value if isinstance(value, str) else encoded)[:share] + "...[cut]"
        preview[str(key)[:100]] = value
    if len(arguments) > len(keys):
        preview["...[cut]"] = f"{len(arguments) - len(keys)} more arguments"
    return preview, digest


def _response_fields(value: Any) -> tuple[str, str, str | None, bool]:
    """``(status, content, error, outage)`` of whatever a host callable returned."""
    if isinstance(value, ToolResponse):
        status = value.status if value.status in TOOL_STATUSES else "error"
        content = value.content if isinstance(value.content, str) else str(value.content)
        return status, content, value.error, bool(value.outage) and status != "ok"
    if isinstance(value, str):
        return "ok", value, None, False
    if isinstance(value, bytes):
        return "ok", value.decode("utf-8", "replace"), None, False
    try:
        return "ok", json.dumps(value, ensure_ascii=False), None, False
    except (TypeError, ValueError):
        return "error", "", f"the tool returned a {type(value).__name__}, which is not JSON", False


def perform_tool_call(name: str, func: Callable | None, args: list, kwargs: dict, timeout_s: float,
                      stop: Callable[[], bool] | None = None) -> tuple[ToolCall, dict[str, Any], bool]:
    """Run one proxied call.

    Args:
        name (`str`): the function name the code called.
        func (`Callable` or `None`): the host callable (``None`` if the name is unknown).
        args (`list`), kwargs (`dict`): the JSON arguments the code sent.
        timeout_s (`float`): seconds to wait for the callable's answer. The callable runs with
            :data:`~codetool.tools.spec.CALL_DEADLINE` at ``CHAIN_SHARE`` of it, so that a backend
            chain gives up on a slow service while its fallback still has time to answer.
        stop (`Callable[[], bool]`, *optional*): asked every ``STOP_CHECK_S`` while the call runs;
            when it says True the call is abandoned (a ``timeout`` the code sees, no outage: the
            step used up its own time meanwhile).
    Returns:
        The :class:`ToolCall` record, the reply for the code
        (``{"status": str, "content": str, "error": str | None}``) and whether the failure was an
        outage (no answer within ``timeout_s``, or a ``ToolResponse`` marked ``outage``).
    """
    start = time.monotonic()
    recorded: dict[str, Any] = dict(kwargs)
    error: str | None
    outage = False
    if func is None:
        status, content, error = "not_found", "", f"there is no tool named {name!r}"
    else:
        try:
            positional, keywords, recorded = bind_arguments(name, func, args, kwargs)
        except _BadArguments as exc:
            status, content, error = "invalid_arguments", "", str(exc)
        else:
            status, content, error, outage = _call_with_timeout(name, func, positional, keywords, timeout_s, stop)
    if status != "ok" and not error:
        error = status
    if error:
        error = redact(error)
        if len(error) > MAX_ERROR_CHARS:
            error = error[:MAX_ERROR_CHARS] + "..."
    content = redact(content)
    preview = content if len(content) <= RESPONSE_PREVIEW_CHARS else content[:RESPONSE_PREVIEW_CHARS] + "...[cut]"
    arguments, digest = bounded_arguments(recorded)
    call = ToolCall(name=name, arguments=arguments, status=status,
                    latency_s=round(time.monotonic() - start, 6), error=error,
                    response=preview if status == "ok" else "", arguments_sha256=digest)
    return call, {"status": status, "content": content if status == "ok" else "", "error": error}, outage


def _call_with_timeout(name: str, func: Callable, positional: tuple, keywords: dict, timeout_s: float,
                       stop: Callable[[], bool] | None) -> tuple[str, str, str | None, bool]:
    box: dict[str, Any] = {}
    start = time.monotonic()

    def target():
        CALL_DEADLINE.set(start + CHAIN_SHARE * timeout_s)  # (this thread's own context)
        try:
            box["value"] = func(*positional, **keywords)
        except BaseException as exc:  # noqa: B036 - a tool must never take the host down
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"codetool-tool-{name}", daemon=True)
    thread.start()
    while thread.is_alive() and (left := start + timeout_s - time.monotonic()) > 0:
        thread.join(min(left, STOP_CHECK_S) if stop is not None else left)
        if thread.is_alive() and stop is not None and stop():
            logger.debug("tool %s abandoned: the step used up its time", log_safe(name))
            return "timeout", "", f"{name} was abandoned: the step used up its time while it ran", False
    if thread.is_alive():
        logger.warning("tool %s did not answer within %.1f s; abandoning its thread", log_safe(name), timeout_s)
        return "timeout", "", f"{name} did not answer within {timeout_s:.3g} s", True
    if "error" in box:
        exc = box["error"]
        logger.debug("tool %s raised %s", log_safe(name), type(exc).__name__)
        return "error", "", f"{type(exc).__name__}: {exc}", False
    return _response_fields(box.get("value"))
