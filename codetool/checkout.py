"""Texts read at run time from the user's own checkout of a reference repository.

Reference prompts and word lists are never copied into this repository: a reference mode that
wants the exact text reads it from a checkout the user points to (a setting, else one environment
variable per reference repository, :data:`CHECKOUT_ENV`: ``$CODETOOL_CODETOOL_DIR`` for a clone of
LimOkii/CodeTool, read by the final answers and the CodeTool judge prompts;
``$CODETOOL_STABLETOOLBENCH_DIR`` for a clone of THUNLP-MT/StableToolBench, read by its judge
prompts), with :mod:`ast`, so nothing in that file is executed. Without a checkout the final
answers use our own texts, written for the same purpose, and say so; the judge prompts stop with
a one-line error (:mod:`codetool.judge.reference_prompts`).

Only module-level assignments of literals are read (strings, lists of strings), and the
string literals of a function's ``{"role": ..., "content": ...}`` dicts.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

from codetool import CodetoolError

# reference repository -> (its public address, the environment variable naming the user's clone)
REPOS = {"codetool": "https://github.com/LimOkii/CodeTool",
         "stabletoolbench": "https://github.com/THUNLP-MT/StableToolBench"}
CHECKOUT_ENV = {"codetool": "CODETOOL_CODETOOL_DIR", "stabletoolbench": "CODETOOL_STABLETOOLBENCH_DIR"}
CODETOOL_REPO = REPOS["codetool"]


def checkout_setting(repo: str, setting: str | None = None) -> tuple[str, str]:
    """``(value, where)``: the checkout of ``repo`` named by ``setting``, else by its environment
    variable (:data:`CHECKOUT_ENV`), and how it was named, for messages (``""``, ``""`` when neither)."""
    if setting and setting.strip():
        return setting.strip(), "the setting"
    value = os.environ.get(CHECKOUT_ENV[repo], "").strip()
    return value, (f"${CHECKOUT_ENV[repo]}" if value else "")


def reference_dir(setting: str | None, repo: str = "codetool") -> Path | None:
    """The user's checkout of ``repo``: ``setting`` if given, else ``$CODETOOL_CODETOOL_DIR``
    (``$CODETOOL_STABLETOOLBENCH_DIR`` for ``stabletoolbench``), else ``None``.

    Raises:
        CodetoolError: the folder named does not exist.
    """
    value, _ = checkout_setting(repo, setting)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise CodetoolError(f"reference checkout {path} not found; clone {REPOS[repo]} there, or unset "
                            f"the setting and ${CHECKOUT_ENV[repo]} to use our own texts.")
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
