"""The package's layering (issue 18): lower packages never import higher ones.

Imports are read with ``ast`` from every module of ``codetool`` (module-level and function-level
imports both count, and so do imports under ``if TYPE_CHECKING:``), so an upward import cannot
hide inside a function. Imports that run against the layering today are listed in ``ALLOWED``,
so the test passes now and fails on any *new* upward import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import codetool

ROOT = Path(codetool.__file__).resolve().parent

# (package, packages it must not import). Lower floors first. ``assemble`` composes the stages
# (models, prm, tools, executor, search) into what a command runs; the unit runners of the long
# jobs (``jobs``) open their parts through it; the commands (``commands``, ``run``, ``pipeline``,
# ``cli``, ``decide.benchmark``'s command) sit above them.
ABOVE_SEARCH = ("assemble", "jobs", "run", "tree", "eval", "pipeline", "decide", "cli", "policy", "commands")
RULES = [
    ("codetool.tools", ("search", "prm", *ABOVE_SEARCH)),
    # the synthetic world (issue 41) stands on the tools' records only: no search, executor or model
    ("codetool.world", ("search", "prm", "executor", "models", *ABOVE_SEARCH)),
    ("codetool.models", ("search", "prm", *ABOVE_SEARCH)),
    ("codetool.executor", ("search", "prm", *ABOVE_SEARCH)),
    ("codetool.split", ("tools", "models", "executor", "search", "prm", *ABOVE_SEARCH)),
    ("codetool.search", ABOVE_SEARCH),
    # the Ray driver runs any command's runner, which it is handed: it never imports a command
    ("codetool.distributed", ("tools", "models", "executor", "search", "prm", *ABOVE_SEARCH)),
    ("codetool.prm", ABOVE_SEARCH),
    ("codetool.assemble", ("jobs", "run", "tree", "eval", "pipeline", "decide", "cli", "policy", "commands")),
    ("codetool.decide", ("jobs", "run", "tree", "pipeline", "cli", "policy", "commands")),
    ("codetool.eval", ("jobs", "run", "tree", "pipeline", "decide", "cli", "policy", "commands")),
    # following the configuration of build-trees or run stays within the composition module and
    # the stage it configures: the two commands never reach into each other
    # the trees stand on the judge (leaf success judged), never on evaluation (docs/ARCHITECTURE.md section 1)
    ("codetool.tree", ("jobs", "run", "eval", "pipeline", "decide", "cli", "policy", "commands")),
    # the judge stands on the models (and text, config, records) only
    ("codetool.judge", ("tools", "executor", "prm", *ABOVE_SEARCH)),
    # policy RL composes the stages (and eval's metrics and judges); the commands sit above it
    ("codetool.policy", ("jobs", "run", "tree", "pipeline", "decide", "cli", "commands")),
    # the unit runners are handed their settings; they never import a command
    ("codetool.jobs", ("run", "pipeline", "cli", "policy", "commands")),
    ("codetool.commands", ("cli",)),
]

# Inside the executor (issue 42): the API (``codetool.executor``, ``executor.py``) stands on
# ``host/``, ``host/`` on ``kernel/`` (and ``config``, ``result``), ``kernel/`` on nothing of ours;
# ``inside/`` is shipped as text, so no module of the package imports it but itself. Outside the
# executor, code imports the API package, ``config`` and ``result``, never a folder.
EXECUTOR_RULES = [
    ("codetool.executor.kernel", ("codetool.executor.host", "codetool.executor.inside", "codetool.executor.executor",
                                  "codetool.executor.config", "codetool.executor.result", "codetool.executor")),
    ("codetool.executor.host", ("codetool.executor.inside", "codetool.executor.executor", "codetool.executor")),
    ("codetool.executor.config", ("codetool.executor.host", "codetool.executor.inside", "codetool.executor.kernel")),
    ("codetool.executor.result", ("codetool.executor.host", "codetool.executor.inside", "codetool.executor.kernel")),
    ("codetool", ("codetool.executor.host", "codetool.executor.inside", "codetool.executor.kernel")),
]


def executor_violations() -> set[tuple[str, str]]:
    """``EXECUTOR_RULES`` broken: a rule's forbidden module (or a module below it; the bare
    package ``codetool.executor`` only itself) named by an importer of the rule's package. The
    last rule is for everything outside ``codetool.executor``; ``inside/`` may import itself."""
    out = set()
    for path in sorted(ROOT.rglob("*.py")):
        importer = module_name(path)
        inside_executor = importer == "codetool.executor" or importer.startswith("codetool.executor.")
        for package, forbidden in EXECUTOR_RULES:
            if package == "codetool" and inside_executor:
                continue
            if importer != package and not importer.startswith(package + "."):
                continue
            for target in imported_modules(path):
                target = _strip_attribute(target)
                if package != "codetool" and (target.startswith(package + ".") or target == package):
                    continue
                if any(target == f or (f != "codetool.executor" and target.startswith(f + ".")) for f in forbidden):
                    out.add((importer, target))
    return out


def test_the_executors_arrows_point_one_way():
    found = sorted(executor_violations())
    assert not found, ("executor imports against its layout (API -> host -> kernel; inside/ shipped as text, "
                       f"imported by nobody; outside the executor only the API package, config and result): {found}")


# Imports that run against the layering today (none since the composition module, issue 18).
ALLOWED: set[tuple[str, str]] = set()


# Modules over MAX_MODULE_LINES (none since issue 29's redesign step): remove an entry when its
# module is under the limit (a test below says when). Never add one.
MAX_MODULE_LINES = 500
LONG_MODULES: dict[str, str] = {
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module named by an ``import``/``from ... import`` anywhere in ``path`` (relative
    imports resolved against the module's package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # ``from codetool import eval`` names a package too
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {m for m in found if m == "codetool" or m.startswith("codetool.")}


def violations() -> set[tuple[str, str]]:
    out = set()
    for path in sorted(ROOT.rglob("*.py")):
        importer = module_name(path)
        for package, forbidden in RULES:
            if importer != package and not importer.startswith(package + "."):
                continue
            for target in imported_modules(path):
                if any(target == f"codetool.{f}" or target.startswith(f"codetool.{f}.") for f in forbidden):
                    out.add((importer, _strip_attribute(target)))
    return out


def _strip_attribute(target: str) -> str:
    """``codetool.eval.metrics.summarize`` (a name imported from a module) -> the module."""
    parts = target.split(".")
    while len(parts) > 2 and not ((ROOT.parent / Path(*parts)).with_suffix(".py").is_file()
                                  or (ROOT.parent / Path(*parts) / "__init__.py").is_file()):
        parts.pop()
    return ".".join(parts)


def test_the_parser_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    root = tmp_path / "codetool"
    for name in ("__init__.py", "tools/__init__.py", "search/__init__.py", "search/run.py", "eval/__init__.py",
                 "eval/metrics.py", "tree/__init__.py", "tree/build.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / "tools" / "x.py").write_text("def f():\n    from codetool.search.run import main\n"
                                         "    from ..eval import metrics\n    import codetool.tree.build\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    assert imported_modules(root / "tools" / "x.py") == {
        "codetool.search.run", "codetool.search.run.main", "codetool.eval", "codetool.eval.metrics",
        "codetool.tree.build"}
    assert violations() == {("codetool.tools.x", "codetool.search.run"), ("codetool.tools.x", "codetool.eval"),
                            ("codetool.tools.x", "codetool.eval.metrics"), ("codetool.tools.x", "codetool.tree.build")}


def test_no_module_imports_upward():
    found = violations()
    new = sorted(found - ALLOWED)
    assert not new, ("upward imports (a lower package importing a higher one; move the code, or compose "
                     f"it in a module above both): {new}")


def test_the_allow_list_has_no_stale_entries():
    stale = sorted(ALLOWED - violations())
    assert not stale, f"remove these from ALLOWED, they no longer occur: {stale}"


def test_commands_reach_their_stage_through_the_composition_module():
    """``run`` and ``build-trees`` get their policy, scorer, tool backend, executors and tasks from
    ``codetool.assemble``; neither builds them itself nor imports the other."""
    run_imports = imported_modules(ROOT / "commands" / "run.py") | imported_modules(ROOT / "jobs" / "queries.py")
    build_imports = set().union(*(imported_modules(ROOT / p) for p in ("commands/build_trees.py", "jobs/trees.py",
                                                                        "tree/build.py")))
    for imports in (run_imports, build_imports):
        assert "codetool.assemble" in imports
        assert not any(m.startswith(("codetool.models.backends", "codetool.tools.backends", "codetool.prm.scorer"))
                       for m in imports)
    assert not any(m.startswith(("codetool.tree", "codetool.jobs.trees", "codetool.commands.build_trees"))
                   for m in run_imports)
    assert not any(m.startswith(("codetool.jobs.queries", "codetool.commands.run")) for m in build_imports)


# -- import circles (issue 29) ---------------------------------------------------------------------
# The graph's nodes are modules; an edge A -> B means A names B in an import anywhere in its file
# (module level, in a function, under ``if TYPE_CHECKING:``). ``from pkg import sub`` is an edge to
# the submodule ``pkg.sub``, not to ``pkg/__init__``; ``from pkg import name`` is an edge to
# ``pkg/__init__``. A function-level import that closes a circle still counts: it hides the circle
# from Python's import machinery, not from the design. The circles of today are listed (each as its
# strongly connected set of modules) so the test passes now and fails on any new one (none since
# issue 29's redesign step; docs/ARCHITECTURE.md section 1).
ALLOWED_CIRCLES: set[frozenset[str]] = {
}


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return ((ROOT.parent / Path(*parts)).with_suffix(".py").is_file()
            or (ROOT.parent / Path(*parts) / "__init__.py").is_file())


def import_edges(path: Path, *, module_level_only: bool = False) -> set[str]:
    """The codetool modules that ``path`` imports (see the comment above ``ALLOWED_CIRCLES``).

    Args:
        module_level_only (`bool`, *optional*, defaults to `False`): only imports that run when the
            module is imported (top level, under ``if``/``try`` but not ``if TYPE_CHECKING:``).
    """
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if module_level_only:
        nodes, todo = [], list(tree.body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                todo += node.body + node.orelse
            elif isinstance(node, ast.Try):
                todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                nodes.append(node)
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if alias.name != "*" and _is_module(sub) else base)
    return {_strip_attribute(m) for m in found if m == "codetool" or m.startswith("codetool.")} - {name}


_GRAPHS: dict[tuple[Path, bool], dict[str, set[str]]] = {}


def import_graph(*, module_level_only: bool = False) -> dict[str, set[str]]:
    """``module -> modules it imports`` over every module of the package (read once per session)."""
    key = (ROOT, module_level_only)
    if key not in _GRAPHS:
        paths = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
        _GRAPHS[key] = {m: import_edges(p, module_level_only=module_level_only) & paths.keys()
                        for m, p in paths.items()}
    return _GRAPHS[key]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between top-level packages and modules (``codetool.search``, ``codetool.run``)."""
    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(top(a), set()).update(top(b) for b in targets if top(b) != top(a))
    return out


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The import circles of ``graph``: its strongly connected sets of two or more modules
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.add(frozenset(members))
    return found


