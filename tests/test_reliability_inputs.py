"""Malformed files given to every command (issue 39): each file a command reads (recipes, queries,
trajectories, free queries, datasets, specs, caches) in every broken shape we could think of gets
a one-line error that names the file and a non-zero exit, never a traceback, and never exit 0
with nothing written. Planted symbolic links are refused where a command writes."""

from __future__ import annotations

import json
import os

import pytest

from codetool.cli import main

API = {"category_name": "Data", "tool_name": "weather", "api_name": "forecast", "api_description": "forecast",
       "required_parameters": [], "optional_parameters": [], "method": "GET"}

# name -> content: one broken shape each (a directory, "dir", and a missing path, "missing", too)
SHAPES = {
    "latin1.json": "caf\xe9 [1, 2]".encode("latin-1"),  # not UTF-8
    "binary.json": bytes(range(256)) * 4,
    "empty.json": b"",
    "blank.json": b"  \n\n ",
    "torn.json": b'[{"query_id": 1, "query": "q", "api_li',
    "number.json": b"42",
    "string.json": b'"just text"',
    "object.json": b'{"a": {"b": 1}}',
    "ints.json": b"[1, 2, 3]",
    "rows.jsonl": b'{"x": 1}\n{"y": 2}\n',
    "nulls.jsonl": b"null\nnull\n",
    "deep.json": b"[" * 50_000 + b"]" * 50_000,
}
RECIPES = {
    "latin1.yaml": "search: {k: 2}\nname: caf\xe9\n".encode("latin-1"),
    "binary.yaml": bytes(range(256)) * 4,
    "list.yaml": b"- a\n- b\n",
    "text.yaml": b"just some text\n",
    "unclosed.yaml": b"search: {k: 2\n",
    "tabs.yaml": b"search:\n\tk: 2\n",
    "deep.yaml": b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n",
}
BROKEN = sorted(SHAPES) + ["dir", "missing"]
BROKEN_RECIPES = sorted(RECIPES) + ["dir", "missing"]
# The default suite runs these shapes for every command (the rest of the product is slow-marked:
# each shape a different failure of the same readers).
QUICK = {"latin1.json", "empty.json", "torn.json", "deep.json", "dir", "latin1.yaml", "unclosed.yaml", "deep.yaml",
         "list.yaml"}
QUICK_CONFIGS = {"run", "build-trees", "pipeline", "serve-mock"}


def _label(command: str) -> str:
    words = command.split()
    at = next(i for i, w in enumerate(words) if "{f}" in w)
    return words[0] + (words[at - 1] if at > 1 and words[at - 1].startswith("--") else "")


def _grid(commands, shapes, quick_commands=None):
    return [pytest.param(c, shape, id=f"{_label(c) if '{f}' in c else c}-{shape}",
                         marks=() if shape in QUICK and (quick_commands is None or c in quick_commands)
                         else pytest.mark.slow)
            for c in commands for shape in shapes]

# (command line with {f} where the broken file goes, shapes that do not apply)
COMMANDS = [
    ("build-trees --queries {f} --output {t}/out/trees.jsonl --dataset_dir {t}/out/prm", ()),
    ("eval {f} --out {t}/rep --judge.model none", ()),
    ("score {f} --prm {t}/dir", ()),
    ("train-prm --dataset {f} --output_dir {t}/out", ()),
    ("eval-prm --dataset {f} --prm {t}/dir --output_dir {t}/out", ()),
    ("train-probe --free_queries {f} --n_tool 2 --n_free 2 --output {t}/out/probe", ()),
    ("eval-decision --free_queries {f} --n_tool 2 --n_free 2 --output {t}/out/dec", ()),
    ("serve-mock tmdb --spec {f} --port 1", ()),
    ("serve-mock stabletoolbench --queries {f} --port 1", ()),
    ("serve-mock stabletoolbench --cache_dir {f} --port 1", ("dir",)),
    ("eval {t}/traj.jsonl --out {t}/rep --judge.model none --reference {f}", ()),
]
CONFIGS = ["run", "build-trees", "eval", "score", "train-prm", "eval-prm", "train-probe", "eval-decision", "pipeline",
           "serve-prm", "serve-mock", "data"]


@pytest.fixture
def broken(tmp_path):
    for name, content in {**SHAPES, **RECIPES}.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "dir").mkdir()
    (tmp_path / "traj.jsonl").write_text(json.dumps({"query_id": "1", "query": "q", "benchmark": "toolbench",
                                                     "steps": [], "final_answer": "a", "finish_type": "finish"}) + "\n")
    return tmp_path


def _run(argv: str, tmp, capsys, monkeypatch) -> tuple[int, str]:
    import codetool.models.loading as loading
    import codetool.prm.folder as folder
    import codetool.serving as serving

    def accepted(*args, **kwargs):
        pytest.fail("the input was accepted: the command went on to load a model or serve")

    monkeypatch.chdir(tmp)
    for module, name in ((serving, "serve_forever"), (loading, "load_model"), (folder, "load_model")):
        monkeypatch.setattr(module, name, accepted)
    status = main(argv.split())
    return status, capsys.readouterr().err.strip()


