"""Judge prompts read at run time from the user's own checkout of StableToolBench or CodeTool.

``judge.prompts: ours`` (the default) uses codetool's own prompts (``codetool/prompts/judge_*.txt``).
The two reference settings read the wording of the published judges from a checkout the user
cloned; none of it is copied into this repository:

- ``stabletoolbench`` (https://github.com/THUNLP-MT/StableToolBench): the evaluator folder
  ``toolbench/tooleval/evaluators/<evaluator>/`` (default ``tooleval_gpt-3.5-turbo_default``, the
  one ``eval_pass_rate.py`` and ``eval_preference.py`` load): ``config.yaml`` names the template
  file (``prompt_template``) and lists the functions the judge is forced to call
  (``completions_kwargs.functions``); the template holds one ``<function><name>N</name>
  <description>TEXT</description></function>`` block per function, TEXT filled by ``str.format``.
  Used: ``check_answer_status`` (``{query}``, ``{answer}``: the final answer),
  ``parse_answer_status`` (``{query}``, ``{answer}``: the whole answer as JSON) and
  ``select_better_answer`` (``{query}``, ``{answer_0}``, ``{answer_1}``; the reply is an
  ``index``). ``check_task_solvable`` is not used: its answer never changes a label (the
  comparison prompt does not read it).
- ``codetool`` (https://github.com/LimOkii/CodeTool): ``eval/utils.py``, read with ``ast`` (never
  imported or run): the instruction ``EVAL_INST_V2`` (``run_pass_rate.sh`` passes
  ``--inst_version v2``; ``judge.codetool_instruction: v1`` takes ``EVAL_INST_V1``), the forced
  function ``eval_tool`` and the ids ``Filter_Map`` leaves out of each test set; ``eval/config.yaml``
  gives the judge model and temperature.

The checkout is ``judge.reference_dir``, else the environment variable of that repository
(``$CODETOOL_STABLETOOLBENCH_DIR`` or ``$CODETOOL_CODETOOL_DIR``, :data:`codetool.checkout.CHECKOUT_ENV`;
the CodeTool one is also where ``answer.final_answer: reference`` reads its texts). Without one (or
without the files in it) the command stops with a one-line :class:`ConfigError` that says where to
get it.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from codetool.checkout import CHECKOUT_ENV, REPOS, checkout_setting
from codetool.config import ConfigError

PROMPT_SETS = ("ours", "stabletoolbench", "codetool")
SOURCES = REPOS  # the repository each reference prompt set is read from
STB_EVALUATOR = "tooleval_gpt-3.5-turbo_default"
# our task name -> (StableToolBench function, the field its reply carries)
_STB_TASKS = {"answer": ("check_answer_status", "answer_status"),
              "trajectory": ("parse_answer_status", "answer_status"),
              "compare_details": ("select_better_answer", "index")}
# What StableToolBench's function_call adds to a function's parameters when it asks for a reason.
_REASON = {"type": "string", "description": "explain your answer."}


@dataclass
class ReferencePrompt:
    """One judge call of a reference: its template and the function the judge must call.

    Args:
        task (`str`): ours: ``answer`` (final answer), ``trajectory`` (whole answer) or
            ``compare_details`` (two whole answers).
        template (`str`): filled with ``str.format`` as the reference fills it.
        function (`dict`): the function schema (``name``, ``description``, ``parameters``).
        value_field (`str`): the reply's field: ``answer_status`` or ``index``.
        adds_reason (`bool`): the reference adds a required ``reason`` to the schema on calls
            that ask for one (StableToolBench); ``False`` when the schema already has it (CodeTool).
        source (`str`): the file it was read from.
    """

    task: str
    template: str
    function: dict[str, Any]
    value_field: str
    adds_reason: bool = True
    source: str = ""

    def render(self, **fields: str) -> str:
        """The template filled with ``fields`` (``str.format``, as the reference does).

        Raises:
            ConfigError: the template names a field this call does not fill.
        """
        try:
            return self.template.format(**fields)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"{self.source}: the {self.function.get('name')} template needs a field codetool "
                              f"does not fill ({type(e).__name__}: {e}); is this the reference's file?") from None

    def tool(self, reason: bool = True) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this call; ``reason`` adds the required ``reason`` field
        where the reference adds it."""
        function = copy.deepcopy(self.function)
        if reason and self.adds_reason:
            params = function.setdefault("parameters", {"type": "object", "properties": {}})
            params.setdefault("required", []).append("reason")
            params.setdefault("properties", {})["reason"] = dict(_REASON)
        return {"type": "function", "function": function}


@dataclass
class ReferencePrompts:
    """The prompts of one reference judge, read from a checkout.

    Args:
        kind (`str`): ``stabletoolbench`` or ``codetool``.
        root (`str`): the checkout.
        prompts (`dict[str, ReferencePrompt]`): by task (see :class:`ReferencePrompt`).
        settings (`dict`): the reference's own judge settings (``model``, ``temperature``,
            ``max_tokens`` where it sets them), for the comparability block.
        filter_ids (`dict[str, list[str]]`): CodeTool's ``Filter_Map``: per test set (its spelling,
            e.g. ``G1_Instruction``) the query ids its pass rate skips.
    """

    kind: str
    root: str
    prompts: dict[str, ReferencePrompt]
    settings: dict[str, Any] = field(default_factory=dict)
    filter_ids: dict[str, list[str]] = field(default_factory=dict)

    def filtered(self, group: str | None) -> list[str] | None:
        """CodeTool's filter ids of ``group`` (matched case-insensitively), or ``None``."""
        for name, ids in self.filter_ids.items():
            if group and name.lower() == group.lower():
                return list(ids)
        return None


