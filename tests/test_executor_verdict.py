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


# A step that breaks the worker's control socket so that its keeper dies after it: before, the step
# read ``ok`` and the next step (or fork) ``not_executed`` (``StateLost``): a way out of any episode.
BROKEN_CHANNELS = {
    "non_blocking": ("import os\nos.set_blocking(3, False)", "ok"),
    "non_blocking_failing": ("import os\nos.set_blocking(3, False)\nundefined_name", "runtime_error"),
    "receive_timeout": ("import socket, struct\ns = socket.socket(fileno=3)\n"
                        "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack('ll', 0, 1000))\n"
                        "s.detach()", "ok"),
    "shut_for_reading": ("import socket\ns = socket.socket(fileno=3)\ns.shutdown(socket.SHUT_RD)\ns.detach()",
                         "sandbox_violation"),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_CHANNELS))
def test_a_step_that_breaks_its_control_channel_answers_for_it(root, breakage):
    """The keeper repairs what it can after the step (blocking mode, timeouts): the state lives on;
    what it cannot (a socket shut down for reading) it reports at once, so this step is the code's
    ``sandbox_violation``. Either way the next step and a fork run, once."""
    code, outcome = BROKEN_CHANNELS[breakage]
    ex = root.fork()
    try:
        r = ex.run(code)
        assert r.executed and r.outcome == outcome and r.state_lost == (outcome == "sandbox_violation"), r
        kept = outcome != "sandbox_violation"
        child = ex.fork()
        try:
            r = child.run("print(kept)")
            assert r.executed and r.attempts == 1 and r.ok == kept, r
        finally:
            child.close()
        r = ex.run("print(kept)")
        assert r.executed and r.attempts == 1 and r.ok == kept, r
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
