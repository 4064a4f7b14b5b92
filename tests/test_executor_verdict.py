"""Issue 37: the verdict of a step is out of its code's reach. Every forgery of the issue and of
the executor's former docstring, tried as a step that reads the source would, for itself and for
the steps that come after it (in its own state and in its forks). Each failed on the code before
the keeper (``codetool.executor.inside.keeper``): a forged step read ``ok``.

A forgery "works" when a step whose code raised reads ``ok`` (or ``timeout``, or ``not_executed``).
Legitimate Python still counts: ``try``/``except`` around the step's own code makes it ``ok``.
"""

from __future__ import annotations

import pytest

from tests.conftest import kept_state_root

CONFIG = dict(timeout_s=5.0, grace_s=0.3, memory_mb=512, max_processes=24, max_output_chars=5000,
              scratch_mb=16, max_step_mb=4)

# The forging steps, written against the worker before the keeper (its ``Worker`` object, found with
# ``gc``, and its ``classify``); each also tries what would reach the keeper's design. A plant is a
# step of its own; the step after it and the steps of its forks fail (``LATER``) and must read so.
GRAB = ("import gc, os, json, struct, threading, sys\n"
        "w = next((o for o in gc.get_objects() if type(o).__name__ == 'Worker'), None)\n"
        "DONE = {'op': 'done', 'outcome': 'ok', 'error_type': None, 'error_message': None,"
        " 'output_dropped': 0, 'cpu_s': 0.0}\n"
        "def forge():\n"
        "    if w is not None:  # the old worker: a done frame of the current step, its nonce stamped\n"
        "        w.chan.old_threads = set()\n"
        "        w.chan.send(DONE)\n"
        "        return\n"
        "    for fd in range(3, 64):  # the keeper: guess at the verdict socket\n"
        "        try:\n            os.write(fd, os.urandom(16))\n        except OSError:\n            pass\n")
PLANTS = {
    # the one line: the old worker classified exceptions with a function of its module
    "classify": "finish.__globals__['classify'] = lambda e: 'ok'",
    # swap the code of that function
    "code_swap": ("import gc\n"
                  "for f in [o for o in gc.get_objects() if type(o).__name__ == 'function' and o.__name__ == 'classify']:\n"
                  "    try:\n        f.__code__ = (lambda e: 'ok').__code__\n    except BaseException:\n        pass"),
    # rebind a module the harness uses (every report of the worker says ok)
    "rebind": ("import json, builtins, os, operator, itertools\n_dumps = json.dumps\n"
               "def dumps(obj, *a, **k):\n"
               "    if isinstance(obj, dict) and obj.get('op') == 'done':\n"
               "        obj = dict(obj, outcome='ok', error_type=None, error_message=None)\n"
               "    return _dumps(obj, *a, **k)\n"
               "json.dumps = dumps\nos.urandom = lambda n: b'A' * n\nos.write = lambda fd, data: len(data)\n"
               "operator.add = lambda a, b: a\nbuiltins.exec = lambda *a, **k: None"),
    # a collector callback (and a finalizer in a garbage cycle) that reports ok while a later step runs
    "finalizers": (GRAB + "def callback(phase, info):\n"
                   "    if phase == 'stop' and (w is None or w.in_step):\n        forge()\n"
                   "gc.callbacks.append(callback)\n"
                   "class Plant:\n    def __del__(self):\n        forge()\n"
                   "a, b = Plant(), Plant()\na.other, b.other = b, a\ndel a, b"),
    # an import hook that raises the exception class of finish/give_up in a later step's import
    "end_class": ("import gc, sys\n"
                  "End = [o for o in gc.get_objects() if isinstance(o, type) and o.__name__ in ('_EndStep', 'EndStep')][0]\n"
                  "class Finder:\n    def find_spec(self, *a):\n        raise End()\n"
                  "sys.meta_path.insert(0, Finder())"),
    # a fork hook that plants the one line in every copy of the state
    "fork_hook": ("import os\n"
                  "plant = lambda: finish.__globals__.__setitem__('classify', lambda e: 'ok')\n"
                  "os.register_at_fork(after_in_child=plant)"),
    # a thread that outlives the step and keeps reporting ok (as the current step)
    "threads": (GRAB + "import time\n"
                "def loop():\n    while True:\n        if w is None or w.in_step:\n            forge()\n"
                "        time.sleep(0.001)\n"
                "threading.Thread(target=loop, daemon=True).start()\nthreading.Timer(0.05, loop).start()"),
    # hooks that would run code later: audit, tracing, signal handlers, excepthooks, atexit
    "hooks": ("import sys, atexit, threading, signal\n"
              "def swallow(*a):\n    return swallow\n"
              "for install in (lambda: sys.addaudithook(lambda e, a: None), lambda: sys.settrace(swallow),\n"
              "                lambda: sys.setprofile(swallow), lambda: threading.settrace(swallow),\n"
              "                lambda: signal.signal(signal.SIGUSR1, lambda *a: None), lambda: atexit.register(print),\n"
              "                lambda: setattr(sys, 'unraisablehook', lambda *a: None),\n"
              "                lambda: setattr(sys, 'excepthook', lambda *a: None)):\n"
              "    try:\n        install()\n    except BaseException:\n        pass"),
}
# A later step that fails: it imports a module not imported yet, allocates, and takes a moment.
LATER = ("import xml.dom.minidom\nx = [[] for _ in range(100000)]\nimport time\ntime.sleep(0.3)\n"
         "raise ValueError('a later step fails')")


