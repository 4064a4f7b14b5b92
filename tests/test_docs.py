"""The docs cannot rot (issue 40): every `codetool <command> --flag` that README.md, CONTRIBUTING.md
or a docs/*.md page names exists in the CLI, every relative link points at a file, and the README
stays short. Commands are read from fenced shell blocks and from inline `codetool ...` code spans;
each is parsed with the command's own argparse parser."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 20_000  # bytes; the aim is ~16 KB (TRL 8.8 KB, smolagents 14 KB)
_BLOCK = re.compile(r"```(?:bash|sh|shell|console)?\n(.*?)```", re.S)
_SPAN = re.compile(r"`(codetool [^`]+)`")
_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1", ")"}


def commands_of(text: str) -> list[str]:
    """The `codetool ...` command lines of a Markdown page (continuations joined, comments cut)."""
    found = []
    for block in _BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            match = re.search(r"(?:^|\s|/)(?:codetool|-m codetool\.cli) ([a-z][a-z-]*)((?:\s.*)?)$", line)
            if match:
                found.append(f"codetool {match.group(1)}{match.group(2)}")
    found += [span for span in _SPAN.findall(text)  # placeholders (`codetool CMD --help`) are not commands
              if "..." not in span and "<" not in span and re.match(r"codetool [a-z][a-z-]*(\s|$)", span)]
    return found


@functools.cache
def parser_of(name: str):
    from codetool import cli

    config_cls, _ = cli._load(name)
    sections = tuple(f"--{n}." for n, f, _ in cli._flat_fields(config_cls) if "section" in f.metadata)
    return cli._command_parser(name, config_cls), sections


def flags_of(command: str) -> tuple[str, list[str]]:
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: read the words plainly
        words = command.split()
    name, flags = words[1], []
    for word in words[2:]:
        if word in _OPERATORS or word.startswith((">", "2>")):
            break
        if word.startswith("--"):
            flags.append(word.split("=", 1)[0])
    return name, flags


def _cases():
    for page in PAGES:
        for command in commands_of(page.read_text(encoding="utf-8")):
            yield pytest.param(page.name, command, id=f"{page.name}: {command[:60]}")


@pytest.mark.parametrize("page, command", list(_cases()))
def test_every_command_and_flag_the_docs_name_exists(page, command):
    from codetool.cli import COMMANDS

    name, flags = flags_of(command)
    assert name in COMMANDS, f"{page}: `{command}` names no command (commands: {', '.join(COMMANDS)})"
    parser, sections = parser_of(name)
    unknown = [f for f in flags if f not in parser._option_string_actions and not f.startswith(sections)
               and f not in ("--help", "-h") and not (f == "--help-all" and _has_help_all(name))
               and not (page == "MIGRATING.md" and _refused_as_renamed(name, f))]
    assert not unknown, f"{page}: `{command}`: {unknown} are no options of `codetool {name}`"


def _has_help_all(name: str) -> bool:
    from codetool import cli

    return "--help-all" in cli._help_parser(name)._option_string_actions


def _refused_as_renamed(name: str, flag: str) -> bool:
    """MIGRATING.md names 0.1's flags on purpose: each must be one the CLI refuses naming its successor."""
    from codetool import cli
    from codetool.config import renamed_error

    return renamed_error(cli._load(name)[0], flag.lstrip("-"), flag=True) is not None


def test_the_readme_is_short_and_every_relative_link_resolves():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= README_LIMIT, f"README.md is {len(readme)} bytes; move detail to docs/ (limit {README_LIMIT})"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


_REPO_PATH = re.compile(r"(?<![\w./-])((?:configs|scripts|examples|benchmarks|tests)/[\w./-]*\w)([*<]?)")


def test_every_repository_file_the_pages_name_exists():
    """A recipe, script or example a page names (`bash scripts/paper/3_trees.sh`, `--config
    configs/train/quickstart.yaml`) is a file of the repository; a prefix followed by a pattern
    (`tests/test_<area>`, `tests/test_executor_*`) names no file."""
    missing = [f"{page.name}: {path}" for page in PAGES
               for path, pattern in _REPO_PATH.findall(page.read_text(encoding="utf-8"))
               if not pattern and not (ROOT / path).exists()]
    assert not missing, f"pages name files the repository does not hold: {missing}"


def test_the_command_reader_finds_blocks_spans_and_continuations():
    text = ("```bash\ncodetool run --query x \\\n    --tools a.json  # one query\n.venv/bin/codetool eval f.jsonl "
            "| tee log\n```\nInline: `codetool serve-prm --port 8600` and `codetool <command> --help`.")
    assert commands_of(text) == ["codetool run --query x      --tools a.json", "codetool eval f.jsonl | tee log",
                                 "codetool serve-prm --port 8600"]
    assert commands_of("```\ncodetool train-prm: error: --epochs was renamed\n```") == []  # an error line, no command
    assert flags_of("codetool run --query x --tools=a.json | grep --color x") == ("run", ["--query", "--tools"])
