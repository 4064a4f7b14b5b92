"""Sandbox side of :mod:`codetool.executor`, the worker's **keeper**: what runs a step and says
whether it ran to its end, in a place the step's code cannot write to. Standard library only.

A worker is a fresh interpreter (``codetool.executor.host.launch.WORKER_BOOT``) whose main thread is the
keeper. It serves the host's requests on its control socket (fd ``CTL``, Unix, one message each):
``R`` run a step, ``F`` fork a copy of the state (``M``: the copy's descriptor map, sent to the
copy), ``C`` check the control socket again once the host killed the step's other processes
(answered ``c`` and the request's bytes, or ``V``), ``X`` exit. **The step's code never runs in
the main thread**: each step runs in a new thread, so the code cannot set a signal handler
(``signal.signal`` works in the main thread only) and no handler of the state's ever runs in the
keeper.

**The verdict.** The step's thread runs a chain of C iterators built by the keeper (``map``,
``filter``, ``itertools.compress``, ``os.urandom``, ``FileIO.write``, ``compile``, ``os.write``): it
draws 16 random bytes ``t``, writes them on the step's verdict socket (a new one per step, held by
the host at the other end) *before* the step's code is even compiled, then compiles and runs the
code, and writes ``t`` again only when the code returned, followed by one zero byte when it ended at
``finish``/``give_up`` instead (:func:`run_code`; the host then also wants their frame, so a bare
raise of their exception class ends nothing). ``t`` lives in the C stack of that chain, in no Python object: no code of the
state, however it reaches the interpreter's objects (``gc``, frames, rebinding any function or
module, finalizers, threads), can read it, so only a step that ran to its end can send it. Before
``t`` is written no code of the state can run: the step's thread starts in C, nothing allocates
that the garbage collector could collect (the keeper turns the collector off before a request),
no other thread exists (the keeper waited for the last step's threads to end, else the host
killed the worker), no timer is armed (disarmed after each step), no handler or fork hook of the
state exists (see above; ``os.register_at_fork`` is disabled at boot). The step's thread gets the
default stack size whatever the state chose (``threading.stack_size``, restored for its threads).

**The control socket** is the worker's, so the step's code can write on it and change it: the
host checks the reports it reads against the verdict (``host.step``, ``host.report``), and after
each step :func:`intact` compares the socket's whole state with what boot left (which socket fd
``CTL`` is, its flags, the owner and signal of its I/O signals, every socket option the kernel
answers, no filter attached, still receiving; and which directory fd ``SCRATCH_PARENT`` is, which
a fork's copy needs): a step that changed anything of it, whatever the option, is reported (``V``) and the worker ends, so that step, not the next, is the code's failure
(a state that could hide the host's next request from the keeper, or have it killed by SIGIO when
it arrives, would make the next step and every fork ``not_executed``). Nothing is repaired. A
process the step forked could still change it after that check, before the host kills it at the
step's end, so the host asks once more after that kill (``C``), as part of the step.

**Rules for the keeper's code** (the *trusted* functions below): it runs only while no code of the
state runs (between steps), or blocked in C while a step runs; every callable and constant it uses
is a default argument, bound when this module was executed at boot, before any code of the state
existed (nothing is looked up in a module, a builtin or an attribute of a Python object at call
time; the audit hook refuses to reassign ``__code__`` or ``__defaults__``); it handles only values
made by C functions, never touches an object of the state, and holds the namespace for good, so
no finalizer of the state ever runs in it. Any surprise ends the worker (``os._exit``).

**The audit hook** (:func:`audit`) refuses what reads or writes the interpreter's memory or
bypasses the rules: ``ctypes``, building code objects (``code.__new__``, ``marshal``; imports compile
from source), tracing and profiling, ``gc.get_referrers``/``get_referents``, other threads' frames,
more audit hooks, and importing test-only C modules.
"""

import _socket
import _thread
import fcntl
import gc
import io
import itertools
import json
import operator
import os
import resource
import signal
import struct
import sys

try:
    import sandbox_copy
    import sandbox_worker