@pytest.fixture(scope="module")
def root(mode):
    yield from kept_state_root(mode, CONFIG, tools={"lookup": lambda city="": {"city": city}})


def _assert_failed(r, error_type=None):
    assert not r.ok and r.outcome in ("runtime_error", "sandbox_violation", "worker_lost"), r
    if error_type:
        assert r.error_type == error_type, r


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_step_cannot_forge_its_own_failure_nor_its_descendants(root, plant):
    ex = root.fork()
    try:
        ex.run(PLANTS[plant])
        _assert_failed(ex.run("raise KeyError('it fails itself')"), "KeyError")
        child = ex.fork()  # a fork of the planted state reports honestly too
        try:
            _assert_failed(child.run(LATER))
            _assert_failed(child.run("undefined_name"), "NameError")
        finally:
            child.close()
        _assert_failed(ex.run(LATER))
        assert ex.run("print('honest')").ok  # and an honest later step still reads ok
    finally:
        ex.close()


def test_catching_its_own_errors_is_still_running(root):
    ex = root.fork()
    try:
        r = ex.run("try:\n    {}['missing']\nexcept KeyError:\n    pass\nprint('caught')")
        assert r.ok and r.stdout == "caught\n", r
        r = ex.run("try:\n    raise SystemExit(3)\nexcept BaseException:\n    pass")
        assert r.ok, r
    finally:
        ex.close()


def test_a_class_named_like_a_host_verdict_is_the_codes_error(root):
    ex = root.fork()
    try:
        r = ex.run("class Timeout(BaseException):\n    pass\n"
                   "raise Timeout('Timeout: the step ran longer than 5 s and was stopped')")
        assert r.outcome == "runtime_error" and not r.timed_out, r
        assert r.error_type == "Timeout (raised by the code)", r
        r = ex.run("class MemoryLimit(Exception):\n    pass\nraise MemoryLimit('x')")
        assert r.outcome == "runtime_error" and r.error_type == "MemoryLimit (raised by the code)", r
        r = ex.run("class ToolOutage(Exception):\n    pass\nraise ToolOutage('a tool call failed')")
        assert r.outcome == "runtime_error" and r.error_type == "ToolOutage (raised by the code)", r
    finally:
        ex.close()


def test_finish_ends_the_step_and_a_bare_raise_of_its_class_does_not(root):
    ex = root.fork()
    try:
        r = ex.run("print('before')\nfinish('the answer')\nprint('never')")
        assert r.ok and r.final_answer == "the answer" and r.stdout == "before\n", r
        r = ex.run("def deep(n):\n    return deep(n - 1) if n else give_up('no data')\ndeep(30)")
        assert r.ok and r.give_up_reason == "no data", r
        r = ex.run("import gc\nEnd = [o for o in gc.get_objects() if isinstance(o, type) and o.__name__ == 'EndStep'][0]\n"
                   "raise End()")
        _assert_failed(r)
        assert r.final_answer is None
    finally:
        ex.close()