def test_the_circle_finder_on_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"g"}}
    assert circles(graph) == {frozenset("abc"), frozenset("ef")}
    assert package_graph({"codetool.x.a": {"codetool.y.b"}, "codetool.y.b": {"codetool.x.c"},
                          "codetool.x.c": set()}) == {"codetool.x": {"codetool.y"}, "codetool.y": {"codetool.x"}}


def test_the_import_reader_tells_submodules_from_names(tmp_path, monkeypatch):
    root = tmp_path / "codetool"
    for name in ("__init__.py", "pkg/__init__.py", "pkg/sub.py", "pkg/other.py", "top.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / "pkg" / "other.py").write_text(
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "from codetool.pkg import sub\nfrom . import Thing\n"
        "if TYPE_CHECKING:\n    from codetool.top import T\n"
        "def f():\n    import codetool.top\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    other = root / "pkg" / "other.py"
    assert import_edges(other) == {"codetool.pkg.sub", "codetool.pkg", "codetool.top"}
    assert import_edges(other, module_level_only=True) == {"codetool.pkg.sub", "codetool.pkg"}


def test_no_import_circle_runs_at_import_time():
    """Among the imports that run when a module is imported, there is no circle at all (one
    would fail or half-initialise a module depending on which side is imported first)."""
    found = circles(import_graph(module_level_only=True))
    assert not found, f"module-level import circles: {sorted(sorted(c) for c in found)}"


def test_no_new_import_circle():
    found = circles(import_graph())
    new = sorted(sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED_CIRCLES))
    assert not new, ("new import circles (move the shared part into a module both can import, or pass it in; "
                     f"a function-level import does not count as a fix): {new}")