except ImportError:  # imported on the host (tests, documentation tools): the package's copies
    from codetool.executor.inside import copy as sandbox_copy
    from codetool.executor.inside import worker as sandbox_worker

CTL = 3  # the control socket, in every worker
SCRATCH_PARENT = 5  # an O_PATH descriptor of the directory holding every scratch directory
TOKEN_BYTES = 16
FORK = struct.Struct(">qH")  # uid (-1: keep), length of the scratch directory's name
HELLO = struct.Struct(">iq")  # pid, uid
END = struct.Struct(">IQ")  # threads left running, CPU microseconds of the worker so far
PID = struct.Struct(">i")
UNSAFE_MODULES = frozenset(("_ctypes", "ctypes", "_ctypes_test", "_testcapi", "_testinternalcapi", "_testbuffer",
                            "_xxtestfuzz", "_testmultiphase", "_testimportmultiple", "_testclinic"))
REFUSED_EVENTS = frozenset(("sys.settrace", "sys.setprofile", "sys._current_frames", "sys.addaudithook",
                            "code.__new__", "marshal.load", "marshal.loads", "gc.get_referrers",
                            "gc.get_referents", "sys._settraceallthreads", "sys._setprofileallthreads"))
REFUSED_PREFIXES = ("ctypes.", "sys.monitoring", "cpython.")
TRUSTED = ("audit", "discard", "_guard_enter", "_guard_exit", "run_code", "step_thread", "channel_state", "intact",
           "run_step", "receive", "reap", "become_copy", "fork_copy", "serve")  # (and sandbox_copy.reopen)
GUARDED_ATTRIBUTES = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
WORKER_MODULES = ("sandbox_io", "sandbox_worker", "sandbox_copy", "sandbox_keeper")  # as launch.WORKER_MODULES
PREIMPORTS = ("json", "math", "re", "datetime", "time", "collections", "itertools", "functools", "random",
              "string", "statistics", "textwrap", "urllib.parse", "decimal", "fractions", "copy", "typing",
              "dataclasses", "heapq", "bisect", "operator", "pprint", "subprocess", "tempfile", "threading")


# ---------------------------------------------------------------------------------- audit hook
def audit(event, args, _refused=REFUSED_EVENTS, _prefixes=REFUSED_PREFIXES, _guarded=GUARDED_ATTRIBUTES,
          _unsafe=UNSAFE_MODULES, _type=type, _str=str, _len=len, _error=RuntimeError, _import_error=ImportError,
          _denied=PermissionError, _setattr=("object.__setattr__", "object.__delattr__")):
    """Refuse the events listed in the module docstring (trusted: see the rules)."""
    if event in _refused or event.startswith(_prefixes):
        raise _error(f"{event} is not available in the sandbox")
    if event in _setattr and _len(args) > 1 and (_type(args[1]) is not _str or args[1] in _guarded):
        raise _error("functions' __code__ and __defaults__ cannot be changed in the sandbox")
    if event == "import" and args and (_type(args[0]) is not _str or args[0].partition(".")[0] in _unsafe
                                       or args[0].rpartition(".")[2] in _unsafe):  # (the name its init has)
        raise _import_error("this module is not available in the sandbox")
    if event == "open" and args and _type(args[0]) is _str and args[0].startswith("/proc/") \
            and args[0].rstrip("/").rpartition("/")[2] in ("mem", "map_files"):
        raise _denied(1, "the memory of processes cannot be read in the sandbox")


# ------------------------------------------------------------------------------ the step
def discard(fd, _close=os.close, _oserror=OSError):
    """Close ``fd`` if it is still open (trusted)."""
    try:
        _close(fd)
    except _oserror:
        pass


def _guard_enter(self):
    return None


def _guard_exit(self, kind, value, tb, _end=sandbox_worker.EndStep):
    """Ends the step quietly at ``finish``/``give_up`` (exactly their exception class), nothing else."""
    return kind is _end


def run_code(code, namespace, guard, _exec=exec):
    """Run the step's code object: 1 when it returned, 0 when it ended at ``finish``/``give_up``
    (their exception, which the guard stops). The guard's ``__exit__`` is taken when the ``with``
    starts (a fresh class per step, made by the keeper), and nothing but constants is read in this
    frame after the code ran."""
    with guard:
        _exec(code, namespace)
        return 1
    return 0