def test_a_step_that_writes_on_its_verdict_channel_fails(root):
    ex = root.fork()
    try:
        r = ex.run("import os\nfor fd in range(3, 64):\n"
                   "    try:\n        os.write(fd, os.urandom(16))\n    except OSError:\n        pass\nprint('done')")
        assert not r.ok and r.outcome in ("sandbox_violation", "runtime_error"), r
    finally:
        ex.close()


def test_threads_a_step_leaves_cannot_act_between_steps(root):
    ex = root.fork()
    try:
        r = ex.run("import threading, time\nticks = []\n"
                   "threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.01) for _ in iter(int, 1)], "
                   "daemon=True).start()")
        assert r.ok and r.state_lost, r  # the verdict stands; the state (with its thread) is killed
        r = ex.run("print('kept' in globals(), 'ticks' in globals())")
        assert r.ok and r.stdout == "False False\n", r
    finally:
        ex.close()


# The keeper's own reports on the worker's control socket (fd 3), written by a step (red team of
# issue 37): "could not start the step's thread" (``N``) made the step ``not_executed`` and retried
# it; a forged end (``E``) let the step's thread run on while the host thought the worker idle.
FORGED_REPORTS = {
    "N": "import os\nos.write(3, b'N')",
    "N_hiding_a_failure": "try:\n    undefined_name\nexcept NameError:\n    import os\n    os.write(3, b'Nno thread')",
    "N_on_a_socket": "import socket\ns = socket.socket(fileno=3)\ns.send(b'N')\ns.detach()",
    "E_then_N": "import os, struct, time\nos.write(3, b'E' + struct.pack('>IQ', 0, 0))\ntime.sleep(1)\nos.write(3, b'N')",
    "E_then_spin": ("import os, struct, time\nos.write(3, b'E' + struct.pack('>IQ', 0, 0))\n"
                    "end = time.process_time() + 1\nwhile time.process_time() < end:\n    pass\nos.write(3, b'N')"),
}


@pytest.mark.parametrize("forgery", sorted(FORGED_REPORTS))
def test_a_step_cannot_forge_its_keepers_reports(root, forgery):
    """A genuine ``N`` comes only before the step's first token; one after it is the code's: a
    ``sandbox_violation`` (its state is killed), never ``not_executed`` nor retried. A forged ``E``
    while the step's thread still runs (asleep or using CPU) is a thread left behind: the step has
    not ended, so it is the code's failure, and its state is killed with the thread (it can write
    nothing later); the next step runs once, in a fresh state.
    Before: ``not_executed``/``WorkerStart`` after 4 attempts (``E_then_N``: its next step)."""
    ex = root.fork()
    try:
        r = ex.run(FORGED_REPORTS[forgery])
        assert r.executed and r.attempts == 1 and r.state_lost and not r.ok, r
        if forgery.startswith("N"):
            assert r.outcome == "sandbox_violation" and r.error_type == "ProtocolError", r
        else:
            assert r.outcome == "runtime_error" and "did not run to its end" in r.error_message, r
        r = ex.run("import time\ntime.sleep(1.2)\nprint('next')")
        assert r.ok and r.attempts == 1 and r.stdout == "next\n", r
    finally:
        ex.close()


def test_a_c_thread_a_clean_step_leaves_does_not_make_its_end_report_a_forgery(root):
    """``faulthandler``'s watchdog is a C thread the keeper's thread count does not see: the step
    ran to its end, so it is ``ok``, and its state goes with the thread (threads left behind).
    Before (the first forged-report check): ``sandbox_violation``, a clean step charged."""
    ex = root.fork()
    try:
        r = ex.run("import faulthandler\nfaulthandler.dump_traceback_later(1000)\nprint('clean')")
        assert r.ok and r.stdout == "clean\n" and r.state_lost, r
        r = ex.run("print('next')")
        assert r.ok and r.attempts == 1 and r.stdout == "next\n", r
    finally:
        ex.close()


