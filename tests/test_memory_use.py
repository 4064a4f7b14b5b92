"""The client's memory (issue 39): measured as proportional set size, capped by a gate."""

from __future__ import annotations

import os

import pytest

from codetool.config import ConfigError, load_config
from codetool.memory_use import MemoryGate, memory_limit_mb, tree_memory

linux = pytest.mark.skipif(not os.path.isdir("/proc"), reason="/proc is Linux's")


@linux
def test_tree_memory_counts_this_process_and_its_children():
    import subprocess
    import sys

    alone = tree_memory()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        import time

        for _ in range(100):  # until the child's interpreter is up
            with_child = tree_memory()
            if with_child.processes == alone.processes + 1 and with_child.pss_mb > alone.pss_mb:
                break
            time.sleep(0.05)
    finally:
        child.communicate(b"")
    assert alone.processes >= 1 and 0 < alone.pss_mb <= alone.rss_mb
    assert with_child.processes == alone.processes + 1 and with_child.pss_mb > alone.pss_mb


def test_the_gate_admits_while_one_more_unit_fits():
    """A unit adds 10 MiB (the measure is what the units running add to a base of 100 MiB)."""
    running = {"n": 0}
    gate = MemoryGate(45.0, measure=lambda: 100.0 + 10 * running["n"], recheck_s=0.0)
    assert gate.base_mb == 100.0
    decisions = []
    for n in range(6):
        running["n"] = n
        decisions.append(gate.admit(n))
    # 0 running: always; n running add 10n, one more 10: 10(n+1) <= 45 up to n = 3
    assert decisions == [True, True, True, True, False, False]
    assert gate.held == 2 and gate.peak_mb == 50.0


def test_the_setting():
    assert memory_limit_mb(0) is None and memory_limit_mb(300) == 300.0
    if os.path.isfile("/proc/meminfo"):
        assert memory_limit_mb(None) > 0  # half the memory available
    from codetool.jobs.queries import RunConfig
    from codetool.tree.config import TreeConfig

    for cls, base in ((RunConfig, {"benchmark": "stabletoolbench"}), (TreeConfig, {})):
        with pytest.raises(ConfigError, match="max_memory_mb must be >= 0"):
            load_config(cls, overrides={**base, "max_memory_mb": -1})


def test_trees_wait_for_the_memory_cap(shared_data):
    """With a cap that admits one tree at a time, grow never starts a second beside the first."""
    from codetool.tools.loaders import load_stabletoolbench
    from codetool.tree.build import TreeBuilder
    from codetool.tree.config import TreeConfig
    from codetool.tree.grow import grow
    from codetool.tree.search_settings import TreeSearch
    from tests.test_search_schedule import ServerLike, factory, tasks

    asked = []
    cfg = TreeConfig(branching=2, max_depth=2, search=TreeSearch(max_new_tokens=256))
    records = []
    three = tasks(load_stabletoolbench("G1_instruction", shared_data)[:3])
    grow(TreeBuilder(ServerLike(finish_at=9), cfg, factory), three, records.append, trees=3, workers=4,
         admit=lambda n: asked.append(n) or n < 1)
    assert len(records) == 3 and all(len(r["nodes"]) == 6 for r in records)
    assert asked and set(asked) == {1}  # asked beside one growing tree only, and it said no