def _check(status: int, err: str, path: str, tmp) -> None:
    assert "Traceback" not in err, err[-3000:]
    assert status not in (0, None), f"exit 0 on a broken file; stderr: {err[-1000:]}"
    last = err.splitlines()[-1] if err else ""
    assert last.startswith("codetool ") and ": error: " in last, err[-2000:]
    assert os.path.basename(path) in last, f"the error does not name the file: {last}"
    written = [p for p in (tmp / "out").rglob("*") if p.is_file()] if (tmp / "out").exists() else []
    assert not [p for p in written if p.stat().st_size and p.suffix != ".lock"] or status != 0


SKIP = {c: skip for c, skip in COMMANDS}
NEEDS_DATA = {"train-probe", "eval-decision"}  # their tool queries come from the benchmark data


@pytest.mark.parametrize("command, shape", _grid([c for c, _ in COMMANDS], BROKEN))
def test_a_broken_input_file_is_one_line_naming_it(broken, capsys, monkeypatch, request, command, shape):
    if shape in SKIP[command]:
        pytest.skip("a folder is what this option takes")
    if command.split()[0] in NEEDS_DATA:
        request.getfixturevalue("shared_data")  # skips where a clone has no benchmark data
    path = str(broken / shape)
    status, err = _run(command.format(f=path, t=broken), broken, capsys, monkeypatch)
    _check(status, err, path, broken)


@pytest.mark.parametrize("command, shape", _grid(CONFIGS, BROKEN_RECIPES, QUICK_CONFIGS))
def test_a_broken_recipe_is_one_line_naming_it(broken, capsys, monkeypatch, command, shape):
    path = str(broken / shape)
    argv = f"{command} tmdb --config {path}" if command == "serve-mock" else f"{command} --config {path}"
    status, err = _run(argv, broken, capsys, monkeypatch)
    _check(status, err, path, broken)


# ------------------------------------------------------------------------------- planted links
QUERIES = [{"query_id": 1, "query": "weather?", "api_list": [API]}]


@pytest.mark.parametrize("planted", ["trees.jsonl.lock", "trees.jsonl"])
def test_a_link_planted_where_build_trees_writes_is_refused(broken, capsys, monkeypatch, planted):
    """Issue 39: ``<output>.lock`` was opened without ``O_NOFOLLOW`` (a link planted there had its
    target truncated); the output itself is appended to without following a link either."""
    victim = broken / "victim.txt"
    victim.write_text("precious")
    (broken / "q.json").write_text(json.dumps(QUERIES))
    (broken / "out").mkdir()
    (broken / "out" / planted).symlink_to(victim)
    status, err = _run(f"build-trees --queries {broken}/q.json --output {broken}/out/trees.jsonl", broken, capsys,
                       monkeypatch)
    assert status == 2 and "symbolic link" in err.splitlines()[-1] and planted in err.splitlines()[-1], err
    assert victim.read_text() == "precious"


def test_write_jsonl_replaces_a_planted_temporary_link_and_refuses_a_linked_output(tmp_path):
    from codetool import CodetoolError
    from codetool.jsonl import append_jsonl, write_jsonl

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out.jsonl.tmp").symlink_to(victim)
    write_jsonl(tmp_path / "out.jsonl", [{"a": 1}])
    assert victim.read_text() == "precious" and (tmp_path / "out.jsonl").read_text() == '{"a": 1}\n'
    (tmp_path / "linked.jsonl").symlink_to(victim)
    for write in (lambda: write_jsonl(tmp_path / "linked.jsonl", [{"a": 1}]),
                  lambda: append_jsonl(tmp_path / "linked.jsonl", {"a": 1})):
        with pytest.raises(CodetoolError, match="symbolic link"):
            write()
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("where", ["source", "target"])
def test_data_fetch_from_dir_copies_through_no_planted_link(tmp_path, capsys, monkeypatch, where):
    """``data fetch --from-dir`` followed a link in the folder it copies from (copying whatever it
    names) and one planted where it writes (overwriting whatever that names)."""
    from codetool.tools.data import DATASETS

    secret, source, out = tmp_path / "secret.txt", tmp_path / "src", tmp_path / "data"
    secret.write_text("precious")
    for rel in DATASETS["restbench"]:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("{}")
    rel = DATASETS["restbench"][1]
    if where == "source":
        (source / rel).unlink()
        (source / rel).symlink_to(secret)
    else:
        (out / rel).parent.mkdir(parents=True)
        (out / rel).symlink_to(secret)
    monkeypatch.chdir(tmp_path)
    status = main(["data", "fetch", "restbench", "--from-dir", str(source), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "symbolic link" in err.splitlines()[-1], err
    assert secret.read_text() == "precious"
    copied = out / rel
    assert not copied.exists() or copied.is_symlink() or copied.read_text() != "precious"
