"""The Python API (codetool.api): every example of docs/API.md runs as written, on a tiny PRM and
policy (paths the examples name are mapped to the test's), and the 20-line httpx client of
docs/SERVING.md scores against a served PRM."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture(scope="module")
def tiny_prm(tiny_model_dir, tmp_path_factory) -> Path:
    from codetool.prm.folder import new_prm, save_prm
    from codetool.prm.format import PRMFormat

    fmt = PRMFormat(max_length=512, max_suffix_length=128)
    model, tokenizer = new_prm(str(tiny_model_dir), fmt, dtype="float32", device="cpu")
    out = tmp_path_factory.mktemp("prm") / "prm"
    save_prm(out, model, tokenizer, {"base_model": str(tiny_model_dir), "format": fmt.__dict__, "seed": 0})
    return out


def test_every_example_of_the_api_page_runs(tiny_prm, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the examples name files of the repository
    names = {'"runs/quickstart/train/prm"': repr(str(tiny_prm)), 'policy="default"': f"policy={str(tiny_model_dir)!r}",
             '"runs/library/trajectories.jsonl"': repr(str(tmp_path / "t.jsonl"))}
    blocks = python_blocks(ROOT / "docs" / "API.md")
    assert len(blocks) == 3
    for block in blocks:
        for old, new in names.items():
            block = block.replace(old, new)
        exec(compile(block, "docs/API.md", "exec"), {})
    from codetool.api import read_trajectories

    records = read_trajectories(tmp_path / "t.jsonl")
    assert len(records) == 4 and all(len(t.steps[0].candidates) == 2 for t in records if t.steps)


def test_the_readme_python_block_runs(tiny_prm, tiny_model_dir, tmp_path, monkeypatch):
    """The README's five lines, as written, with the tiny PRM and policy in place of the trained
    PRM and the embedded model (the only names mapped)."""
    monkeypatch.chdir(ROOT)
    (block,) = python_blocks(ROOT / "README.md")
    block = block.replace('"runs/quickstart/train/prm"', repr(str(tiny_prm)))
    block = block.replace("from codetool.api import PRM, load_tools, search\n", "from functools import partial\n"
                          "from codetool.api import PRM, load_tools, search\n"
                          f"search = partial(search, policy={str(tiny_model_dir)!r}, "
                          f"output={str(tmp_path / 't.jsonl')!r})\n")
    names: dict = {}
    exec(compile(block, "README.md", "exec"), names)
    assert len(names["scores"]) == 2 and all(0.0 <= score <= 1.0 for score in names["scores"])
    assert len(names["trajectories"]) == 4


def test_the_httpx_example_scores_against_a_served_prm(tiny_prm, capsys, monkeypatch):
    from codetool.api import PRM
    from codetool.prm.scorer import LocalPRMScorer
    from codetool.prm.server import create_app, serve_in_thread

    local = PRM(str(tiny_prm), device="cpu")
    assert isinstance(local.scorer, LocalPRMScorer)
    with serve_in_thread(create_app(local.scorer)) as url:
        monkeypatch.setattr(sys, "argv", ["score_steps.py", url])
        runpy.run_path(str(ROOT / "examples" / "score_steps.py"), run_name="__main__")
        remote = PRM(url).score([{"query": "q", "tools": "", "candidate": "print(1)"}])
    out = capsys.readouterr().out  # an earlier test's CLI run may have sent log lines to stdout too
    lines = [line for line in out.splitlines() if re.match(r"\d\.\d{3}  ", line)]
    assert len(lines) == 2 and all(0.0 <= float(line.split()[0]) <= 1.0 for line in lines), out
    assert remote == pytest.approx(local.score([{"query": "q", "tools": "", "candidate": "print(1)"}]), abs=1e-6)
    assert len(open(ROOT / "examples" / "score_steps.py").read().splitlines()) <= 20
