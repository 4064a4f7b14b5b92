"""Texts read at run time from the user's own checkout of a reference repository.

Reference prompts and word lists are never copied into this repository: a reference mode that
wants the exact text reads it from a checkout the user points to (a setting, or the environment
variable :data:`REFERENCE_DIR_ENV`), with :mod:`ast`, so nothing in that file is executed. Without
a checkout the reference modes use our own texts, written for the same purpose, and say so.

Only module-level assignments of literals are read (strings, lists of strings), and the
string literals of a function's ``{"role": ..., "content": ...}`` dicts.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from codetool import CodetoolError

REFERENCE_DIR_ENV = "CODETOOL_REFERENCE_DIR"  # a checkout of LimOkii/CodeTool
CODETOOL_REPO = "https://github.com/LimOkii/CodeTool"


def reference_dir(setting: str | None) -> Path | None:
    """The CodeTool checkout: ``setting`` if given, else ``$CODETOOL_REFERENCE_DIR``, else ``None``.

    Raises:
        CodetoolError: the folder named does not exist.
    """
    value = (setting or os.environ.get(REFERENCE_DIR_ENV, "")).strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise CodetoolError(f"reference checkout {path} not found; clone {CODETOOL_REPO} there, or unset "
                            f"the setting and ${REFERENCE_DIR_ENV} to use our own texts.")
    return path


def _tree(checkout: Path, relative: str) -> ast.Module:
    path = checkout / relative
    if not path.is_file():
        raise CodetoolError(f"{path} not found in the reference checkout {checkout}; it needs {relative} "
                            f"(a checkout of {CODETOOL_REPO}).")
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as e:
        raise CodetoolError(f"{path}: cannot be read as Python ({type(e).__name__}); check the checkout.") from None


def module_literals(checkout: Path, relative: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values of the module-level assignments ``names`` in ``checkout/relative``.

    Raises:
        CodetoolError: the file is missing or a name is not assigned a literal there.
    """
    found: dict[str, Any] = {}
    for node in _tree(checkout, relative).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in names:
                try:
                    found[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    missing = [n for n in names if n not in found]
    if missing:
        raise CodetoolError(f"{checkout / relative}: no literal {', '.join(missing)} there; the checkout is not "
                            f"the version codetool reads ({CODETOOL_REPO}).")
    return found


def message_literals(checkout: Path, relative: str, function: str) -> dict[str, str]:
    """``role -> content`` of the first message dict of each role whose content is a string literal,
    inside ``function`` of ``checkout/relative``.

    Raises:
        CodetoolError: the file or the function is missing.
    """
    for node in ast.walk(_tree(checkout, relative)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            out: dict[str, str] = {}
            for item in ast.walk(node):
                if not isinstance(item, ast.Dict):
                    continue
                fields = {k.value: v for k, v in zip(item.keys, item.values)
                          if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                role, content = fields.get("role"), fields.get("content")
                if (isinstance(role, ast.Constant) and isinstance(content, ast.Constant)
                        and isinstance(content.value, str)):
                    out.setdefault(str(role.value), content.value)
            return out
    raise CodetoolError(f"{checkout / relative}: no function {function}(); the checkout is not the version "
                        f"codetool reads ({CODETOOL_REPO}).")