def test_the_allowed_circles_are_current():
    found = circles(import_graph())
    stale = sorted(sorted(c) for c in ALLOWED_CIRCLES if c not in found)
    assert not stale, ("these allowed circles changed or are gone: replace them in ALLOWED_CIRCLES by what "
                       f"remains of them (found: {sorted(sorted(c) for c in found)}): {stale}")


def test_no_circle_between_packages():
    """The packages (``codetool.tools``, ``codetool.search``, ``codetool.run`` ...) form a
    layered graph: no package reaches back, through any chain of modules, to one that imports it."""
    found = circles(package_graph(import_graph()))
    assert not found, f"import circles between packages: {sorted(sorted(c) for c in found)}"


def _module_lines() -> dict[str, int]:
    return {path.relative_to(ROOT.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in sorted(ROOT.rglob("*.py"))}


def test_the_line_count_sees_every_module(tmp_path, monkeypatch):
    root = tmp_path / "codetool"
    (root / "pkg").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "pkg" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    assert _module_lines() == {"codetool/__init__.py": 0, "codetool/pkg/long.py": MAX_MODULE_LINES + 1}


def test_no_module_over_500_lines():
    """Modules stay under ~500 lines (issue 29's done-when): split a long one by responsibility,
    not by line number."""
    long = {name: n for name, n in _module_lines().items() if n > MAX_MODULE_LINES and name not in LONG_MODULES}
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (split each by responsibility, e.g. the records, "
                      f"the transport and the policy of a module in their own modules): {long}")


def test_the_long_module_list_has_no_stale_entries():
    lines = _module_lines()
    stale = sorted(name for name in LONG_MODULES if lines.get(name, 0) <= MAX_MODULE_LINES)
    assert not stale, f"remove these from LONG_MODULES, they are gone or under {MAX_MODULE_LINES} lines: {stale}"


def test_no_module_imports_a_private_name_of_the_search():
    """The search's strategies stand on the public mechanics of ``search.episode`` (issue 29): no
    module of ``codetool.search`` imports an underscored name, and no module imports one from it."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        importer = module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("codetool"):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
            if private and (importer.startswith("codetool.search") or node.module.startswith("codetool.search")):
                found.append((importer, node.module, private))
    assert not found, f"private names imported across modules (make them public or move them): {found}"


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of every non-codetool module ``path`` imports (anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"codetool"}


def test_only_commands_draw_progress_and_with_one_library():
    """One progress library (``rich``), in the commands (and ``cli``'s log handler) only: the parts
    report through ``codetool.progress`` callbacks (docs/ARCHITECTURE.md sections 1 and 6)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        imports = _third_party_imports(path)
        if "tqdm" in imports:
            found.append((name, "tqdm"))
        if "rich" in imports and not (name.startswith("codetool.commands") or name == "codetool.cli"):
            found.append((name, "rich"))
    assert not found, f"progress bars or rich output below the commands (take a progress callback): {found}"
