"""codetool.resume.OutputLock: one writer per output, and no lock file left behind."""

from __future__ import annotations

import os

import pytest

from codetool import CodetoolError, resume
from codetool.resume import OutputLock


def test_the_lock_file_is_removed_when_the_run_ends_even_on_an_error(tmp_path):
    out = tmp_path / "runs" / "t.jsonl"
    with OutputLock(out):
        assert (tmp_path / "runs" / "t.jsonl.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(CodetoolError, match="another run is writing"):
            OutputLock(out).__enter__()
    assert not (tmp_path / "runs" / "t.jsonl.lock").exists()
    with pytest.raises(RuntimeError), OutputLock(out):
        raise RuntimeError("the run failed")
    assert list((tmp_path / "runs").iterdir()) == []
    with OutputLock(out):  # taken again after that
        pass


def test_a_lock_on_a_file_a_finished_run_removed_does_not_count(tmp_path, monkeypatch):
    out = tmp_path / "t.jsonl"
    first = OutputLock(out).__enter__()
    stale = os.open(str(out) + ".lock", os.O_RDWR)  # a run that opened the file just before it went
    first.__exit__(None, None, None)
    third = OutputLock(out).__enter__()  # a new lock file, held
    opened = []
    real_open = os.open

    def open_stale_first(path, *args):
        opened.append(path)
        return stale if len(opened) == 1 else real_open(path, *args)

    monkeypatch.setattr(resume.os, "open", open_stale_first)
    # the stale file's flock is free, but it is not the lock file any more: the second run tries
    # the file that is there and finds it held
    with pytest.raises(CodetoolError, match="another run is writing"):
        OutputLock(out).__enter__()
    assert len(opened) == 2
    third.__exit__(None, None, None)
    assert not os.path.exists(str(out) + ".lock")


def test_a_held_lock_says_to_pass_another_output_and_names_both_files(tmp_path):
    """``run`` and ``build-trees`` have ``--output``: their advice names it (pipeline rewords it)."""
    out = tmp_path / "t.jsonl"
    with OutputLock(out), pytest.raises(resume.OutputBusy) as info:
        OutputLock(out).__enter__()
    assert (info.value.output, info.value.lock) == (out, tmp_path / "t.jsonl.lock")
    assert str(info.value) == (f"another run is writing {out} (it holds {out}.lock); wait for it to finish, or pass "
                               "a different --output.")