# A step that changes the worker's control socket (fd 3) so that its keeper dies, or never hears
# the host, after it: before, the step read ``ok`` and the next step (or fork) ``not_executed``
# (``StateLost``, or ``HostBusy`` at the backstop): a way out of any episode. The first four the
# keeper repaired before (the state lived on; a read shutdown was reported); the others, a second
# red team's, survived the repair. Each opens ``s = socket.socket(fileno=3)`` and detaches it.
SOCKET = "import socket, struct, fcntl, os\ns = socket.socket(fileno=3)\n"
BROKEN_CHANNELS = {
    "non_blocking": "import os\nos.set_blocking(3, False)",
    "non_blocking_failing": "import os\nos.set_blocking(3, False)\nundefined_name",
    "receive_timeout": SOCKET + "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack('ll', 0, 1000))",
    "shut_for_reading": SOCKET + "s.shutdown(socket.SHUT_RD)",
    # credentials / a timestamp with every message: they fill the keeper's ancillary buffer
    "passcred": SOCKET + "s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)",
    "timestamp": SOCKET + "s.setsockopt(socket.SOL_SOCKET, 29, 1)",  # SO_TIMESTAMP(_OLD)
    # the keeper's peek starts 1 MiB into the queue: it never sees a request
    "peek_offset": SOCKET + "s.setsockopt(socket.SOL_SOCKET, 42, 1 << 20)",  # SO_PEEK_OFF
    # a classic BPF program that drops every message, built in pure Python (its address: id + 32)
    "drop_filter": (SOCKET + "program = struct.pack('HBBI', 0x06, 0, 0, 0)\n"  # BPF_RET | BPF_K, 0
                    "s.setsockopt(socket.SOL_SOCKET, 26, struct.pack('HxxxxxxQ', 1, id(program) + 32))"),
    # no descriptors with a message any more: a request's sockets are cut off (Linux 6.16+)
    "no_rights": SOCKET + "s.setsockopt(socket.SOL_SOCKET, 83, 0)",  # SO_PASSRIGHTS
    # not fd 3: the directory a fork's copy finds its scratch in (every fork of the state failed to start)
    "scratch_parent_closed": "import os\nos.close(5)",
}


# SIGIO to the worker at the next request (its default action ends the process): refused by the
# seccomp filter now, so only the tests of the host's backstops plant it (their filter lacks the rule)
IO_SIGNAL = ("import fcntl, os\nfcntl.fcntl(3, fcntl.F_SETOWN, os.getpid())\n"
             "fcntl.fcntl(3, fcntl.F_SETFL, fcntl.fcntl(3, fcntl.F_GETFL) | os.O_ASYNC)")
# Ways to have the kernel signal the worker later, on the state's behalf, and to stop it: each is
# refused (``EPERM``, the step's own failure), the next step and a fork run. Before (red team, round 5):
# a kept tool socket set to SIGTERM killed the worker as the host closed its end: next step and forks
# ``not_executed``; a child's SIGSTOP at the step's end left a keeper that never answers.
SIGNALLING = {
    "kept_socket_sigterm": ("import os, fcntl, signal\nk = os.dup(6)\nfcntl.fcntl(k, fcntl.F_SETOWN, os.getpid())\n"
                            "fcntl.fcntl(k, 10, signal.SIGTERM)\n"
                            "fcntl.fcntl(k, fcntl.F_SETFL, fcntl.fcntl(k, fcntl.F_GETFL) | os.O_ASYNC)"),
    "io_signal_on_fd_3": IO_SIGNAL,
    "f_setsig": "import fcntl, signal\nfcntl.fcntl(3, 10, signal.SIGHUP)",
    "ioctl_fioasync": "import fcntl, os, struct\nfcntl.ioctl(os.dup(6), 0x5452, struct.pack('i', 1))",
    "ioctl_fiosetown": "import fcntl, os, struct\nfcntl.ioctl(os.dup(6), 0x8901, struct.pack('i', os.getpid()))",
    "stop": "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
    "stop_from_a_child": "import os, signal, sys\nparent = os.getpid()\nif os.fork() == 0:\n    try:\n"
                         "        os.kill(parent, signal.SIGTSTP)\n    except PermissionError:\n"
                         "        print('refused')\n    sys.stdout.flush()\n    os._exit(0)\nos.wait()",
}


