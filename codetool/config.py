"""Configs: dataclasses, YAML recipes in ``configs/``, ``--key value`` overrides on the command line.

Every command has one config dataclass. Its fields carry their help text in
``metadata={"help": ...}`` (declare them with :func:`option`), nested dataclasses group related
settings, and ``__post_init__`` validates values and raises :class:`ConfigError` with the fix.
Values are resolved in this order, later wins: dataclass defaults, the YAML file given with
``--config``, then ``--key value`` overrides (nested keys with dots: ``--search.k 4``).

An unknown key, in YAML or on the command line, is an error that names the key and the closest
valid one; so is a key of a nested group that the config's code never reads (a config declares
those in ``config_unread``, see :class:`Unread`), and a key renamed in 0.2.0 (a config lists them
in ``config_renamed``, old name -> new name, only to name the new one: :func:`renamed_error`), and
a value renamed in 0.2.0 (``option(renamed={old: new})``: ``advantage: process``).
Nothing here touches the network, prompts or exits. The command-line side (one ``--option`` per
field, parsed back into a config) is :mod:`codetool.config_args`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from codetool import CodetoolError

T = TypeVar("T")
_MISSING = dataclasses.MISSING
RENAMED_IN = "0.2.0"  # the release whose renamed keys config_renamed lists (docs/MIGRATING.md)


class ConfigError(CodetoolError, ValueError):
    """A config value or key is wrong; the message names it and says how to fix it."""


def option(default: Any = _MISSING, help: str = "", *, default_factory: Any = _MISSING,
           choices: typing.Sequence[Any] | None = None, positional: bool = False,
           aliases: typing.Sequence[str] = (), renamed: dict[str, str] | None = None) -> Any:
    """A dataclass field with CLI metadata.

    Args:
        default: the default value (use ``default_factory`` for lists and dicts).
        help (`str`): one line shown by ``codetool <cmd> --help``.
        choices (`Sequence`, *optional*): allowed values; checked on load.
        positional (`bool`, *optional*, defaults to `False`): a positional CLI argument.
        aliases (`Sequence[str]`, *optional*): extra CLI flags, e.g. ``("--from",)``.
        renamed (`dict[str, str]`, *optional*): values renamed in 0.2.0, old -> new: refused naming the new.
    """
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "positional": positional,
                "aliases": tuple(aliases), "renamed": dict(renamed or {})}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(target: str, help: str = "") -> Any:
    """A field holding another command's config, ``target`` (``"module:Class"``), imported only when a
    config is built (``train: PRMConfig = section("codetool.prm.config:PRMConfig", help)`` keeps TRL's
    import out of ``pipeline --help``); the CLI passes it any ``--train.KEY VALUE``."""
    return dataclasses.field(default_factory=lambda: section_class(target)(), metadata={"help": help, "section": target})


def section_class(target: str) -> type:
    """The config class a :func:`section` field names (``"module:Class"``), imported now."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class Unread:
    """Keys of a nested group that a config's type accepts but its code never reads.

    A config dataclass lists them per field in a class attribute, ``config_unread = {"search":
    Unread(...)}``; :func:`from_dict` then refuses such a key with a one-line error that says who
    ignores it, what it reads instead and where the key belongs, and ``--help`` leaves its flag out.

    Args:
        reader (`str`): who ignores the keys, e.g. ``"build-trees"``.
        reads (`tuple[str, ...]`): the keys of the group it does read (shown in the error).
        homes (`dict[str, str]`): each refused key -> where it belongs; ``{group}`` in the text is
            replaced by the dotted path of the config (``trees.`` under a pipeline, empty alone).
    """

    reader: str
    reads: tuple[str, ...]
    homes: dict[str, str]

    def error(self, path: str, key: str, group: str) -> ConfigError:
        """The error for ``key`` given at ``path`` (``trees.search.w_latent``); ``group`` is the
        dotted prefix of the config that declared it (``trees.``)."""
        return ConfigError(f"{path} is not read by {self.reader}; it reads {group}{path.split('.')[-2]}: "
                           f"{', '.join(self.reads)}. {self.homes[key].format(group=group)}")


def _hints(cls: type) -> dict[str, Any]:
    # A section's annotation names a class that is not imported yet (see section): it reads as Any.
    later = {f.type: Any for f in dataclasses.fields(cls) if "section" in f.metadata and isinstance(f.type, str)}
    return typing.get_type_hints(cls, localns=later or None)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
        return tp, type(None) in typing.get_args(tp)
    return tp, False


