"""Every setting is read (issue 29, made stricter in issue 42): each field of every command's config
tree, ours, not TRL's or transformers', is read by an attribute access (``cfg.search.k``, or
``getattr(cfg, "k")``) on an object whose type is that config, one of its groups, or a class that
holds one (``self.cfg`` of a search), found with ``ast``. A name that merely appears somewhere in the
package does not count. A field that nothing reads is a setting a user can give to no effect;
delete it (0.2.0 refuses its key naming what replaced it) or read it.

Types come from what the code declares: parameter and variable annotations, ``self`` in a class's
methods, the fields of config dataclasses, the attributes classes give themselves in their methods
(``self.cfg = cfg`` where ``cfg`` is typed) or declare in their bodies, ``for`` targets over typed
iterables (``zip``, ``enumerate``, ``.items()``, tuples of generators), and ``getattr`` over a
module's tuple of names (``for key in REWARDS: getattr(self, key)``). ``group_values(cfg, Group)``,
the hand-over of a group, reads every field of ``Group``.
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
OURS = ("codetool.", __name__)  # our modules (and this one's test classes)
# Fields read by what they are, not by name: the subcommand word of `codetool data fetch` (its
# choices are its check; one action today).
READ_BY_PARSING = {"codetool.commands.data.DataConfig.action"}


def _nested(cls: type, f: dataclasses.Field) -> list[type]:
    """The config classes a field holds: a group, the items of a list of groups, a section."""
    tp, _ = _unwrap_optional(_hints(cls).get(f.name, f.type))
    out = [a for a in (tp, *typing.get_args(tp)) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    section = f.metadata.get("section")
    if isinstance(section, str):
        module, _, attr = section.partition(":")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def _config_classes() -> set[type]:
    """The config dataclasses of every command, and the groups nested in them, recursively."""
    seen: set[type] = set()
    todo = [getattr(importlib.import_module(module), name) for module, name, _, _ in COMMANDS.values()]
    while todo:
        cls = todo.pop()
        if cls not in seen and dataclasses.is_dataclass(cls):
            seen.add(cls)
            todo += [n for f in dataclasses.fields(cls) for n in _nested(cls, f)]
    return seen


def _names(annotation: ast.AST | None) -> set[str]:
    """The class names an annotation mentions (``RunConfig | None`` -> ``{"RunConfig", "None"}``)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(annotation) if isinstance(n, (ast.Name, ast.Attribute))} \
        if annotation is not None else set()


class Types:
    """What the package declares: class name -> attribute -> the class names it holds, class ->
    its bases, module-level tuples of names."""

    def __init__(self, configs: set[type], trees: list[ast.Module]):
        self.attrs: dict[str, dict[str, set[str]]] = {}
        self.bases: dict[str, set[str]] = {}
        for cls in configs:
            for base in cls.__mro__:
                if dataclasses.is_dataclass(base):
                    for f in dataclasses.fields(base):
                        self.add(base.__name__, f.name, {n.__name__ for n in _nested(base, f)})
                    self.bases.setdefault(base.__name__, set()).update(b.__name__ for b in base.__mro__[1:])
        self.strings: dict[str, list[str]] = {}
        for tree in trees:
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    value = node.value
                    elts = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
                    if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
                        self.strings[node.targets[0].id] = [e.value for e in elts]

    def add(self, cls: str, attr: str, types: set[str]) -> None:
        self.attrs.setdefault(cls, {}).setdefault(attr, set()).update(types)

    def of(self, types: set[str], attr: str) -> set[str]:
        """The types of ``attr`` on an object of any of ``types`` (their bases' attributes too)."""
        out, todo, seen = set(), list(types), set()
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                out |= self.attrs.get(name, {}).get(attr, set())
                todo += self.bases.get(name, ())
        return out


