"""Sandbox side of :mod:`codetool.executor`: a worker's **state**, the part the step's code can
reach. Standard library only.

Not imported by the host: the sandbox root passes this source, with ``inside.io`` and
``inside.keeper``, to each fresh worker interpreter (``codetool.executor.host.launch.WORKER_BOOT``).

:class:`State` holds the namespace every step of the worker runs in (a ``__main__`` module), the
tool proxies, ``finish``/``give_up``, the step's output (``inside.io.Output``) and its tool
channel (``inside.io.Channel``, a socket made for that step). Its methods run in the step's
thread: :meth:`State.pre` before the step's code is compiled, :meth:`State.after` when it ran to its
end, :meth:`State.describe` when it raised.

**Nothing here is trusted.** The step's code can rebind anything in this module or call any of
it; what it can reach this way is its own observation (the error message, the output, the
frames it sends, which the host checks), never the verdict: whether the step ran to its end is
decided by ``inside.keeper`` and the host, where the step's code cannot write.
"""

import builtins
import errno
import gc
import itertools
import json
import os
import sys
import threading
import traceback
import types
from json import dumps as _dumps
from json import loads as _loads  # bound now: a step that patches the json module keeps its tools

try:
    from sandbox_io import Channel, Output
except ImportError:  # imported on the host (tests, documentation tools): the package's copies
    from codetool.executor.inside.io import Channel, Output

MAX_TOOL_PAYLOAD = 1 << 20  # bytes of JSON arguments one tool call may send to the host
MAX_ANSWER_CHARS = 100_000
MAX_ARGUMENT_DEPTH = 28  # nesting of tool arguments (the host refuses frames nested past 32)
RESOURCE_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EDQUOT}
VIOLATION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENETUNREACH}


class ToolError(Exception):
    """A tool call failed (HTTP error, timeout, invalid arguments...); ``status`` says how."""

    def __init__(self, tool, status, message):
        super().__init__(f"{tool} failed ({status}): {message}")
        self.tool = tool
        self.status = status


class EndStep(BaseException):
    """Raised by ``finish``/``give_up``: ``except Exception`` does not stop it, and the keeper's
    guard around the step's code ends the step at it as one that ran to its end."""


class StepLimit(BaseException):
    """The host refused a tool call: the step is over its calls or bytes budget."""


