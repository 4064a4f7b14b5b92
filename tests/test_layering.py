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
# (models, prm, tools, executor, search) into what a command runs; the commands (``run``,
# ``pipeline``, ``cli``, ``tree.build``'s and ``decide.benchmark``'s commands) sit above it.
ABOVE_SEARCH = ("assemble", "run", "tree", "eval", "pipeline", "decide", "cli", "policy", "commands")
RULES = [
    ("codetool.tools", ("search", "prm", *ABOVE_SEARCH)),
    ("codetool.models", ("search", "prm", *ABOVE_SEARCH)),
    ("codetool.executor", ("search", "prm", *ABOVE_SEARCH)),
    ("codetool.split", ("tools", "models", "executor", "search", "prm", *ABOVE_SEARCH)),
    ("codetool.search", ABOVE_SEARCH),
    ("codetool.prm", ABOVE_SEARCH),
    ("codetool.assemble", ("run", "tree", "eval", "pipeline", "decide", "cli", "policy", "commands")),
    ("codetool.decide", ("run", "tree", "pipeline", "cli", "policy", "commands")),
    ("codetool.eval", ("run", "tree", "pipeline", "decide", "cli", "policy", "commands")),
    # following the configuration of build-trees or run stays within the composition module and
    # the stage it configures: the two commands never reach into each other
    ("codetool.tree", ("run", "pipeline", "decide", "cli", "policy", "commands")),
    ("codetool.run", ("tree", "pipeline", "cli", "policy", "commands")),
    # policy RL composes the stages (and eval's metrics and judges); the commands sit above it
    ("codetool.policy", ("run", "tree", "pipeline", "decide", "cli", "commands")),
    ("codetool.commands", ("cli",)),
]

# Imports that run against the layering today (none since the composition module, issue 18).
ALLOWED: set[tuple[str, str]] = set()


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
    run_imports = imported_modules(ROOT / "run.py")
    build_imports = imported_modules(ROOT / "tree" / "build.py")
    for imports in (run_imports, build_imports):
        assert "codetool.assemble" in imports
        assert not any(m.startswith(("codetool.models.backends", "codetool.tools.backends", "codetool.prm.scorer"))
                       for m in imports)
    assert not any(m.startswith("codetool.tree") for m in run_imports)
    assert not any(m == "codetool.run" or m.startswith("codetool.run.") for m in build_imports)