class Reads(ast.NodeVisitor):
    """One pass over a module: with ``learn``, the attributes classes give themselves; without,
    every typed attribute read, as ``(class name, attribute)``."""

    def __init__(self, types: Types, learn: bool, found: set[tuple[str, str]]):
        self.types, self.learn, self.found = types, learn, found
        self.scopes: list[dict[str, set[str]]] = [{}]
        self.names: list[dict[str, list[str]]] = [{}]  # loop variables over a tuple of names
        self.classes: list[str] = []

    def lookup(self, name: str, scopes: list) -> typing.Any:
        return next((scope[name] for scope in reversed(scopes) if name in scope), None)

    def typeof(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            return self.lookup(node.id, self.scopes) or set()
        if isinstance(node, ast.Attribute):
            return self.types.of(self.typeof(node.value), node.attr)
        if isinstance(node, (ast.Subscript, ast.Starred)):
            return self.typeof(node.value)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name[:1].isupper():  # a class built
                return {name}
            if name in ("replace", "list", "sorted", "reversed", "next", "iter") and node.args:
                return self.typeof(node.args[0])
            if isinstance(func, ast.Attribute) and name in ("with_settings", "run_config", "pop", "get", "values"):
                return self.typeof(func.value)
            return set()
        if isinstance(node, ast.IfExp):
            return self.typeof(node.body) | self.typeof(node.orelse)
        if isinstance(node, (ast.BoolOp, ast.List, ast.Tuple, ast.Set)):
            return set().union(*(self.typeof(v) for v in getattr(node, "values", None) or node.elts))
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self.inside(node.generators, lambda: self.typeof(node.elt))
        return set()

    def inside(self, generators: list[ast.comprehension], then):
        self.scopes.append({})
        self.names.append({})
        try:
            for g in generators:
                self.bind(g.target, g.iter)
            return then()
        finally:
            self.scopes.pop()
            self.names.pop()

    def bind(self, target: ast.AST, source: ast.AST) -> None:
        """Bind a ``for`` target from what it iterates."""
        call = source.func if isinstance(source, ast.Call) else None
        if isinstance(target, ast.Tuple) and isinstance(call, ast.Name) and call.id in ("zip", "enumerate"):
            for t, s in zip(target.elts, source.args if call.id == "zip" else [None, *source.args]):
                if s is not None:
                    self.bind(t, s)
        elif isinstance(target, ast.Tuple) and isinstance(source, ast.GeneratorExp) and isinstance(source.elt, ast.Tuple):
            for t, ty in zip(target.elts, self.inside(source.generators, lambda: [self.typeof(e) for e in source.elt.elts])):
                self.assign(t, ty)
        elif isinstance(target, ast.Tuple) and isinstance(call, ast.Attribute) and call.attr == "items":
            self.assign(target.elts[-1], self.typeof(call.value))
        else:
            self.assign(target, self.typeof(source))
            literal = getattr(source, "elts", None)
            strings = self.types.strings.get(source.id) if isinstance(source, ast.Name) else \
                [e.value for e in literal] if literal and all(isinstance(e, ast.Constant) for e in literal) else None
            if isinstance(target, ast.Name) and strings:
                self.names[-1][target.id] = strings

    def assign(self, target: ast.AST, types: set[str]) -> None:
        if isinstance(target, ast.Name) and types:
            self.scopes[-1].setdefault(target.id, set()).update(types)
        elif self.learn and isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "self" \
                and self.classes and types:
            self.types.add(self.classes[-1], target.attr, types)

    def read(self, obj: ast.AST, attrs: list[str]) -> None:
        if not self.learn:
            self.found.update((t, a) for t in self.typeof(obj) for a in attrs)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.types.bases.setdefault(node.name, set()).update(n for b in node.bases for n in _names(b))
        for item in node.body:
            if self.learn and isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                self.types.add(node.name, item.target.id, _names(item.annotation))
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
        scope = {p.arg: _names(p.annotation) for p in params if p.annotation is not None}
        if self.classes and params and params[0].arg in ("self", "cls"):
            scope[params[0].arg] = {self.classes[-1]}
        self.scopes.append(scope)
        self.names.append({})
        self.generic_visit(node)
        self.scopes.pop()
        self.names.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and \
                isinstance(node.value, ast.Tuple) and len(target.elts) == len(node.value.elts) else [(target, node.value)]
            for t, v in pairs:
                self.assign(t, self.typeof(v))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.assign(node.target, _names(node.annotation) | (self.typeof(node.value) if node.value else set()))
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.assign(node.target, self.typeof(node.value))
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self.bind(node.target, node.iter)
        self.generic_visit(node)

    def visit_ListComp(self, node) -> None:
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]

        def walk() -> None:
            for x in [*(y for g in node.generators for y in (g.iter, *g.ifs)), *parts]:
                self.visit(x)

        self.inside(node.generators, walk)

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            self.read(node.value, [node.attr])
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = getattr(node.func, "id", "")
        if name == "getattr" and len(node.args) >= 2:
            key = node.args[1]
            names = [key.value] if isinstance(key, ast.Constant) else \
                self.lookup(key.id, self.names) or [] if isinstance(key, ast.Name) else []
            self.read(node.args[0], names)
        elif name == "group_values" and len(node.args) == 2 and isinstance(node.args[1], ast.Name):
            self.read(node.args[0], list(self.types.attrs.get(node.args[1].id, {})))
        self.generic_visit(node)