def did_you_mean(key: str, valid: typing.Iterable[str], *, spell: str = "{}") -> str:
    """`` Did you mean 'a'?`` (or ``'a' or 'b'``: up to three, closest first, each within 0.15 of the
    closest's similarity) for a mistyped ``key`` among ``valid``, each written with ``spell``
    (``"--{}"`` for flags); ``""`` when none is close: ``--querys`` shows ``--query`` and ``--queries``."""
    close = difflib.get_close_matches(key, list(dict.fromkeys(valid)), n=3, cutoff=0.5)
    ratio = [difflib.SequenceMatcher(None, key, m).ratio() for m in close]
    names = [f"'{spell.format(m)}'" for m, r in zip(close, ratio) if r >= ratio[0] - 0.15]
    if not names:
        return ""
    return f" Did you mean {' or '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)}?"


def _closest(key: str, valid: typing.Iterable[str]) -> str:
    return did_you_mean(key, valid)


_NULL_WORDS = ("none", "null")
_TRUE_WORDS = ("true", "yes", "1", "on")
_FALSE_WORDS = ("false", "no", "0", "off")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML or CLI value to the annotated type ``tp``, or raise ConfigError naming ``where``.

    ``None`` (and, for an optional field, the text ``none``/``null``) is accepted only where the
    type allows it; a nested dataclass is built from a mapping; the types of :data:`_CONVERTERS`
    are converted by theirs; any other annotation (``Any``, a union of several types, ``Path``)
    passes the value through unchanged.
    """
    tp, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in _NULL_WORDS):
        if optional or tp is Any:
            return None
        raise ConfigError(f"{where}: got no value (null); expected {getattr(tp, '__name__', tp)}.")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _to_dataclass(value, tp, where)
    convert = _CONVERTERS.get(typing.get_origin(tp) or tp)
    return convert(value, tp, where) if convert else value


def _to_dataclass(value: Any, tp: type, where: str) -> Any:
    if isinstance(value, tp):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of {tp.__name__} settings, got {value!r}.")
    return from_dict(tp, value, where=where)


def _to_bool(value: Any, tp: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value.lower() in _TRUE_WORDS:
            return True
        if value.lower() in _FALSE_WORDS:
            return False
    elif isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{where}: expected true or false, got {value!r}.")


def _to_number(value: Any, tp: type, where: str) -> int | float:
    """``int`` or ``float``; a bool is not a number here, and an integer field refuses 3.5."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, got {value!r}.")
    try:
        number = tp(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        raise ConfigError(f"{where}: expected {'an integer' if tp is int else 'a number'}, got {value!r}.") from None
    if tp is int and isinstance(value, float) and number != value:
        raise ConfigError(f"{where}: expected an integer, got {value!r}.")
    return number


def _to_text(value: Any, tp: Any, where: str) -> str:
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{where}: expected text, got {value!r}.")
    return str(value)


def _yaml_text(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        reason = str(getattr(e, "problem", None) or e).splitlines()[0]
        raise ConfigError(f"{where}: {text!r} is not valid YAML ({reason}); write a list as a,b,c or [a, b, c] "
                          "and a mapping as {key: value}.") from None


def _to_list(value: Any, tp: Any, where: str) -> list:
    """A list (tuples too) from a list, ``a,b,c`` or ``[a, b]`` text, or one scalar; items by the
    first type argument."""
    if isinstance(value, str):
        value = (_yaml_text(value, where) if value.strip().startswith("[")
                 else [v.strip() for v in value.split(",") if v.strip()])
    if not isinstance(value, (list, tuple)):
        value = [value]
    args = typing.get_args(tp)
    item_tp = args[0] if args else Any
    return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]


def _to_mapping(value: Any, tp: Any, where: str) -> dict:
    """A dict with text keys from a mapping or ``{key: value}`` text; values by the second type argument."""
    if isinstance(value, str):
        value = _yaml_text(value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}.")
    args = typing.get_args(tp)
    value_tp = args[1] if len(args) == 2 else Any
    return {str(k): _coerce(v, value_tp, f"{where}.{k}") for k, v in value.items()}


def _to_choice(value: Any, tp: Any, where: str) -> Any:
    if value not in typing.get_args(tp):
        raise ConfigError(f"{where}: got {value!r}; choose one of {list(typing.get_args(tp))}.")
    return value


# The annotation (its origin for ``list[int]``, ``Literal[...]``) -> its converter.
_CONVERTERS = {bool: _to_bool, int: _to_number, float: _to_number, str: _to_text, list: _to_list,
               tuple: _to_list, dict: _to_mapping, typing.Literal: _to_choice}


def from_dict(cls: type[T], data: dict[str, Any], *, where: str = "") -> T:
    """Build ``cls`` from a (possibly nested) mapping, validating keys, types and choices.

    Raises:
        ConfigError: on an unknown key (naming the closest valid one), a value of the wrong type,
            or a value outside the field's choices.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}.")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if _exposed(f)}  # type: ignore[arg-type]  # cls: a dataclass
    unread = getattr(cls, "config_unread", {})
    kwargs = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        path = f"{where}.{name}" if where else name
        if name not in fields:
            renamed = renamed_error(cls, name, where=where)
            if renamed is not None:
                raise renamed
            raise ConfigError(f"unknown config key '{path}'.{_closest(name, fields)} "
                              f"(valid keys: {', '.join(sorted(fields))})")
        if name in unread and isinstance(value, dict):
            _refuse_unread(unread[name], value, path, f"{where}." if where else "")
        if isinstance(value, dict):
            value = {**_factory_values(fields[name], hints[name], unread.get(name)), **value}
        if "section" in fields[name].metadata:
            value = _to_dataclass(value, section_class(fields[name].metadata["section"]), path)
        coerced = _coerce(value, hints[name], path)
        new_names = fields[name].metadata.get("renamed") or {}
        if isinstance(coerced, str) and coerced in new_names:
            raise ConfigError(f"{path}: {coerced!r} was renamed to {new_names[coerced]!r} in {RENAMED_IN} "
                              "(docs/MIGRATING.md).")
        choices = fields[name].metadata.get("choices")
        if isinstance(choices, tuple) and coerced not in choices:
            raise ConfigError(f"{path}: got {coerced!r}; choose one of {list(choices)}.")
        kwargs[name] = coerced
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise _dotted(e, where, fields) from None
    except (ValueError, TypeError) as e:  # a library dataclass (TRL's SFTConfig) validating itself
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


def _dotted(error: ConfigError, where: str, fields: typing.Iterable[str]) -> ConfigError:
    """``error`` of a group's check read at ``where`` (``search``), with the key it starts with dotted
    as the user gives it (``max_steps must be >= 1`` -> ``search.max_steps must be >= 1``, as
    ``search.k``'s own message says); a message that starts otherwise is kept."""
    text = str(error)
    first = re.split(r"[\s:,]", text, maxsplit=1)[0]
    return ConfigError(f"{where}.{text}") if where and first in set(fields) else error


def renamed_error(cls: type, key: str, *, where: str = "", flag: bool = False) -> ConfigError | None:
    """The one-line error for ``key`` (dotted below ``cls``: ``train.epochs``) if the config that
    holds it renamed or removed it in 0.2.0 (its ``config_renamed``: old name -> the new name, or a
    sentence saying what replaced it), else ``None``. ``flag``: spell the keys as ``--flags``."""
    *groups, name = key.split(".")
    for group in groups:  # the nested config that holds the key
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if group not in fields:
            return None
        f = fields[group]
        cls = section_class(f.metadata["section"]) if "section" in f.metadata else _unwrap_optional(_hints(cls)[group])[0]
    new = getattr(cls, "config_renamed", {}).get(name)
    if new is None:
        return None
    dash = "--" if flag else ""
    here = f"{where}." if where else ""
    old = f"{dash}{here}{key}"
    if " " in new:
        return ConfigError(f"{old} was removed in {RENAMED_IN}: {new} (docs/MIGRATING.md).")
    return ConfigError(f"{old} was renamed to {dash}{here}{'.'.join([*groups, new])} in {RENAMED_IN} "
                       "(docs/MIGRATING.md).")


def _refuse_unread(unread: Unread, value: dict[str, Any], path: str, group: str) -> None:
    """Raise :meth:`Unread.error` for the first key of ``value`` that ``unread`` lists."""
    for key in value:
        name = str(key).replace("-", "_")
        if name in unread.homes:
            raise unread.error(f"{path}.{name}", name, group)


def _factory_values(f: dataclasses.Field, tp: Any, unread: Unread | None) -> dict[str, Any]:
    """The settings a group's ``default_factory`` gives that its class defaults do not (``search:
    SearchConfig = field(default_factory=lambda: SearchConfig(max_new_tokens=192))``), so that a
    recipe that sets some keys of the group keeps the field's defaults for the others. Keys the
    config refuses as unread keep their class defaults (nothing reads them)."""
    tp, _ = _unwrap_optional(tp)
    factory = f.default_factory
    if factory is _MISSING or factory is tp or not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return {}
    try:
        made, plain = factory(), tp()
    except TypeError:  # a group with required fields has no class defaults to differ from
        return {}
    skip = unread.homes if unread else {}
    return {g.name: getattr(made, g.name) for g in dataclasses.fields(tp)
            if _exposed(g) and g.name not in skip and getattr(made, g.name) != getattr(plain, g.name)}


def unread_keys(cls: type, prefix: str = "") -> set[str]:
    """The dotted names (``trees.search.w_latent``) of every key that ``cls`` or a group nested in
    it refuses as unread (see :class:`Unread`)."""
    out = {f"{prefix}{field}.{key}" for field, unread in getattr(cls, "config_unread", {}).items()
           for key in unread.homes}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp, _ = _unwrap_optional(hints[f.name])
        if _exposed(f) and isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= unread_keys(tp, f"{prefix}{f.name}.")
    return out


def _exposed(f: dataclasses.Field) -> bool:
    """Fields that are settings: initialisable and not private (library dataclasses have both kinds)."""
    return f.init and not f.name.startswith("_")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain JSON-able data (nested dataclasses become dicts)."""
    return dataclasses.asdict(cfg)


def config_hash(cfg: Any, *, ignore: typing.Iterable[str] = ()) -> str:
    """A short, stable hash of a config (or any JSON-able data) for resume checks.

    Args:
        ignore (`Iterable[str]`, *optional*): top-level keys left out (e.g. output paths).
    Returns:
        12 hex characters of a SHA-256 over the canonical JSON.
    """
    data = to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in set(ignore)}
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--{dotted}: '{part}' is a value, not a group of settings.")
    node[parts[-1]] = value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _flat_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted name, field, type) for every leaf field, nested dataclasses flattened."""
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not _exposed(f):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        name = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.extend(_flat_fields(tp, name + "."))
        else:
            out.append((name, f, hints[f.name]))
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML recipe; raises ConfigError if it is missing, empty (blank or comments only) or
    not a mapping: an empty ``--config`` is a mistake (a truncated or wrong file), never a run with
    every default."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}. Pass --config with a path to a YAML recipe "
                          f"(see the configs/ folder of the repository).")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if text.strip() else None  # blank with tabs: no YAML error
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())}).") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a recipe; a recipe is a mapping of settings.") from None
    except (UnicodeDecodeError, ValueError) as e:  # a binary file, or one yaml cannot read
        raise ConfigError(f"{path}: not a YAML text file ({type(e).__name__}).") from None
    if data is None:
        raise ConfigError(f"{path}: the recipe is empty (blank or comments only); put settings in it as a "
                          f"YAML mapping (e.g. 'name: my-run'; see the configs/ folder), or leave --config "
                          f"out to run with the defaults.")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of settings, got {type(data).__name__}.")
    return data


def load_config(cls: type[T], path: str | Path | None = None,
                overrides: dict[str, Any] | None = None) -> T:
    """Defaults, then the sections of another recipe the config names (``cls.recipe_sections``),
    then the YAML recipe at ``path``, then ``overrides`` (dotted keys allowed)."""
    data = load_yaml(path) if path else {}
    nested: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        _set_dotted(nested, key.replace("-", "_"), value)
    merged = _merge(data, nested)
    return from_dict(cls, _merge(_recipe_base(cls, merged), merged), where="")


def _recipe_base(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The sections a config takes from a recipe it names: ``cls.recipe_sections`` maps a field
    (whose value is a YAML path) to the section names read from that file (e.g. ``codetool eval
    --recipe configs/pipeline/paper-qwen2.5-7b.yaml`` takes the recipe's ``judge``)."""
    base: dict[str, Any] = {}
    for name, sections in getattr(cls, "recipe_sections", {}).items():
        if data.get(name):
            recipe = load_yaml(data[name])
            base.update({s: recipe[s] for s in sections if isinstance(recipe.get(s), dict)})
    return base
