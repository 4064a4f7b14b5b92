"""Sandbox side of :mod:`codetool.executor`, the **worker** role. Standard library only.

Not imported by the host: the host sends this source, ``sandbox_io.py`` and ``sandbox_root.py``
(with the other ``sandbox_*`` modules) to a fresh interpreter (the system ``python3`` by default,
so that an unprivileged uid can run it), where they become the modules ``sandbox_worker``,
``sandbox_io`` and ``sandbox_root`` (see ``codetool.executor.launch.BOOTSTRAP``).

A worker (one per executor) holds one state (a ``__main__`` namespace), runs steps, forwards tool
calls to the host, and forks itself when the host asks for an independent copy of the state (the
copy is reaped by the worker it came from, or by the root once that one is gone). The copy
becomes its own principal (``setresuid`` to the uid the host named, let through by the host or
the root, see ``sandbox_principals``) and stops sharing descriptors and mappings with the worker
it came from (``sandbox_copy``).

Host and sandbox talk over Unix stream sockets in frames (``sandbox_io.Channel``): a 4-byte
big-endian length, then JSON. Nothing is ever pickled. Every frame carries the nonce of the run
it belongs to (sent by the host with the ``run`` frame) and its sequence number in that run, so
the host drops the frames of an earlier run and rejects injected ones. Tool calls and ``finish``
from a thread that an earlier step started, or made between steps, are refused here. Received
file descriptors are close-on-exec: a program the code starts never holds a channel. The
worker's stdout and stderr (Python ``print`` and any process it starts) go to a pipe that the
host reads and caps (``sandbox_io.Output``).
"""

import builtins
import errno
import gc
import itertools
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback
import types

try:
    from sandbox_copy import become_independent
    from sandbox_io import Channel, Output, close_fd
except ImportError:  # imported on the host (documentation tools): the package's copies
    from codetool.executor.sandbox_copy import become_independent
    from codetool.executor.sandbox_io import Channel, Output, close_fd

# Taken before any model code runs: rebinding builtins.exec or builtins.compile changes nothing here.
_EXEC, _COMPILE = exec, compile
MAX_TOOL_PAYLOAD = 1 << 20  # bytes of JSON arguments one tool call may send to the host
MAX_ANSWER_CHARS = 100_000
MAX_ARGUMENT_DEPTH = 28  # nesting of tool arguments (the host refuses frames nested past 32)
LINGER_S = 30.0  # how long a worker whose host end closed waits to be killed
RESOURCE_ERRNOS = {errno.EFBIG, errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EDQUOT}
VIOLATION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENETUNREACH}


# ------------------------------------------------------------------------------- in-step signals
class ToolError(Exception):
    """A tool call failed (HTTP error, timeout, invalid arguments...); ``status`` says how."""

    def __init__(self, tool, status, message):
        super().__init__(f"{tool} failed ({status}): {message}")
        self.tool = tool
        self.status = status


class _EndStep(BaseException):
    """Raised by ``finish``/``give_up``; a BaseException so ``except Exception`` cannot stop it."""


class _StepTimeout(BaseException):
    pass


class _CpuLimit(BaseException):
    pass


class _StepLimit(BaseException):
    """The host refused a tool call: the step is over its calls or bytes budget."""