def step_thread(done, chain, describe, _next=next, _base=BaseException):
    """The step's thread: run the chain; an exception of the code is described for the model (not
    trusted); then wake the keeper (which still waits for every thread to be gone: a release by
    the code only wakes it early)."""
    try:
        try:
            _next(chain)
        except _base as exc:
            describe(exc)
    finally:
        done.release()


# fd CTL's state, as boot left it (issue 37, red teams): what a step may not change. Every SOL_SOCKET
# option the kernel answers for it is read, whatever it does, but these: SO_ERROR (reading clears it),
# SO_GET_FILTER (the kernel copies 8 bytes per block into a buffer it counts in blocks: read it, and
# a filter of the step's would overrun the keeper's buffer; SO_DETACH_FILTER tells instead),
# SO_MEMINFO (the queues, which the host's messages change), SO_PEERPIDFD (each read makes a descriptor).
SOCKET_OPTIONS = tuple(option for option in range(1, 128) if option not in (4, 26, 55, 77))
SO_DETACH_FILTER = 27
FCNTL_READS = ((fcntl.F_GETFD, 0), (fcntl.F_GETFL, 0), (fcntl.F_GETOWN, 0), (11, 0), (16, bytes(8)),  # F_GETSIG,
               (1025, 0), (1032, 0))  # F_GETOWN_EX (type, pid), F_GETLEASE, F_GETPIPE_SZ


def channel_state(ctl, *, _fstat=os.fstat, _fcntl=fcntl.fcntl, _getsockopt=_socket.socket.getsockopt,
                  _level=_socket.SOL_SOCKET, _options=SOCKET_OPTIONS, _reads=FCNTL_READS, _oserror=OSError,
                  _append=list.append, _tuple=tuple, _ctl=CTL, _parent=SCRATCH_PARENT, _getfd=fcntl.F_GETFD,
                  _getfl=fcntl.F_GETFL):
    """The state of the control socket (fd ``CTL``) as the kernel reports it (trusted: see the
    rules): which socket the descriptor is (device, inode), its descriptor and file status flags
    (``O_NONBLOCK``, ``O_ASYNC``...), the owner and signal of its I/O signals, and the value of
    every ``SOL_SOCKET`` option it answers (``None`` where the kernel refuses); and which directory
    fd ``SCRATCH_PARENT`` is, with its flags (a fork's copy finds its scratch there: a state that
    closed or replaced it would make every fork of it fail to start). Taken at boot (and in a fork's
    copy once it has its own channel) and after each step (:func:`intact`)."""
    state: list = []  # (a local annotation is never evaluated)
    try:
        _append(state, (_fstat(_parent)[1:3], _fcntl(_parent, _getfd), _fcntl(_parent, _getfl)))
    except _oserror:
        _append(state, None)
    try:
        _append(state, _fstat(_ctl)[1:3])
    except _oserror:
        _append(state, None)
    for command, argument in _reads:
        try:
            _append(state, _fcntl(_ctl, command, argument))
        except _oserror:
            _append(state, None)
    for option in _options:
        try:
            _append(state, _getsockopt(ctl, _level, option, 64))
        except _oserror:
            _append(state, None)
    return _tuple(state)


def intact(ctl, boot, *, _state=channel_state, _setsockopt=_socket.socket.setsockopt, _level=_socket.SOL_SOCKET,
           _detach=SO_DETACH_FILTER, _none=FileNotFoundError, _recv=_socket.socket.recv,
           _peek=_socket.MSG_PEEK | _socket.MSG_DONTWAIT, _waiting=BlockingIOError, _oserror=OSError, _len=len):
    """After a step, whether the control socket is as boot left it (trusted: see the rules; it
    reads only the kernel's answers): the same state (:func:`channel_state`, compared as a whole,
    so whatever the step changed counts, and nothing is repaired), no socket filter attached
    (detached here: ``ENOENT`` when there was none; a locked one refuses), and it still receives (a
    socket shut down for reading peeks the end of the stream, since the host sends nothing while
    a step runs). ``False``: the step broke its worker's channel, the keeper reports it (``V``)."""
    try:
        try:
            _setsockopt(ctl, _level, _detach, 0)
            return False  # a filter was attached
        except _none:
            pass
        if _state(ctl) != boot:
            return False
        try:
            return _len(_recv(ctl, 1, _peek)) > 0
        except _waiting:
            return True  # nothing waiting, as it should be: it works
    except _oserror:
        return False


