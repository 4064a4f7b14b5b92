"""The command-line side of configs (:mod:`codetool.config`): one ``--option`` per field of a config
dataclass (:func:`add_arguments`, nested fields dotted), and the parsed arguments back into a config
(:func:`config_from_args`). Options default to ``argparse.SUPPRESS``: only what the user typed
overrides the recipe, and :func:`codetool.config.load_config` converts the text (with its errors).

A list of values takes ``A,B`` and, when the command has no positional argument that the words
would swallow, ``A B`` too (``--stages search eval``); a list of settings takes YAML text
(``--evals '[{benchmark: restbench-tmdb, limit: 4}]'``). Help shows defaults as a user types them.
A help text that says its default in words (``default: ...``) gets no second ``[default: ...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, TypeVar

import yaml

from codetool.config import _MISSING, _flat_fields, _unwrap_optional, load_config, unread_keys

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config`` and one option per (flattened) field of ``cls`` to ``parser``.

    Options default to ``argparse.SUPPRESS`` so that only what the user typed overrides the
    recipe; types are converted later by :func:`load_config`, which gives better errors. A
    :func:`~codetool.config.section` gets one ``--<name>.KEY`` help line.
    """
    parser.add_argument("--config", metavar="YAML", default=None,
                        help="YAML recipe; command-line options override its values")
    hidden = unread_keys(cls)  # still parsed, so that from_dict names where such a key belongs
    fields = _flat_fields(cls)  # list options take several words unless a positional would be swallowed
    several = not any(f.metadata.get("positional") for _, f, _ in fields)
    for name, f, tp in fields:
        help_text = " ".join(str(f.metadata.get("help", "")).split()).replace("%", "%%")
        if "section" in f.metadata:
            parser.add_argument(f"--{name}.KEY", dest=f"{name}.KEY", default=argparse.SUPPRESS, metavar="VALUE",
                                help=f"{help_text}, e.g. --{name}.seed 1")
            continue
        default = f.default if f.default is not _MISSING else (
            f.default_factory() if f.default_factory is not _MISSING else None)
        choices = f.metadata.get("choices")
        extra = f" (choices: {', '.join(map(str, choices))})" if choices else ""
        own = "default:" in help_text  # the help says it in words (serve-mock --queries: one default)
        shown = f"{help_text}{extra}{'' if own else f' [default: {_default_text(default)}]'}"
        shown = shown.replace("%", "%%").replace("%%%%", "%%")
        if name in hidden:
            shown = argparse.SUPPRESS
        if f.metadata.get("positional"):
            base, _ = _unwrap_optional(tp)
            is_list = typing.get_origin(base) is list
            parser.add_argument(name, nargs="*" if is_list else "?", default=argparse.SUPPRESS,
                                metavar=name.upper(), help=shown)
            continue
        _add_option(parser, name, [f"--{name}", *f.metadata.get("aliases", ())], tp, shown, several)
    for name in sorted(hidden - {n for n, _, _ in fields}):  # a key its group lacks: parsed, so that from_dict
        _add_option(parser, name, [f"--{name}"], bool, argparse.SUPPRESS)  # refuses it by name (bool: value optional)


def _default_text(d: Any) -> str:
    """A default as a user writes it: a list of scalars ``a b c``, settings as YAML flow text."""
    if isinstance(d, list) and d and all(dataclasses.is_dataclass(x) for x in d):
        return yaml.safe_dump([dataclasses.asdict(x) for x in d], default_flow_style=True, width=10**6).strip()
    scalars = isinstance(d, (list, tuple)) and all(isinstance(x, (str, int, float)) for x in d)
    return (" ".join(map(str, d)) or "none") if scalars else repr(d)


def _add_option(parser: argparse.ArgumentParser, dest: str, flags: list[str], tp: Any, shown: str,
                several: bool = True) -> None:
    """``--flag VALUE`` (a bool: ``--flag`` alone; a list: ``--flag A,B``, with ``several`` also ``--flag A B``)
    for ``dest``, also with dashes; flags the parser has (the CLI's ``--debug``) are left out."""
    if "_" in flags[0]:
        flags.insert(1, flags[0].replace("_", "-"))
    flags = [flag for flag in dict.fromkeys(flags) if flag not in parser._option_string_actions]
    if not flags:  # still a YAML key
        return
    base, _ = _unwrap_optional(tp)
    item = (typing.get_args(base) or (None,))[0] if typing.get_origin(base) in (list, tuple) else None
    if base is bool:
        # --flag alone means true; --flag false still works.
        parser.add_argument(*flags, dest=dest, nargs="?", const="true", default=argparse.SUPPRESS,
                            metavar="BOOL", help=shown)
    elif item in (str, int, float):  # a list of values: --stages search eval, or search,eval
        parser.add_argument(*flags, dest=dest, nargs="+" if several else None, default=argparse.SUPPRESS,
                            metavar="VALUE", help=f"{shown} (several: {'space- or ' if several else ''}comma-separated)")
    else:
        parser.add_argument(*flags, dest=dest, default=argparse.SUPPRESS, metavar="VALUE", help=shown)


def config_from_args(cls: type[T], args: argparse.Namespace, sections: dict[str, str] | None = None) -> T:
    """Build the config of ``cls`` from parsed arguments (see :func:`add_arguments`) and
    ``sections``, the ``{"train.seed": "1"}`` options of its :func:`section` fields."""
    values = dict(vars(args))
    path = values.pop("config", None)
    names = {name for name, _, _ in _flat_fields(cls)} | unread_keys(cls)
    overrides = {k: v for k, v in values.items() if k in names or k.endswith(".KEY")}
    positional = {name for name, f, _ in _flat_fields(cls) if f.metadata.get("positional")}
    for k, v in overrides.items():  # the words of a list option (--stages search eval) as its text form
        if k not in positional and isinstance(v, list) and all(isinstance(w, str) for w in v):
            overrides[k] = ",".join(v)
    return load_config(cls, path, {**overrides, **(sections or {})})
