"""The packaged prompt texts (``codetool/prompts/<name>.txt``) and the one way to fill them.

- :func:`load` reads a prompt file verbatim (cached; UTF-8).
- :func:`fill` replaces each ``{name}`` placeholder of a template in one pass: a value that itself
  contains ``{name}`` is left as it is. It refuses a placeholder without a value and a value
  without a placeholder, naming the prompt and the placeholder, so a renamed field fails at once
  instead of sending ``{query}`` to a model.
- :func:`render` is the two together: ``render("policy_user", query=q)``.

A placeholder is an identifier in braces (``{query}``, ``{answer_a}``); every other brace is text,
so the JSON examples of the judge prompts (``{"answer_status": ...}``) need no escaping. There is no
``{{`` escape: a prompt that must show ``{name}`` literally cannot be filled here.

Not handled here: prompts read from a user's own checkout of a reference (StableToolBench's judge
templates, CodeTool's final-answer texts), which keep their authors' ``str.format`` rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

from codetool import CodetoolError

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def path_of(name: str) -> str:
    """How errors and docs name the prompt ``name``: ``codetool/prompts/<name>.txt``."""
    return f"codetool/prompts/{name}.txt"


@cache
def load(name: str) -> str:
    """The text of ``codetool/prompts/<name>.txt``, verbatim (final newline included).

    Raises:
        CodetoolError: no such prompt file (the message lists the ones there are).
    """
    file = resources.files(__name__).joinpath(f"{name}.txt")
    if not file.is_file():
        known = sorted(p.name[:-4] for p in resources.files(__name__).iterdir() if p.name.endswith(".txt"))
        raise CodetoolError(f"no prompt {path_of(name)}; the prompts are: {', '.join(known)}.")
    return file.read_text(encoding="utf-8")


def placeholders(template: str) -> list[str]:
    """The placeholder names of ``template`` in order of first appearance."""
    return list(dict.fromkeys(PLACEHOLDER.findall(template)))


def fill(template: str, fields: Mapping[str, object], *, source: str = "the prompt") -> str:
    """``template`` with each ``{name}`` replaced by ``str(fields[name])``, in one pass.

    Args:
        template (`str`): the prompt text (:func:`load`'s, possibly stripped).
        fields (`Mapping[str, object]`): one value per placeholder, no more.
        source (`str`, *optional*, defaults to `"the prompt"`): named in errors (the prompt file).
    Raises:
        CodetoolError: a placeholder has no value, or a value has no placeholder.
    """
    wanted = placeholders(template)
    missing = [name for name in wanted if name not in fields]
    if missing:
        raise CodetoolError(f"{source}: placeholder {{{missing[0]}}} has no value (given: "
                            f"{', '.join(sorted(fields)) or 'none'}); pass {missing[0]}=... or remove it "
                            "from the prompt.")
    unknown = sorted(set(fields) - set(wanted))
    if unknown:
        raise CodetoolError(f"{source}: no placeholder {{{unknown[0]}}} in the prompt (its placeholders: "
                            f"{', '.join(wanted) or 'none'}); drop the value or add the placeholder.")
    return PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]), template)


def render(name: str, /, **fields: object) -> str:
    """:func:`fill` of :func:`load` ``(name)``; errors name ``codetool/prompts/<name>.txt``."""
    return fill(load(name), fields, source=path_of(name))
