""".ci/run and scripts/ci_disk.sh: free disk is printed before CI starts and between its stages, a
machine with less than the README's need gets a warning, and pip's cache is off for the installs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _disk(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PIP_NO_CACHE_DIR"}
    return subprocess.run(["bash", "scripts/ci_disk.sh", *args], cwd=REPO, env={**environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_ci_disk_prints_the_repo_the_temp_dir_and_the_pip_cache(tmp_path):
    out = _disk("before x", TMPDIR=str(tmp_path), PIP_NO_CACHE_DIR="1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "ci_disk: before x"
    assert re.fullmatch(rf"ci_disk:   repo {re.escape(str(REPO))}: \S+ free of \S+ on /.*", lines[1]), lines[1]
    assert re.fullmatch(rf"ci_disk:   tmp {re.escape(str(tmp_path))}: \S+ free of \S+ on /.*", lines[2]), lines[2]
    assert lines[3] == "ci_disk:   pip cache: disabled (PIP_NO_CACHE_DIR)"
    assert out.stderr == ""


def test_ci_disk_names_the_pip_cache_dir_when_it_is_on(tmp_path):
    out = _disk("now", PIP_CACHE_DIR=str(tmp_path / "pip-cache"))
    assert out.returncode == 0, out.stderr
    assert f"ci_disk:   pip cache {tmp_path / 'pip-cache'}: 0 used; " in out.stdout


def test_ci_disk_warns_below_the_need_and_still_succeeds():
    short = _disk("--need", "100000000", "before", PIP_NO_CACHE_DIR="1")
    assert short.returncode == 0
    assert "ci_disk: warning: " in short.stderr and "needs about 100000000 GB" in short.stderr
    enough = _disk("--need", "0", "before", PIP_NO_CACHE_DIR="1")
    assert enough.returncode == 0 and enough.stderr == ""


def test_ci_run_prints_the_disk_before_it_starts_and_after_every_stage():
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    steps = [line for line in lines if line.startswith(("make ", "bash scripts/", "after "))]
    assert steps[0].startswith('bash scripts/ci_disk.sh --need "${CI_DISK_NEED_GB:-8}"'), steps[0]
    stages = steps[1:]
    assert stages[0::2] == ["bash scripts/install_system_deps.sh", "make test",
                            'make gpu-check GPU_CHECK_ARGS="--device cpu --tiny"',
                            "bash scripts/ci_extra.sh", "bash scripts/ci_vllm.sh"]  # every stage kept
    assert len(stages) == 10 and all(line.startswith('after "') for line in stages[1::2]), stages


def test_ci_run_turns_pip_s_cache_off_and_keeps_test_temp_in_its_own_dir():
    text = (REPO / ".ci" / "run").read_text()
    assert 'export PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1' in text
    assert '--basetemp=$CI_TMP/pytest' in text and 'rm -rf "$CI_TMP/pytest"' in text