def run_step(ctl, source, fds, namespace, calls, step, forked, grace, boot, *,
             _repeat=itertools.repeat, _map=map, _filter=filter, _compress=itertools.compress,
             _urandom=os.urandom, _fileio=io.FileIO, _compile=compile, _run=run_code, _bool=bool, _int=int,
             _bytes=bytes, _add=operator.add, _write=os.write, _type=type, _lock=_thread.allocate_lock,
             _start=_thread.start_new_thread, _thread_fn=step_thread, _count=_thread._count,
             _sleep=__import__("time").sleep, _gc_disable=gc.disable, _setitimer=signal.setitimer,
             _timers=(signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF), _close=os.close,
             _rusage=resource.getrusage, _self=resource.RUSAGE_SELF, _send=_socket.socket.send,
             _end=END.pack, _enter=_guard_enter, _exit=_guard_exit, _error=RuntimeError, _quit=os._exit,
             _min=min, _round=round, _str=str, _len=len,
             _token=TOKEN_BYTES, _decode=bytes.decode, _sub=operator.sub, _discard=discard, _intact=intact,
             _stack_size=_thread.stack_size):
    """Run one step (trusted: see the rules); returns the step count. ``calls`` are the state's
    ``(pre, after, describe)``, bound at boot; they run in the step's thread, after ``t`` is sent."""
    try:
        pre, after, describe = calls
        if _len(fds) != 2:
            for fd in fds:
                _close(fd)
            _send(ctl, b"x" + b"a run needs its verdict and tool sockets")
            return step
        verdict, tool = fds
        step += 1
        filename = f"<step {step}>"
        guard = _type("guard", (), {"__enter__": _enter, "__exit__": _exit})()
        token = _filter(_fileio(verdict, "wb", closefd=False).write, _map(_urandom, _repeat(_token, 1)))
        ready = _map(pre, _repeat(tool, 1), _repeat(source, 1), _repeat(filename, 1), _repeat(forked, 1))
        text = _map(_decode, _repeat(source, 1), _repeat("utf-8", 1), _repeat("surrogatepass", 1))
        code = _map(_compile, _compress(text, ready), _repeat(filename, 1), _repeat("exec", 1),
                    _repeat(0, 1), _repeat(True, 1))
        ran = _map(_run, code, _repeat(namespace, 1), _repeat(guard, 1))  # 1 returned, 0 finish/give_up
        mark = _map(_bytes, _map(_sub, _repeat(1, 1), ran))  # b"" returned, b"\\x00" finish/give_up
        rest = _map(_bytes, _map(_int, _map(_bool, _map(after, _repeat(None, 1)))))  # b"" unless tampered
        chain = _map(_write, _repeat(verdict, 1), _map(_add, token, _map(_add, mark, rest)))
        done = _lock()
        done.acquire()
        chosen = _stack_size(0)  # the state's threading.stack_size is for its threads, not the step's
        try:
            _start(_thread_fn, (done, chain, describe))
        except _error as exc:  # no thread: the machine's limit, not the code's
            _stack_size(chosen)
            _discard(verdict)
            _discard(tool)
            _send(ctl, b"N" + _str(exc).encode("ascii", "replace")[:200])
            return step - 1
        _stack_size(chosen)
        done.acquire()
        left, waited, pause = _count(), 0.0, 0.0001
        while left and waited < grace:  # the step's thread is ending; threads it left get a moment
            _sleep(pause)
            waited += pause
            pause = _min(pause * 2, 0.005)
            left = _count()
        if left:  # they could act between steps: the host kills the state
            _send(ctl, b"E" + _end(left, 0))
            _quit(0)
        _gc_disable()
        for which in _timers:
            _setitimer(which, 0)
        _discard(verdict)  # (the step's code may have closed them already)
        _discard(tool)
        if not _intact(ctl, boot):  # the code changed its channel: the host hears it now, from this step
            _send(ctl, b"V")
            _quit(0)
        usage = _rusage(_self)
        _send(ctl, b"E" + _end(0, _int(_round((usage.ru_utime + usage.ru_stime) * 1e6))))
        return step
    except:  # noqa: E722 - no name looked up: anything unexpected ends the worker, the host sees it
        _quit(70)