class State:
    """One worker's state: the namespace, the tool proxies and the step in progress.

    Args:
        tools (`list[str]`): the tool functions to define.
        max_output_chars (`int`): characters of output kept per step.
    """

    def __init__(self, tools, max_output_chars):
        self.max_output_chars = max_output_chars
        self.step = 0
        self.sources = {}
        self.call_ids = itertools.count(1)
        self.call_lock = threading.Lock()  # one tool call in flight at a time
        self.chan = None
        self.out = None
        self.answered = False
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = module
        self.namespace = module.__dict__
        self.namespace.update(finish=self._finish, give_up=self._give_up, ToolError=ToolError)
        self.tools = []
        self._set_tools(tools)
        self.builtins = dict(builtins.__dict__)  # what each step starts with

    # -- the step's life cycle (called by the keeper's chain, in the step's thread)
    def pre(self, tool_fd, source, filename, forked):
        """Prepare a step: its channel and output, the builtins it starts with; after a fork, the
        Python-level copies of what the keeper changed (environment, temporary directory, random
        seed). Returns ``True``; anything else stops the step before its code runs."""
        gc.enable()
        names = builtins.__dict__
        names.update(self.builtins)
        for name in [n for n in names if n not in self.builtins]:
            del names[name]
        self.namespace["__builtins__"] = builtins
        self.step += 1
        self.sources[filename] = source.decode("utf-8", "replace")
        self.answered = False
        self.chan = Channel(tool_fd)
        self.out = Output(self.max_output_chars)
        sys.stdout = sys.stderr = self.out
        if forked:
            self._after_fork()
            if forked != b"-":  # a copy of an unused state made for an executor of its own tools
                self._set_tools(_loads(forked))
        return True

    def after(self, _nothing):
        """The step's code ran to its end (or to ``finish``): report the output dropped, if any.
        Returns ``None`` (anything true spoils the step's verdict)."""
        self._close({"op": "end"}, quiet=True)

    def describe(self, exc):
        """The step's code raised ``exc``: report it for the model (type and the failing line)."""
        try:
            error_type, kind = type(exc).__name__, kind_of(exc)
            message = self._message(exc)
        except BaseException:  # noqa: B036 - the code's exception classes may break anything
            error_type, kind, message = "Error", "runtime_error", "the error could not be described"
        self._close({"op": "raised", "error_type": str(error_type)[:100], "error_message": message[:2000],
                     "kind": kind})

    def _close(self, frame, quiet=False):
        out, self.out = self.out, None
        if out is not None:
            out.flush()
            frame["output_dropped"] = out.dropped
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        chan, self.chan = self.chan, None
        if chan is not None and (not quiet or frame.get("output_dropped")):
            try:
                chan.send(frame)
            except (OSError, ValueError):
                pass
        if chan is not None:
            chan.detach()

    def _after_fork(self):
        import random
        import tempfile

        here = os.getcwd()
        os.environ["HOME"] = os.environ["TMPDIR"] = here
        tempfile.tempdir = None
        random.seed()

    # -- functions the model's code calls
    def _finish(self, answer):
        """End the episode with ``answer`` (the first call of finish/give_up wins)."""
        self._end("finish", "answer", answer if isinstance(answer, str) else str(answer))

    def _give_up(self, reason=""):
        """End the episode without an answer, saying why."""
        self._end("give_up", "reason", str(reason))

    def _end(self, op, key, text):
        if not self.answered and self.chan is not None:
            self.answered = True
            self.chan.send({"op": op, key: text[:MAX_ANSWER_CHARS]})
        raise EndStep()

    def _set_tools(self, tools):
        for name in self.tools:
            self.namespace.pop(name, None)
        self.tools = [str(name) for name in tools]
        for name in self.tools:
            self.namespace[name] = self._proxy(name)

    def _proxy(self, name):
        state = self

        def proxy(*args, **kwargs):
            return state.call_tool(name, args, kwargs)

        proxy.__name__ = proxy.__qualname__ = name
        proxy.__doc__ = f"Call the tool {name!r} (the host performs the call)."
        return proxy

    def call_tool(self, name, args, kwargs):
        chan = self.chan
        if chan is None:
            raise ToolError(name, "step_ended", "tools can only be called while a step runs")
        call = next(self.call_ids)  # atomic, so threads of the code get distinct ids
        frame = {"op": "tool", "call": call, "name": name, "args": list(args), "kwargs": kwargs}
        try:
            payload = _dumps(frame).encode("ascii")
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"{name}(): every argument must be a JSON value (str, int, float, bool, None, "
                            f"list or dict); {_bad_argument(args, kwargs) or exc}") from None
        if _too_deep(frame["args"]) or _too_deep(kwargs):
            raise ValueError(f"{name}(): the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels")
        if len(payload) > MAX_TOOL_PAYLOAD:
            raise ValueError(f"{name}(): the arguments are {len(payload)} bytes of JSON; at most "
                             f"{MAX_TOOL_PAYLOAD} can be sent to a tool")
        with self.call_lock:
            chan.send(frame)
            while True:
                reply = chan.recv()
                if reply.get("op") == "tool_result" and reply.get("call") == call:
                    break
        if reply["status"] == "step_limit":
            raise StepLimit(reply.get("error") or "the step is over its tool budget")
        if reply["status"] != "ok":
            raise ToolError(name, reply["status"], reply.get("error") or reply["status"])
        content = reply.get("content") or ""
        try:
            return _loads(content)
        except ValueError:
            return content

    # -- the error message
    def _message(self, exc):
        """A short message for the model: the error, then the line of the step that failed."""
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - an exception class of the code may break __str__
            text = "(the error message could not be shown)"
        if isinstance(exc, SyntaxError):
            text = exc.msg
        elif isinstance(exc, SystemExit):
            text = f"{text} (sys.exit ends the step; call finish(answer) to give the final answer)"
        name = type(exc).__name__
        lines = [(f"{name}: {text}" if text else name)[:600]]
        current = f"<step {self.step}>"
        if isinstance(exc, SyntaxError) and exc.filename == current and exc.lineno:
            lines.append(f"  at line {exc.lineno}: {(exc.text or '').strip()[:200]}")
            return "\n".join(lines)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in self.sources and f.lineno]
        if frames:
            inner = frames[-1]
            where = f"line {inner.lineno}"
            if inner.filename != current:
                where += f" of an earlier step ({inner.filename.strip('<>')})"
            if inner.name != "<module>":
                where += f", in {inner.name}"
            lines.append(f"  at {where}: {self._line(inner)}")
            outer = [f for f in frames if f.filename == current]
            if outer and outer[-1] is not inner:
                lines.append(f"  called from line {outer[-1].lineno}: {self._line(outer[-1])}")
        return "\n".join(lines)

    def _line(self, frame):
        source = self.sources[frame.filename].splitlines()
        return source[frame.lineno - 1].strip()[:200] if frame.lineno <= len(source) else ""


def kind_of(exc):
    """Which failure the code's exception reports: ``resource_limit`` (memory, file size, full
    scratch, open files, processes), ``sandbox_violation`` (a permission the sandbox refuses) or
    ``runtime_error``. Only a report: the host takes it to tell failures apart, never to decide one."""
    if isinstance(exc, MemoryError):
        return "resource_limit"
    if isinstance(exc, OSError):
        if exc.errno in RESOURCE_ERRNOS:
            return "resource_limit"
        if isinstance(exc, PermissionError) or exc.errno in VIOLATION_ERRNOS:
            return "sandbox_violation"
    return "runtime_error"


def _too_deep(value):
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > MAX_ARGUMENT_DEPTH:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _bad_argument(args, kwargs):
    named = [(f"argument {i + 1}", v) for i, v in enumerate(args)] + list(kwargs.items())
    for label, value in named:
        try:
            json.dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            return f"'{label}' is a {type(value).__name__} ({exc})"
    return None
