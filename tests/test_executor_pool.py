"""Executor families shared between tasks (issue 39): fewer roots, the same separation."""

from __future__ import annotations

import os

import pytest

from codetool.executor import Executor, ExecutorConfig, ExecutorError
from codetool.executor.host.family import separate_principals
from codetool.executor.host.pool import FamilyPool, StartingExecutor, started_in_background

EXEC = ExecutorConfig(isolation="fallback", timeout_s=10)
principals = pytest.mark.skipif(not separate_principals(EXEC), reason="executors are separate principals as root only")


def _children() -> set[int]:
    from codetool.memory_use import _children

    found, todo, tree = set(), [os.getpid()], _children()
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@principals
def test_executors_of_different_tasks_share_families_and_stay_apart():
    before = _children()
    pool = FamilyPool(EXEC, per_family=4)
    executors = [Executor(EXEC, tools={"echo": lambda text: text}, pool=pool) for _ in range(6)]
    try:
        assert pool.started == 2  # 6 executors, 4 per family
        uids = set()
        for i, ex in enumerate(executors):
            result = ex.run(f"import os\nopen('mine.txt', 'w').write('{i}')\nprint(os.getuid(), echo(text='hi'))")
            assert result.ok, result.error_message
            uids.add(result.stdout.split()[0])
        assert len(uids) == 6  # each its own principal
        for i, ex in enumerate(executors):  # each its own scratch: it reads its own file only
            assert ex.run("print(open('mine.txt').read())").stdout.strip() == str(i)
        fork = executors[0].fork()  # a fork counts against its family, and outlives its parent
        executors[0].close()
        assert fork.run("print(open('mine.txt').read())").stdout.strip() == "0"
        fork.close()
    finally:
        for ex in executors:
            ex.close()
    assert _children() <= before  # every family ended with its last executor


def test_without_separate_principals_each_executor_has_its_own_family():
    config = ExecutorConfig(isolation="fallback", timeout_s=10, drop_uid=False)
    pool = FamilyPool(config)
    assert pool.per_family == 1
    executors = [Executor(config, pool=pool) for _ in range(2)]
    try:
        executors[0].run("open('shared.txt', 'w').write('x')")
        assert executors[1].run("import os\nprint(os.path.exists('shared.txt'))").stdout.strip() == "False"
        assert pool.started == 2
    finally:
        for ex in executors:
            ex.close()


def test_a_background_start_reports_its_failure_at_first_use():
    def broken():
        raise ExecutorError("no sandbox here")

    starting = StartingExecutor(broken)
    with pytest.raises(ExecutorError, match="no sandbox here"):
        starting.fork()
    starting.close()  # nothing to close, no error
    make = started_in_background(lambda task: Executor(EXEC, tools=task))
    ex = make({"echo": lambda text: text})
    try:
        assert ex.run("print(echo(text='ok'))").stdout == "ok\n" and "fallback" in ex.isolation
    finally:
        ex.close()
    assert ex.closed


@principals
def test_executors_of_one_family_have_their_own_tools():
    """A new executor's worker is a fork of its family's template (a fresh interpreter that never
    runs a step): it defines its own executor's tools, also when it is forked before its first run."""
    pool = FamilyPool(EXEC, per_family=4)
    first = Executor(EXEC, tools={"alpha": lambda: "a"}, pool=pool)
    second = Executor(EXEC, tools={"beta": lambda: "b"}, pool=pool)
    try:
        assert pool.started == 1
        r = first.run("print(alpha(), 'beta' in globals())")
        assert r.ok and r.stdout == "a False\n", r
        early = second.fork()  # before its parent ran anything
        for ex in (second, early):
            r = ex.run("print(beta(), 'alpha' in globals())")
            assert r.ok and r.stdout == "b False\n", r
        early.close()
    finally:
        first.close()
        second.close()


def test_the_principal_check_runs_beside_the_caller_not_before_it(monkeypatch):
    """Whether executors are separate principals runs the sandbox interpreter (tenths of a second
    on a busy machine): making a pool (``codetool run``'s start) does not wait for it, the first
    ``take`` does (issue 39). Before, the pool's constructor ran it on the caller's thread."""
    import threading

    import codetool.executor.host.pool as pool_module

    release, callers, caller = threading.Event(), [], threading.current_thread()

    def held_check(config):
        callers.append(threading.current_thread())
        if threading.current_thread() is not caller:  # (the old code ran it here: no wait, the test fails)
            release.wait(60)
        return False

    monkeypatch.setattr(pool_module, "separate_principals", held_check)
    pool = FamilyPool(EXEC, per_family=4)  # returns while the check is held
    release.set()
    assert threading.current_thread() not in callers
    assert pool.per_family == 1  # the check's answer, once it is in
    assert len(callers) == 1


def test_a_failed_principal_check_is_raised_where_a_family_is_needed(monkeypatch):
    import codetool.executor.host.pool as pool_module

    def broken(config):
        raise ExecutorError("executor python '/nope' does not run")

    monkeypatch.setattr(pool_module, "separate_principals", broken)
    pool = FamilyPool(EXEC)
    with pytest.raises(ExecutorError, match="does not run"):
        pool.take()