# ------------------------------------------------------------------------------- messages
def receive(ctl, *, _recv_into=_socket.socket.recv_into, _recvmsg=_socket.socket.recvmsg, _buffer=bytearray,
            _peek=_socket.MSG_PEEK | _socket.MSG_TRUNC, _space=_socket.CMSG_SPACE(4 * 8), _rights=_socket.SCM_RIGHTS,
            _level=_socket.SOL_SOCKET, _view=memoryview, _tuple=tuple, _len=len, _quit=os._exit, _max=max,
            _private=os.set_inheritable, _gc_disable=gc.disable):
    """The next message and the descriptors sent with it, close-on-exec (a program the step starts
    holds none); the host's end closed: the worker ends."""
    size = _recv_into(ctl, _buffer(1), 1, _peek)  # (blocks; allocates nothing the collector tracks)
    if size <= 0:
        _quit(0)
    _gc_disable()  # before the keeper allocates: no finalizer of the state runs in it
    data, ancillary, _, _ = _recvmsg(ctl, _max(size, 1), _space)
    fds: tuple = ()  # (a local annotation is never evaluated: no name is looked up)
    for level, kind, raw in ancillary:
        if level == _level and kind == _rights:
            fds = fds + _tuple(_view(raw[:_len(raw) - _len(raw) % 4]).cast("i"))
    for fd in fds:
        _private(fd, False)
    return data, fds


def reap(_waitpid=os.waitpid, _nohang=os.WNOHANG, _error=ChildProcessError):
    """Reap what the host killed (the last step's processes) and closed copies."""
    while True:
        try:
            if _waitpid(-1, _nohang)[0] == 0:
                return
        except _error:
            return


# ---------------------------------------------------------------------------------- forks
def become_copy(ctl, payload, fds, parent_path, *, _setsid=os.setsid, _dup2=os.dup2, _close=os.close,
                _unpack=FORK.unpack_from, _size=FORK.size, _setresuid=os.setresuid, _getresuid=os.getresuid,
                _chdir=os.chdir, _putenv=os.putenv, _receive=receive, _reopen=sandbox_copy.reopen,
                _send=_socket.socket.send, _hello=HELLO.pack, _getpid=os.getpid, _quit=os._exit, _ctl=CTL,
                _parent=SCRATCH_PARENT, _oserror=OSError):
    """In the copy, before it serves anything: a session of its own, the new control socket and
    output pipe, its own uid (one ``setresuid`` the host lets through), its own scratch directory
    and copies of the zygote's open files there (the map comes from the host), then hello. Returns
    the rest of the request (the copy's tool names as JSON, for its state), or ``b"-"``."""
    ctl_fd, out_fd = fds
    _setsid()
    _dup2(out_fd, 1)
    _dup2(out_fd, 2)
    _close(out_fd)
    _dup2(ctl_fd, _ctl, False)  # the keeper's socket object now speaks on the copy's channel
    _close(ctl_fd)
    uid, length = _unpack(payload, 1)
    name = payload[1 + _size:1 + _size + length].decode("ascii")
    if uid >= 0:
        try:
            _setresuid(uid, uid, uid)
        except _oserror:
            _quit(71)  # refused: the host sees the channel close
        if _getresuid() != (uid, uid, uid):
            _quit(71)
    message, more = _receive(ctl)
    if message[:1] != b"M" or more:
        _quit(72)
    _chdir(_parent)
    _chdir(name)
    _reopen(message[1:])
    path = parent_path + "/" + name
    _putenv("HOME", path)
    _putenv("TMPDIR", path)
    _send(ctl, b"h" + _hello(_getpid(), uid))
    return payload[1 + _size + length:] or b"-"