def reference_dir(kind: str, configured: str = "") -> Path:
    """The checkout for ``kind``: ``configured``, else ``$CODETOOL_STABLETOOLBENCH_DIR`` /
    ``$CODETOOL_CODETOOL_DIR`` (:data:`codetool.checkout.CHECKOUT_ENV`).

    Raises:
        ConfigError: neither names an existing folder (the message says where to get one).
    """
    raw, how = checkout_setting(kind, configured)
    where = (f"--judge.reference_dir {raw}" if how == "the setting" else f"{how}={raw}") if raw else ""
    if not raw or not Path(raw).expanduser().is_dir():
        found = f"{where} is not a folder" if where else "no checkout was given"
        raise ConfigError(f"judge.prompts {kind} reads the judge's prompts from your own checkout of {SOURCES[kind]} "
                          f"({found}): git clone it and pass --judge.reference_dir DIR or set {CHECKOUT_ENV[kind]}.")
    return Path(raw).expanduser()


def _missing(kind: str, root: Path, path: Path) -> ConfigError:
    return ConfigError(f"judge.prompts {kind}: {path} not found in the checkout {root}; pass the root of a clone of "
                       f"{SOURCES[kind]} as --judge.reference_dir (or {CHECKOUT_ENV[kind]}).")


def load_stabletoolbench(root: Path, evaluator: str = STB_EVALUATOR) -> ReferencePrompts:
    """StableToolBench's evaluator prompts from ``root`` (see the module docstring).

    Raises:
        ConfigError: a file or a function is missing.
    """
    folder = root / "toolbench" / "tooleval" / "evaluators" / evaluator
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        raise _missing("stabletoolbench", root, config_path)
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{config_path}: not valid YAML ({str(e).splitlines()[0]}).") from None
    template_path = folder / str(config.get("prompt_template", "template.txt"))
    if not template_path.is_file():
        raise _missing("stabletoolbench", root, template_path)
    template = template_path.read_text(encoding="utf-8")
    texts = {}
    for block in re.findall(r"<function>(.*?)</function>", template, re.DOTALL):
        names = re.findall(r"<name>(.*?)</name>", block, re.DOTALL)
        description = re.findall(r"<description>(.*?)</description>", block, re.DOTALL)
        if names and description:
            texts[names[0]] = description[0]
    kwargs = config.get("completions_kwargs") or {}
    schemas = {f.get("name"): f for f in kwargs.get("functions") or [] if isinstance(f, dict)}
    prompts = {}
    for task, (name, value_field) in _STB_TASKS.items():
        if name not in texts or name not in schemas:
            raise ConfigError(f"judge.prompts stabletoolbench: {template_path} or {config_path} has no function "
                              f"{name!r}; pass the root of a clone of {SOURCES['stabletoolbench']}.")
        prompts[task] = ReferencePrompt(task, texts[name], copy.deepcopy(schemas[name]), value_field, True,
                                        str(template_path))
    settings = {k: kwargs[k] for k in ("model", "temperature", "max_tokens") if k in kwargs}
    return ReferencePrompts("stabletoolbench", str(root), prompts, settings)


def _assignments(path: Path) -> dict[str, Any]:
    """Module-level ``NAME = <literal>`` assignments of a Python file, read with ``ast`` (never run)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"{path}: not a Python file codetool can read ({e.msg}, line {e.lineno}).") from None
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def load_codetool(root: Path, instruction: str = "v2") -> ReferencePrompts:
    """CodeTool's judge instruction and function from ``root`` (see the module docstring).

    Raises:
        ConfigError: ``eval/utils.py`` or a name in it is missing.
    """
    utils = root / "eval" / "utils.py"
    if not utils.is_file():
        raise _missing("codetool", root, utils)
    values = _assignments(utils)
    name = f"EVAL_INST_{instruction.upper()}"
    tools = (values.get("eval_tool") or {}).get("tools") or []
    if not isinstance(values.get(name), str) or not tools or not isinstance(tools[0], dict):
        raise ConfigError(f"judge.prompts codetool: {utils} lacks {name} or eval_tool; pass the root of a clone of "
                          f"{SOURCES['codetool']}.")
    function = copy.deepcopy(tools[0].get("function") or {})
    prompts = {"answer": ReferencePrompt("answer", values[name], function, "answer_status", False, str(utils))}
    settings: dict[str, Any] = {"instruction": instruction}
    config_path = root / "eval" / "config.yaml"
    if config_path.is_file():
        try:
            config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError:
            config = {}
        settings.update({k: config[k] for k in ("model", "temperature") if isinstance(config, dict) and k in config})
    filters = given if isinstance(given := values.get("Filter_Map"), dict) else {}
    return ReferencePrompts("codetool", str(root), prompts, settings,
                            {str(k): [str(i) for i in v] for k, v in filters.items()})


def load_reference_prompts(kind: str, configured_dir: str = "", *, evaluator: str = STB_EVALUATOR,
                           instruction: str = "v2") -> ReferencePrompts | None:
    """The reference prompts of ``kind`` (``None`` for ``ours``).

    Raises:
        ConfigError: an unknown ``kind``, or no usable checkout (see :func:`reference_dir`).
    """
    if kind == "ours":
        return None
    if kind not in SOURCES:
        raise ConfigError(f"judge.prompts must be one of {', '.join(PROMPT_SETS)}, got {kind!r}.")
    root = reference_dir(kind, configured_dir)
    return load_stabletoolbench(root, evaluator) if kind == "stabletoolbench" else load_codetool(root, instruction)
