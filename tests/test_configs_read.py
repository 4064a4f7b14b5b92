"""Every setting is read (issue 29: "a key that no code reads is refused"): each field of every
command's config tree, ours, not TRL's or transformers', is read somewhere in the package outside
the line that declares it, as an attribute (``cfg.k``), a ``getattr`` name or a key string. A field
that nothing reads is a setting a user can give to no effect; delete it or read it. (A key that is
not a field is refused by ``codetool.config.from_dict``: ``tests/test_configs_unread.py``.)
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

import codetool
from codetool.cli import COMMANDS
from codetool.config import _exposed, _hints, _unwrap_optional

PACKAGE = Path(codetool.__file__).parent
OURS = "codetool."


def _reads() -> set[str]:
    """Every attribute name read (``x.name``, not a store) and every string constant in the package,
    except the strings of ``option(...)`` help texts and docstrings, which name settings without
    reading them."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "option":
                skip.update(id(a) for a in node.args[1:]) if len(node.args) > 1 else None
                skip.update(id(k.value) for k in node.keywords if k.arg == "help")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                names.add(node.value)
    return names


def _config_classes() -> set[type]:
    """The config dataclasses of every command, and the groups nested in them, recursively."""
    seen: set[type] = set()
    todo = []
    for module, name, _, _ in COMMANDS.values():
        todo.append(getattr(importlib.import_module(module), name))
    while todo:
        cls = todo.pop()
        if cls in seen or not dataclasses.is_dataclass(cls):
            continue
        seen.add(cls)
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            tp, _ = _unwrap_optional(hints.get(f.name, f.type))
            for arg in (tp, *typing.get_args(tp)):
                if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                    todo.append(arg)
            section = f.metadata.get("section")
            if isinstance(section, str):
                module, _, attr = section.partition(":")
                todo.append(getattr(importlib.import_module(module), attr))
    return seen


# Fields read by what they are, not by name: the subcommand word of `codetool data fetch` (its
# choices are its check; one action today).
READ_BY_PARSING = {"codetool.commands.data.DataConfig.action"}


def _our_fields(cls: type) -> list[str]:
    """The fields ``cls`` or one of our bases declares, not a library base's (TRL's and
    transformers' settings, and our other defaults for them, are read by the library)."""
    def declared(base: type) -> set[str]:
        return set(vars(base).get("__annotations__", {}))

    ours = {name for base in cls.__mro__ if base.__module__.startswith(OURS) for name in declared(base)}
    theirs = {name for base in cls.__mro__ if not base.__module__.startswith(OURS) for name in declared(base)}
    return [f.name for f in dataclasses.fields(cls) if _exposed(f) and f.name in ours - theirs]


def test_every_setting_of_every_command_is_read_somewhere():
    reads = _reads()
    unread = sorted({f"{cls.__module__}.{cls.__qualname__}.{name}" for cls in _config_classes()
                     for name in _our_fields(cls) if name not in reads} - READ_BY_PARSING)
    assert not unread, f"settings that no code reads: {unread}"


def test_the_walk_reaches_every_command_and_its_groups():
    from codetool.models.lora import LoRAGroup
    from codetool.prm.format import PRMFormat
    from codetool.search.config import SearchConfig

    walked = _config_classes()
    assert {SearchConfig, PRMFormat}.issubset(walked)  # nested groups and the pipeline's train section
    assert any(issubclass(cls, LoRAGroup) for cls in walked) and len(walked) > 20
