"""The mechanics of config groups (issue 29): dataclasses of settings that several commands compose.

A group (``PolicyGroup``, ``ToolsGroup``, ``OutputGroup``, ...) is declared once, beside the code
that reads it, with its ``option(...)`` help texts and its ``__post_init__`` checks; a command's
config composes groups by inheritance, so their keys stay flat and the flags, recipe keys and
config hashes keep their names. This module holds the base (:class:`Group`), per-command defaults
(:func:`with_defaults`), the hand-over of one config's group to another (:func:`group_values`) and
a config's settings as dotted keys (:func:`flat_settings`, what the pipeline's stage texts list).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from codetool.config import _exposed, _hints, unread_keys

T = TypeVar("T")


class Group:
    """The base of a config group: a dataclass of settings that several commands compose by
    inheritance (``class RunConfig(PolicyBackendGroup, ToolsGroup, ...)``), so its fields, help texts
    and checks are declared once and its keys stay flat (the recipes, flags and config hashes keep
    their names). A group's ``__post_init__`` calls ``super().__post_init__()`` first, so every group
    of a config checks its own fields; this one ends the chain."""

    def __post_init__(self) -> None:
        pass


def with_defaults(**defaults: Any) -> Callable[[type[T]], type[T]]:
    """A class decorator: the config group that the decorated class extends, with other defaults
    for some of its fields (``build-trees`` uses the simulator where ``run`` picks by benchmark); the
    fields keep the group's type, help text and choices, declared once. A class statement, so that
    the type checker sees the group's fields::

        @with_defaults(tools_backend="simulator")
        class TreeTools(ToolBackendGroup):
            \"\"\"The tools group of build-trees: the simulator unless told otherwise.\"\"\"

    Args:
        defaults: field name -> its default in the decorated class (a list or a dict is copied
            per instance).
    Raises:
        TypeError: a name that is not a field of the class's groups.
    """
    def make(cls: type[T]) -> type[T]:
        fields = {f.name: f for base in reversed(cls.__mro__) if dataclasses.is_dataclass(base)  # every group's,
                  for f in dataclasses.fields(base)}  # not only the first base's (a class of several groups)
        unknown = sorted(set(defaults) - set(fields))
        if unknown:
            raise TypeError(f"with_defaults: {cls.__name__} has no field {', '.join(unknown)}; "
                            f"its fields are {', '.join(fields)}.")
        hints = _hints(cls)  # resolved where each field was declared
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in defaults.items():
            annotations[name] = hints[name]
            if isinstance(value, (list, dict)):
                setattr(cls, name, dataclasses.field(default_factory=functools.partial(type(value), value),
                                                     metadata=fields[name].metadata))
            else:
                setattr(cls, name, dataclasses.field(default=value, metadata=fields[name].metadata))
        cls.__annotations__ = annotations
        return dataclasses.dataclass(cls)

    return make


def group_values(cfg: Any, group: type) -> dict[str, Any]:
    """The values of ``cfg`` for the fields of the config group ``group`` (``{"policy": ...}``), to
    hand one config's group to another config that composes it too."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(group)}


def flat_settings(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """The settings of the config ``cfg`` as ``{dotted key: value}``: nested groups flattened
    (``search.k``), a list of groups as a list of mappings, without the keys its classes refuse as
    unread (:func:`codetool.config.unread_keys`: a config built in code may hold them; nothing reads them)."""
    unread = unread_keys(type(cfg)) if not prefix else set()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if not _exposed(f):
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flat_settings(value, f"{key}."))
        elif isinstance(value, (list, tuple)):
            out[key] = [_plain(v) for v in value]
        else:
            out[key] = value
    return {k: v for k, v in out.items() if k not in unread}


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