@pytest.mark.parametrize("plant", sorted(SIGNALLING))
def test_a_step_cannot_have_its_worker_signalled_later_or_stopped(root, plant):
    if "seccomp" not in root.isolation:
        pytest.skip("no seccomp filter on this machine")
    ex = root.fork()
    try:
        r = ex.run("try:\n" + "\n".join("    " + line for line in SIGNALLING[plant].splitlines())
                   + "\nexcept PermissionError:\n    print('refused')")
        assert r.executed and r.stdout.endswith("refused\n"), r
        child = ex.fork()
        try:
            r = child.run("print('next')", timeout_s=2.0)
            assert r.ok and r.attempts == 1 and r.stdout == "next\n", r
        finally:
            child.close()
        r = ex.run("print('next')", timeout_s=2.0)
        assert r.ok and r.attempts == 1 and r.stdout == "next\n", r
    finally:
        ex.close()


def _kernel_knows(option: int) -> bool:
    import socket

    a, b = socket.socketpair()
    try:
        a.getsockopt(socket.SOL_SOCKET, option)
        return True
    except OSError:
        return False
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("breakage", sorted(BROKEN_CHANNELS))
def test_a_step_that_breaks_its_control_channel_answers_for_it(root, breakage):
    """After each step the keeper compares its control socket's whole state (flags, I/O signal
    owner, every socket option, no filter), and which directory fd 5 is, with what boot left; any
    change is reported (``V``) at
    once: this step is the code's ``sandbox_violation`` and its state is killed. The next step and
    a fork run once, in a fresh state (they are executed, never ``not_executed``). Before: the
    step read ``ok`` (``non_blocking``, ``receive_timeout``: repaired; the six socket options: the
    next step ``not_executed``; ``scratch_parent_closed``: every fork ``not_executed``)."""
    if breakage == "no_rights" and not _kernel_knows(83):
        pytest.skip("this kernel has no SO_PASSRIGHTS (Linux 6.16+)")
    code = BROKEN_CHANNELS[breakage]
    if code.startswith(SOCKET):
        code += "\ns.detach()"
    ex = root.fork()
    try:
        r = ex.run(code + "\nprint('planted')")
        assert r.executed and r.attempts == 1 and r.outcome == "sandbox_violation" and r.state_lost, r
        child = ex.fork()
        try:
            r = child.run("print('next')", timeout_s=2.0)
            assert r.executed and r.attempts == 1 and r.ok and r.stdout == "next\n", r
        finally:
            child.close()
        r = ex.run("print(globals().get('kept', 'fresh'))", timeout_s=2.0)
        assert r.executed and r.attempts == 1 and r.ok and r.stdout == "fresh\n", r
    finally:
        ex.close()


CTL_TO_VERDICT = ("import os, socket\nkeep = os.dup(3)\n"
                  "for fd in range(4, 64):\n    try:\n        s = socket.socket(fileno=fd)\n"
                  "    except OSError:\n        continue\n    kind = s.type\n    s.detach()\n"
                  "    if kind == socket.SOCK_SEQPACKET and fd != keep:\n        os.dup2(fd, 3)\n        break\n"
                  "undefined_name")


def test_a_step_that_sends_its_keepers_end_report_to_its_verdict_channel_fails(root):
    """``dup2`` of the verdict socket onto fd 3: the keeper's end report lands on the verdict
    channel and the host never hears it on its control socket. Before: ``not_executed``
    (``HostBusy``) at the backstop; now the host finds the verdict tampered with once the step's
    thread is gone: ``sandbox_violation``."""
    ex = root.fork()
    try:
        r = ex.run(CTL_TO_VERDICT, timeout_s=1.0)
        assert r.executed and r.outcome == "sandbox_violation" and r.error_type == "ProtocolError", r
        assert r.state_lost
    finally:
        ex.close()