class Worker:
    """One state: the namespace, the host channel, and the step counter."""

    def __init__(self, chan, config):
        self.chan = chan
        self.config = config
        self.step = 0
        self.sources = {}
        self.call_ids = itertools.count(1)
        self.in_step = False
        self.alarmed = False
        self.answered = False
        self.copies = set()
        self.old_threads = set()  # threads alive when the current step started
        self.call_lock = threading.Lock()  # one tool call in flight at a time
        self.scratch = config.get("scratch") or os.getcwd()
        self.uid = config.get("uid")
        signal.signal(signal.SIGCHLD, self._reap_copies)
        sys.addaudithook(_refuse_audit_hooks)
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = module
        self.namespace = module.__dict__
        self.namespace.update(self._builtins())
        for name in config["tools"]:
            self.namespace[name] = self._proxy(name)

    # -- functions the model's code calls
    def _builtins(self):
        worker = self

        def finish(answer):
            """End the episode with ``answer`` (the first call of finish/give_up wins)."""
            worker.end("finish", "answer", answer if isinstance(answer, str) else str(answer))

        def give_up(reason=""):
            """End the episode without an answer, saying why."""
            worker.end("give_up", "reason", str(reason))

        return {"finish": finish, "give_up": give_up, "ToolError": ToolError}

    def _current(self):
        """Whether the calling thread belongs to the running step (not to an earlier one)."""
        return self.in_step and threading.get_ident() not in self.old_threads

    def end(self, op, key, text):
        if not self._current():
            raise _EndStep()
        if not self.answered:
            self.answered = True
            self.chan.send({"op": op, key: text[:MAX_ANSWER_CHARS]})
        raise _EndStep()

    def _proxy(self, name):
        worker = self

        def proxy(*args, **kwargs):
            return worker.call_tool(name, args, kwargs)

        proxy.__name__ = proxy.__qualname__ = name
        proxy.__doc__ = f"Call the tool {name!r} (the host performs the call)."
        return proxy

    def call_tool(self, name, args, kwargs):
        if not self._current():
            raise ToolError(name, "step_ended", "tools can only be called while a step runs; this "
                                                "thread was started by an earlier step")
        call = next(self.call_ids)  # atomic, so threads of the code get distinct ids
        frame = {"op": "tool", "call": call, "name": name, "args": list(args), "kwargs": kwargs}
        try:
            payload = json.dumps(frame).encode("ascii")
        except (TypeError, ValueError, RecursionError) as exc:
            raise TypeError(f"{name}(): every argument must be a JSON value (str, int, float, bool, None, "
                            f"list or dict); {_bad_argument(args, kwargs) or exc}") from None
        if _too_deep(frame["args"]) or _too_deep(kwargs):
            raise ValueError(f"{name}(): the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels")
        if len(payload) > MAX_TOOL_PAYLOAD:
            raise ValueError(f"{name}(): the arguments are {len(payload)} bytes of JSON; at most "
                             f"{MAX_TOOL_PAYLOAD} can be sent to a tool")
        with self.call_lock:
            self.chan.send(frame)
            while True:
                reply = self.chan.recv()
                if reply.get("op") == "tool_result" and reply.get("call") == call:
                    break
        if reply["status"] == "step_limit":
            raise _StepLimit(reply.get("error") or "the step is over its tool budget")
        if reply["status"] != "ok":
            raise ToolError(name, reply["status"], reply.get("error") or reply["status"])
        content = reply.get("content") or ""
        try:
            return json.loads(content)
        except ValueError:
            return content

    # -- one step
    def run(self, msg):
        if msg.get("reap"):  # the host killed what the previous step left running: reap it
            self._reap_all()
        # What an earlier step may have left that would change how this step's code runs without
        # being part of its state: a tracer, a profiler, other builtins for the namespace.
        sys.settrace(None)
        sys.setprofile(None)
        self.namespace["__builtins__"] = builtins
        self.step += 1
        filename = f"<step {self.step}>"
        code = msg["code"]
        self.sources[filename] = code
        self.answered = False
        self.old_threads = {t.ident for t in threading.enumerate()} - {threading.get_ident()}
        self.chan.begin(str(msg.get("nonce") or ""), self.old_threads)
        out = Output(self.config["max_output_chars"])
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.signal(signal.SIGXCPU, self._on_xcpu)
        self.alarmed = False
        outcome, error_type, error_message = "ok", None, None
        try:
            try:
                compiled = _COMPILE(code, filename, "exec", dont_inherit=True)
                self.in_step = True
                signal.setitimer(signal.ITIMER_REAL, max(float(msg["timeout"]), 0.001))
                _EXEC(compiled, self.namespace)
            finally:
                self.in_step = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _EndStep:
            pass
        except _StepTimeout as exc:
            outcome, error_type = "timeout", "Timeout"
            error_message = self.describe(
                exc, f"Timeout: the step ran longer than {msg['timeout']:g} s and was stopped")
        except _CpuLimit as exc:
            outcome, error_type = "resource_limit", "CPULimit"
            error_message = self.describe(exc, "CPULimit: the step used more CPU time than allowed")
        except _StepLimit as exc:
            outcome, error_type = "resource_limit", "ToolLimit"
            error_message = self.describe(exc, f"ToolLimit: {exc}")
        except BaseException as exc:  # noqa: B036 - model code may raise anything, SystemExit included
            outcome, error_type = classify(exc), type(exc).__name__
            error_message = self.describe(exc)
        finally:
            sys.stdout, sys.stderr = saved
            out.flush()
            signal.signal(signal.SIGCHLD, self._reap_copies)  # the code may have replaced it
            self._reap_copies()
        if self.alarmed and outcome != "timeout":  # the code caught the interrupt: still a timeout
            outcome, error_type = "timeout", "Timeout"
            error_message = f"Timeout: the step ran longer than {msg['timeout']:g} s and was stopped"
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"op": "done", "outcome": outcome, "error_type": error_type,
                "error_message": error_message, "output_dropped": out.dropped,
                "cpu_s": usage.ru_utime + usage.ru_stime}

    def _on_alarm(self, signum, frame):
        if self.in_step:
            self.alarmed = True
            raise _StepTimeout()

    def _on_xcpu(self, signum, frame):
        if self.in_step:
            raise _CpuLimit()

    def describe(self, exc, headline=None):
        """A short message for the model: the error, then the line of the step that failed."""
        if headline is None:
            try:
                text = str(exc)
            except Exception:  # noqa: BLE001 - an exception class of the code may break __str__
                text = "(the error message could not be shown)"
            if isinstance(exc, SyntaxError):
                text = exc.msg
            elif isinstance(exc, SystemExit):
                text = f"{text} (sys.exit ends the step; call finish(answer) to give the final answer)"
            headline = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        lines = [headline[:600]]
        current = f"<step {self.step}>"
        if isinstance(exc, SyntaxError) and exc.filename == current and exc.lineno:
            lines.append(f"  at line {exc.lineno}: {(exc.text or '').strip()[:200]}")
            return "\n".join(lines)
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if f.filename in self.sources and f.lineno]
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

    # -- fork: the copy becomes a new worker with the channel and output pipe the host sent
    def fork(self, chan, msg):
        """A single ``os.fork``: this worker is the zygote of its copies and reaps them; when it
        dies first, the root (a child subreaper) adopts them. Returns the channel to serve next
        (the copy's own one in the copy). The garbage collector stays off until the copy is its
        own principal, so no finalizer of the state runs in between."""
        fds, chan.fds = chan.fds[:2], chan.fds[2:]
        if len(fds) != 2:
            chan.send({"op": "fork_failed", "error": "no channel was passed"})
            return chan
        self._reap_all()  # what the root killed at the end of the last step holds no process slot
        collecting = gc.isenabled()
        gc.disable()
        try:
            pid = os.fork()
        except OSError as exc:
            if collecting:
                gc.enable()
            for fd in fds:
                close_fd(fd)
            chan.send({"op": "fork_failed", "error": str(exc)})
            return chan
        if pid == 0:
            self.copies = set()
            chan.sock.close()
            chan = self._become_copy(fds, msg)
            if collecting:
                gc.enable()
            return chan
        if collecting:
            gc.enable()
        for fd in fds:
            close_fd(fd)
        self.copies.add(pid)
        chan.send({"op": "forked", "pid": pid})
        return chan

    def _reap_all(self):
        while True:
            try:
                pid = os.waitpid(-1, os.WNOHANG)[0]
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.copies.discard(pid)

    def _reap_copies(self, signum=None, frame=None):
        """SIGCHLD handler: reap closed copies only (the code's own children are left alone)."""
        for pid in list(self.copies):
            try:
                finished = os.waitpid(pid, os.WNOHANG)[0]
            except ChildProcessError:
                finished = pid
            if finished:
                self.copies.discard(pid)

    def _become_copy(self, fds, msg):
        """Take the new channel and output pipe, become the principal the host named (one
        ``setresuid`` the root lets through), then stop sharing anything with the zygote."""
        os.setsid()
        self.chan = Channel(fds[0])
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        close_fd(fds[1])
        uid = msg.get("uid")
        if isinstance(uid, int) and uid != self.uid:
            try:
                os.setresuid(uid, uid, uid)
            except OSError:
                os._exit(71)  # the root refused: the host sees the channel close
            if os.getresuid() != (uid, uid, uid):
                os._exit(71)
            self.uid = uid
        scratch = msg.get("scratch")
        if isinstance(scratch, str) and scratch != self.scratch:
            parent_fd = self.config.get("scratch_parent_fd")
            become_independent(self.scratch, scratch, keep_fds=(0, 1, 2, self.chan.sock.fileno(), parent_fd),
                               parent_fd=parent_fd)
            self.scratch = scratch
        return self.chan

    def serve(self):
        # Bound once, before any model code runs: replacing ``Worker.run`` or the worker's methods
        # from a step does not change what later steps report (frame tricks still could: see the
        # executor's documentation of what remains forgeable).
        chan, run, fork = self.chan, self.run, self.fork
        while True:
            try:
                msg = chan.recv()
            except (EOFError, OSError, ValueError):
                # The host closed this executor and asked the root to kill the whole tree: wait for
                # it, since exiting first would orphan the code's processes out of that tree.
                time.sleep(LINGER_S)
                os._exit(0)
            op = msg.get("op")
            if op == "run":
                chan.send(run(msg))
            elif op == "fork":
                chan = fork(chan, msg)
            elif op == "exit":
                os._exit(0)
            # anything else (a stale tool_result after a timeout) is ignored


def _refuse_audit_hooks(event, args):
    """The sandbox's own audit hook, added before any model code: it only refuses further hooks
    (an audit hook sees, and can interrupt, every step the worker starts)."""
    if event == "sys.addaudithook":
        raise RuntimeError("audit hooks cannot be added in the sandbox")


def classify(exc):
    """The outcome of an exception that escaped the model's code."""
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