def fork_copy(ctl, payload, fds, parent_path, *, _fork=os.fork, _close=os.close, _send=_socket.socket.send,
              _pack=PID.pack, _oserror=OSError, _len=len, _str=str, _become=become_copy, _quit=os._exit):
    """Fork the state (trusted). Returns ``False`` in the zygote and, in the copy, once it became
    its own principal, what :func:`become_copy` returns (true)."""
    try:
        if _len(fds) != 2:
            for fd in fds:
                _close(fd)
            _send(ctl, b"x" + b"a fork needs a control socket and an output pipe")
            return False
        try:
            pid = _fork()
        except _oserror as exc:
            for fd in fds:
                _close(fd)
            _send(ctl, b"x" + _str(exc).encode("ascii", "replace")[:200])
            return False
        if pid:
            for fd in fds:
                _close(fd)
            _send(ctl, b"f" + _pack(pid))
            return False
        return _become(ctl, payload, fds, parent_path)
    except:  # noqa: E722
        _quit(70)


def serve(ctl, namespace, calls, hello, grace, parent_path, *, _reap=reap, _receive=receive, _run=run_step,
          _fork=fork_copy, _state=channel_state, _intact=intact, _send=_socket.socket.send, _quit=os._exit):
    """The keeper's loop (trusted); it never returns."""
    step, forked = 0, 0
    boot = _state(ctl)  # (before any code of the state ran)
    _send(ctl, hello)
    while True:
        message, fds = _receive(ctl)  # (which turns the collector off first)
        _reap()
        op = message[:1]
        if op == b"R":
            step = _run(ctl, message[1:], fds, namespace, calls, step, forked, grace, boot)
            forked = 0
        elif op == b"C":  # after the host killed the step's other processes: fd 3 checked once more
            if fds or not _intact(ctl, boot):
                _send(ctl, b"V")
                _quit(0)
            _send(ctl, b"c" + message[1:])
        elif op == b"F":
            copied = _fork(ctl, message, fds, parent_path)
            if copied:
                boot = _state(ctl)  # the copy's own channel, as the host made it
            if copied and (copied != b"-" or not forked):  # the copy: its first step redoes what a
                forked = copied  # fork changes, and sets the tools still due (a copy forked before it ran)
        elif op == b"X":
            _quit(0)
        else:
            _quit(72)


# ------------------------------------------------------------------------------------ boot
def main(settings):
    """Boot the keeper (before any code of the state): the modules the code will import, the
    signal handlers, the state, the audit hook; then serve. Never returns."""
    sys.argv = ["<sandbox>"]
    for name in PREIMPORTS + tuple(sys.builtin_module_names):
        try:
            __import__(name)
        except ImportError:
            pass
    imp = sys.modules["_imp"]
    del imp.create_builtin  # no second instance of a builtin module (and so no real register_at_fork)
    sys.implementation.cache_tag = None  # type: ignore[assignment]  # no cache: imports compile from source (marshal is refused)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the keeper has no Python signal handler at all
    state = sandbox_worker.State(settings["tools"], int(settings["max_output_chars"]))
    uid = settings.get("uid")
    info = {key: settings.get(key) for key in ("limits", "seccomp", "principal", "mounts")}
    info["python"] = list(sys.version_info[:3])
    hello = b"h" + HELLO.pack(os.getpid(), -1 if uid is None else int(uid)) + json.dumps(info).encode("ascii")
    for name in WORKER_MODULES:
        sys.modules.pop(name, None)  # not importable by the code (their objects stay reachable)
    ctl = _socket.socket(fileno=CTL)
    for fd in (CTL, SCRATCH_PARENT):  # the keeper's own: no program the code starts holds them
        fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    sys.addaudithook(audit)
    gc.collect()
    serve(ctl, state.namespace, (state.pre, state.after, state.describe), hello, float(settings.get("grace", 0.5)),
          str(settings["scratch_parent"]))