MEMORY = ("import sys, types, marshal, gc\nfound = {}\n"
          "attempts = {'ctypes': lambda: __import__('ctypes'), '_ctypes': lambda: __import__('_ctypes'),\n"
          "            '/proc/self/mem': lambda: open('/proc/self/mem', 'rb'),\n"
          "            'code.replace': lambda: (lambda: 0).__code__.replace(co_consts=(None, 1)),\n"
          "            'marshal.loads': lambda: marshal.loads(marshal.dumps((lambda: 0).__code__)),\n"
          "            '_testcapi': lambda: __import__('_testcapi'), 'gc.get_referrers': lambda: gc.get_referrers(found),\n"
          "            'sys._current_frames': lambda: sys._current_frames(), 'sys.settrace': lambda: sys.settrace(None)}\n"
          "def renamed():  # the C module loaded under another name (its init function has the last part)\n"
          "    import _imp, glob, importlib.machinery as m, os\n"
          "    path = next(p for d in sys.path if os.path.isdir(d) for p in glob.glob(d + '/_ctypes.*.so'))\n"
          "    _imp.create_dynamic(m.ModuleSpec('x._ctypes', m.ExtensionFileLoader('x._ctypes', path), origin=path))\n"
          "def child():  # a program the step starts, reading the worker's memory\n"
          "    import os, subprocess\n"
          "    code = f'open(\"/proc/{os.getpid()}/mem\", \"rb\")'\n"
          "    if subprocess.run([sys.executable, '-c', code], capture_output=True).returncode:\n"
          "        raise PermissionError\n"
          "attempts.update({'_ctypes renamed': renamed, '/proc/<worker>/mem from a child': child})\n"
          "for name, attempt in attempts.items():\n"
          "    try:\n        attempt()\n        found[name] = 'open'\n"
          "    except BaseException:\n        found[name] = 'refused'\n"
          "print(sorted(k for k, v in found.items() if v == 'open'))")


def test_the_interpreters_memory_and_code_are_out_of_reach(root):
    """What would read ``t`` from the step thread's C stack, or run bytecode the compiler did not
    make, is refused: ctypes, ``/proc/self/mem``, code objects built by hand or unmarshalled, the
    CPython test modules, the collector's referrer walks, other threads' frames, tracing."""
    ex = root.fork()
    try:
        r = ex.run(MEMORY)
        assert r.ok and r.stdout == "[]\n", r
    finally:
        ex.close()


