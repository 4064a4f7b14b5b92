"""The executor's boundary in its layout (issue 42): what runs inside the sandbox is
``codetool/executor/inside/`` and the part of the kernel layer both sides use (``kernel/calls.py``,
``kernel/procs.py``), shipped as source by ``host/launch.py``; nothing of ``host/`` or the API is
ever shipped, and ``kernel/``'s host-only modules (``seccomp``, ``cgroups``, ``schedstat``) stay out.

Read with ``ast`` (module-level and function-level imports both count). The package-wide rules
(who may import ``inside`` and ``kernel`` at all) are in ``tests/test_layering.py``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from codetool.executor.host import launch

EXECUTOR = Path(launch.__file__).resolve().parent.parent
SHIPPED_FOLDERS = ("inside", "kernel")
HOST_ONLY_KERNEL = {"kernel/seccomp.py", "kernel/cgroups.py", "kernel/schedstat.py"}


def _folder_modules(folder: str, *, shipped_only: bool = True) -> list[Path]:
    return sorted(p for p in (EXECUTOR / folder).glob("*.py") if p.name != "__init__.py"
                  and not (shipped_only and p.relative_to(EXECUTOR).as_posix() in HOST_ONLY_KERNEL))


def _package_path(relative: str) -> str:
    """``inside/io.py`` -> ``codetool.executor.inside.io``."""
    return "codetool.executor." + relative.removesuffix(".py").replace("/", ".")


def _imports(node: ast.AST) -> list[str]:
    """The modules every import under ``node`` names (``from pkg import sub`` names ``pkg.sub``
    when ``sub`` is a module of ours)."""
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            found += [alias.name for alias in n.names]
        elif isinstance(n, ast.ImportFrom):
            assert n.level == 0, "a shipped module is installed by name: no relative imports"
            base = n.module or ""
            subs = [f"{base}.{a.name}" for a in n.names
                    if (EXECUTOR.parent.parent / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").is_file()]
            found += subs or [base]
    return found


def test_what_is_shipped_is_inside_and_kernel_exactly():
    """Every shipped file lies in ``inside/`` or ``kernel/``, every module there but the kernel's
    host-only ones is shipped, and the root's and workers' lists name shipped modules only: no host
    module goes into the sandbox."""
    files = set(launch.SOURCES.values())
    assert all(f.split("/")[0] in SHIPPED_FOLDERS and (EXECUTOR / f).is_file() for f in files), files
    assert files == {p.relative_to(EXECUTOR).as_posix() for folder in SHIPPED_FOLDERS for p in _folder_modules(folder)}
    assert len(files) == len(launch.SOURCES)
    kernel = {p.relative_to(EXECUTOR).as_posix() for p in _folder_modules("kernel", shipped_only=False)}
    assert HOST_ONLY_KERNEL <= kernel
    assert set(launch.SANDBOX_MODULES) == set(launch.SOURCES)
    assert all(name.startswith("sandbox_") for name in launch.SOURCES)  # never a standard module's name


def test_shipped_modules_import_only_the_standard_library_and_each_other():
    """A shipped module imports the standard library and shipped modules only: by wire name (in
    the sandbox), or by package path in the fallback the host uses (tests, documentation tools),
    and both name the same modules. ``kernel/`` imports nothing of ``inside/``."""
    by_path = {_package_path(f): wire for wire, f in launch.SOURCES.items()}
    problems = []
    for folder in SHIPPED_FOLDERS:
        allowed_paths = {p for p in by_path if folder == "inside" or p.startswith("codetool.executor.kernel.")}
        allowed_wires = {by_path[p] for p in allowed_paths}
        for path in _folder_modules(folder):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for name in _imports(tree):
                top = name.split(".")[0]
                if name in allowed_wires or name in allowed_paths or (top in sys.stdlib_module_names
                                                                      and top != "codetool"):
                    continue
                problems.append((path.relative_to(EXECUTOR).as_posix(), name))
            for node in ast.walk(tree):
                if isinstance(node, ast.Try) and any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body):
                    wires = {n for s in node.body for n in _imports(s)}
                    fallback = {by_path.get(n, n) for h in node.handlers for s in h.body for n in _imports(s)}
                    if wires != fallback:
                        problems.append((path.relative_to(EXECUTOR).as_posix(),
                                         f"{sorted(wires)} != {sorted(fallback)}"))
    assert not problems, problems


def test_the_shipped_sources_run_without_the_package():
    """Installed as ``BOOTSTRAP`` installs them (by wire name, root's then workers' order) in the
    sandbox's interpreter, isolated and without site-packages so that it cannot import ``codetool``,
    every shipped module executes: none reaches for the package."""
    script = ("import json,sys,types\n"
              "mods=dict(json.loads(sys.stdin.read()))\n"
              "try:\n    import codetool\nexcept ImportError:\n    pass\n"
              "else:\n    raise SystemExit('codetool importable')\n"
              f"for name in {launch.SANDBOX_MODULES!r}:\n"
              "    m=sys.modules[name]=types.ModuleType(name)\n"
              "    exec(compile(mods[name],'<'+name+'>','exec'),m.__dict__)\n"
              "print(sorted(n for n in sys.modules if n.startswith(('sandbox_','codetool'))))")
    proc = subprocess.run([launch.resolve_python("auto"), "-I", "-S", "-c", script],
                          input=launch._sandbox_sources().decode(),
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.replace("'", '"')) == sorted(launch.SANDBOX_MODULES)


def test_the_kernels_host_only_modules_import_only_the_standard_library_and_the_kernel():
    """``kernel/seccomp.py``, ``cgroups.py`` and ``schedstat.py`` are not shipped, but they stand
    below the host like the shipped ones: nothing of ``host/``, ``inside/`` or the API."""
    problems = []
    for relative in sorted(HOST_ONLY_KERNEL):
        for name in _imports(ast.parse((EXECUTOR / relative).read_text(encoding="utf-8"))):
            top = name.split(".")[0]
            standard = top in sys.stdlib_module_names and top != "codetool"
            if not (name.startswith("codetool.executor.kernel.") or standard or name == "__future__"):
                problems.append((relative, name))
    assert not problems, problems