def typed_reads(trees: list[ast.Module], configs: set[type]) -> set[tuple[str, str]]:
    """Every ``(class name, attribute)`` read on a typed object in ``trees``."""
    types, found = Types(configs, trees), set()
    for _ in range(2):  # a class's attribute may be typed by another class's, learnt in the first pass
        for tree in trees:
            Reads(types, True, found).visit(tree)
    for tree in trees:
        Reads(types, False, found).visit(tree)
    return found


def _our_fields(cls: type) -> list[str]:
    """The fields ``cls`` or one of our bases declares, not a library base's (TRL's and
    transformers' settings, and our other defaults for them, are read by the library)."""
    def declared(base: type) -> set[str]:
        return set(vars(base).get("__annotations__", {}))

    ours = {name for base in cls.__mro__ if base.__module__.startswith(OURS) for name in declared(base)}
    theirs = {name for base in cls.__mro__ if not base.__module__.startswith(OURS) for name in declared(base)}
    return [f.name for f in dataclasses.fields(cls) if _exposed(f) and f.name in ours - theirs]


def unread_fields(trees: list[ast.Module], configs: set[type]) -> list[str]:
    reads = typed_reads(trees, configs)
    out = set()
    for cls in configs:
        related = {b.__name__ for b in cls.__mro__}  # a read on a group counts for the config composing it
        for name in _our_fields(cls):
            if not any((t, name) in reads for t in related):
                out.add(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return sorted(out - READ_BY_PARSING)


def test_every_setting_of_every_command_is_read_on_a_typed_object():
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))]
    unread = unread_fields(trees, _config_classes())
    assert not unread, f"settings that no code reads: {unread}"


def test_the_walk_reaches_every_command_and_its_groups():
    from codetool.models.lora import LoRAGroup
    from codetool.prm.format import PRMFormat
    from codetool.search.config import SearchConfig

    walked = _config_classes()
    assert {SearchConfig, PRMFormat}.issubset(walked)  # nested groups and the pipeline's train section
    assert any(issubclass(cls, LoRAGroup) for cls in walked) and len(walked) > 20


@dataclasses.dataclass
class _Inner:
    depth: int = 1
    unused: int = 2


@dataclasses.dataclass
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    width: int = 3
    named: int = 4
    mentioned: int = 5


def test_only_reads_on_typed_objects_count():
    """A read through an annotated parameter, a class attribute set from one and a loop over a
    tuple of names count; the same name on an untyped object, or as a string, does not."""
    source = '''
NAMES = ("named",)

class Holder:
    def __init__(self, cfg: _Outer):
        self.cfg = cfg

    def use(self):
        return self.cfg.inner.depth

def reads(cfg: _Outer, other):
    for key in NAMES:
        getattr(cfg, key)
    return cfg.width + other.unused + len("mentioned")
'''
    unread = unread_fields([ast.parse(source)], {_Outer, _Inner})
    assert [u.rsplit(".", 2)[1:] for u in unread] == [["_Inner", "unused"], ["_Outer", "mentioned"]]