def _names_looked_up(code) -> list[str]:
    import dis
    import types

    found = [i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF")]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _names_looked_up(const)
    return found


def test_the_keepers_trusted_functions_look_up_no_name_at_call_time():
    """The keeper's rule (``codetool.executor.inside.keeper``): what its trusted functions call is bound as a default
    argument when the module is executed, so rebinding a module, a builtin or a global of the
    sandbox changes nothing they do. A name looked up at call time breaks the rule."""
    from codetool.executor.inside import copy as sandbox_copy
    from codetool.executor.inside import keeper as sandbox_keeper

    functions = [getattr(sandbox_keeper, name) for name in sandbox_keeper.TRUSTED] + [sandbox_copy.reopen]
    looked_up = {f.__name__: _names_looked_up(f.__code__) for f in functions}
    assert all(not names for names in looked_up.values()), looked_up


def _without_checks(mode, monkeypatch, *, second: bool):
    """An executor whose keepers skip the check of fd 3 at a step's end (as if a process the step
    forked had changed fd 3 after it) and, with ``second``, whose host skips its second check
    (``C``, once it killed the step's processes) too: what the host's later checks see."""
    import functools
    import json

    from codetool.executor import Executor, ExecutorConfig
    from codetool.executor.host import family, step
    from codetool.executor.kernel import seccomp

    shipped = family._sandbox_sources

    def without() -> bytes:
        sources = json.loads(shipped())
        for entry in sources:
            entry[1] = entry[1].replace("if not _intact(ctl, boot):  # the code changed", "if False:  #")
        return json.dumps(sources).encode()

    monkeypatch.setattr(family, "_sandbox_sources", without)
    monkeypatch.setattr(family, "filter_program", functools.partial(seccomp.filter_program, signals=False))
    if second:
        monkeypatch.setattr(step, "confirm_channel", lambda *args: "intact", raising=False)
    return Executor(ExecutorConfig(isolation=mode, **dict(CONFIG, start_timeout_s=1.0)))


@pytest.fixture
def late(mode, monkeypatch):
    ex = _without_checks(mode, monkeypatch, second=False)
    yield ex
    ex.close()


@pytest.fixture
def unchecked(mode, monkeypatch):
    ex = _without_checks(mode, monkeypatch, second=True)
    yield ex
    ex.close()


@pytest.mark.parametrize("breakage", ["io_signal", "peek_offset", "drop_filter"])
def test_a_change_of_fd_3_after_the_keepers_check_is_still_the_steps(late, breakage):
    """A process the step forked can change fd 3 after the keeper's check at the step's end; so
    the host, once it killed the step's other processes, asks the keeper to check again (``C``,
    ``host.report.confirm_channel``), as part of the step: a change, a request hidden from the
    keeper, or its worker dying of SIGIO at that request is this step's ``sandbox_violation``.
    The next step runs once. Before: the step ``ok``, the next step ``not_executed``."""
    code = BROKEN_CHANNELS.get(breakage, IO_SIGNAL)
    r = late.run(code + ("\ns.detach()" if code.startswith(SOCKET) else ""))
    assert r.executed and r.attempts == 1 and r.outcome == "sandbox_violation" and r.state_lost, r
    r = late.run("print(globals().get('kept', 'fresh'))", timeout_s=1.0)
    assert r.ok and r.attempts == 1 and r.stdout == "fresh\n", r


def _planted(ex, breakage: str):
    code = BROKEN_CHANNELS.get(breakage, IO_SIGNAL)
    r = ex.run(code + ("\ns.detach()" if code.startswith(SOCKET) else ""))
    assert r.ok, r  # (unchecked)


@pytest.mark.parametrize("breakage", ["io_signal", "peek_offset"])
def test_the_host_charges_a_state_whose_channel_fails_the_next_request(unchecked, breakage):
    """The host's backstops of the keeper's checks (``host.report``; both taken out here, as if a
    process of the step had outrun the second): a worker that dies of SIGIO
    as the host's next request reaches it (``states_signal``: no machine sends SIGIO), and a keeper
    asleep in its receive with the request sent (``asleep_in_receive``: the kernel wakes a receiver
    a message reaches, so only the state can hide one), are the state's failure, for the next step
    and for a fork of it (and then for the state's own next step): ``sandbox_violation``, one
    attempt, found at the step's deadline at the latest. Before: ``not_executed`` (``StateLost``,
    ``HostBusy`` at the backstop, ``WorkerStart``)."""
    ex = unchecked
    _planted(ex, breakage)
    r = ex.run("print('next')", timeout_s=1.0)
    assert r.executed and r.attempts == 1 and r.outcome == "sandbox_violation" and r.state_lost, r
    assert ("SIGIO" if breakage == "io_signal" else "never received") in r.error_message, r
    assert ex.run("kept = 1").ok
    _planted(ex, breakage)
    child = ex.fork()
    try:
        r = child.run("print('forked')", timeout_s=1.0)
        assert r.executed and r.outcome == "sandbox_violation", r
    finally:
        child.close()
    r = ex.run("print(globals().get('kept', 'fresh'))", timeout_s=1.0)  # the state is gone: nothing ran
    assert r.executed and r.outcome == "sandbox_violation", r
    r = ex.run("print(globals().get('kept', 'fresh'))", timeout_s=1.0)
    assert r.ok and r.stdout == "fresh\n", r


def test_a_worker_killed_from_outside_between_steps_is_still_not_executed(unchecked):
    """A failure of the machine is never the code's: SIGKILL from outside (the host, the OOM
    killer, an operator) between steps leaves the next step ``not_executed`` (``StateLost``)."""
    import os
    import signal

    ex = unchecked
    assert ex.run("kept = 1").ok
    os.kill(ex._slot.worker.pid, signal.SIGKILL)
    r = ex.run("print('after')", timeout_s=1.0)
    assert not r.executed and r.error_type == "StateLost", r
