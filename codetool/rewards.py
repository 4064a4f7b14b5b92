"""Step rewards of CodeTool (Lu et al., ACL 2025) and tool costs of LIT.

- **On-the-spot reward** ``R_spot``: 1 if the candidate step executed without error, else 0.
  A tool call that came back as an error payload (HTTP 500, a timeout, an ``{"error": ...}``
  message) counts as a failure by default, even when the code caught the exception.
- **Latent reward** ``R_latent = alpha^(1 - LR) * beta^(tau / L)`` where LR is the share of
  successful leaves below the step and tau the mean number of steps from it to its leaves
  (docs/DESIGN.md §4; defaults alpha 0.9, beta 0.95, L 20; the public code sums the leaf depths,
  ``trees.tau_mode: sum``). Leaf success is ``codetool.tree.labels.leaf_success`` (default
  ``grounded``: a finish whose answer uses what a successful tool call returned, :func:`grounded_success`). It comes from a :class:`PRMScorer`
  (the trained PRM) or from rollouts (Monte Carlo estimate, see ``codetool.search``). The PRM's
  training labels follow the public code's rule by default (``codetool.tree.labels``): tau never
  decides which sibling is more promising.
- **Tool cost** (LIT): P + D + C per API from a YAML table, plus a dynamic cost of the code that
  packing cannot lower (:func:`code_cost`).
- A step that was **not executed** (:func:`not_executed`: the machine, not the code, failed) has no
  on-the-spot reward; every consumer leaves it out (docs/REWARD_HACKING.md).

Only the formulas and the scorer interface live here; the PRM itself is ``codetool.prm``.
"""

from __future__ import annotations

import ast
import math
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import yaml

from codetool import CodetoolError
from codetool.grounding import answer_uses_results

if TYPE_CHECKING:
    from codetool.executor.result import ToolCall


@dataclass
class PRMItem:
    """One candidate step to score, in the fields of a PRM example (docs/DESIGN.md §3).

    Args:
        query (`str`): the user query.
        tools (`str`): the rendered tool functions shown to the policy.
        history (`list[dict]`): earlier chosen steps, each ``{"code": str, "output": str}``.
        candidate (`str`): the candidate step's code.
        candidate_output (`str`): what executing the candidate printed or raised.
        candidate_plan (`str`, *optional*, defaults to `""`): the candidate reply's plan line (the
            public code's step text before the code), empty for code-only replies.
        step_text, previous_steps, parent_result (`str`, *optional*): what the public CodeTool
            PRM reads (``format.interface: reference``): the candidate's reply with its stop word,
            the earlier steps' replies, and the parent step's output.
    """

    query: str
    tools: str
    history: list[dict] = field(default_factory=list)
    candidate: str = ""
    candidate_output: str = ""
    candidate_plan: str = ""
    step_text: str = ""
    previous_steps: str = ""
    parent_result: str = ""



def grounded_success(answer: str | None, calls: Iterable[ToolCall], tool_names: Collection[str] | None, *,
                     query: str | None = None) -> bool:
    """A grounded success (our default leaf success, issue 14; policy RL's outcome reward): a
    non-empty final answer that *uses* what a successful call of a listed tool on the path returned
    (:func:`codetool.grounding.answer_uses_results`, issue 37: it shares a salient word or number
    with that call's response, beyond what the query, the tool names and the call's own arguments
    already held). A query that offers no tools (``tool_names`` empty) needs the answer only;
    ``tool_names=None`` counts any recorded call.

    Args:
        answer (`str`, *optional*): the ``finish`` answer (``None``: the path did not finish).
        calls (`Iterable[ToolCall]`): the tool calls of the whole path (``name``, ``status``,
            ``response`` and ``arguments`` are read).
        tool_names (`Collection[str]`, *optional*): the functions the query offers.
        query (`str`, *optional*): the user query (its words are not evidence of use).
    """
    text = str(answer or "").strip()
    if not text:
        return False
    if tool_names is not None and not tool_names:
        return True
    listed = [c for c in calls if c.status == "ok" and (tool_names is None or c.name in tool_names)]
    return bool(listed) and answer_uses_results(text, listed, query=query or "", tool_names=tool_names or ())


def not_executed(result) -> bool:
    """Whether ``result`` says nothing about the step's code: the executor could not run it for a
    reason outside the code (``outcome == "not_executed"``, after its bounded retries), or a record
    written before that outcome existed whose ``worker_lost`` says nothing ran (a fork that could not
    start: the host writes that message, a worker cannot report ``worker_lost``). No reward, label,
    SCEP, pass rate or search choice counts such a step as the code's failure (docs/DESIGN.md §5).

    Args:
        result (`ExecutionResult` or `dict`, *optional*): the step's result, or its record
            (``ExecutionResult.to_dict()``); ``None`` (not run yet) gives ``False``.
    """
    get = result.get if isinstance(result, dict) else (lambda key: getattr(result, key, None))
    outcome = get("outcome")
    if outcome == "not_executed":
        return True
    return outcome == "worker_lost" and "nothing ran" in str(get("error_message") or "")


class ScorerFault(CodetoolError):
    """A PRM scorer answered something other than one finite score per item it was given: a fault
    of the scorer (a bug, or a server's bad reply), never of the policy (:func:`machine_failure`)."""


def score_items(scorer: PRMScorer, items: list[PRMItem]) -> list[float]:
    """The latent rewards ``scorer`` gives ``items``, one per item, checked: the search's latent
    PRM value, the rollout value and the RL reward all score through it, so a reply of the wrong
    length is the scorer's fault everywhere, never a score of another step.

    Args:
        scorer (`PRMScorer`): the PRM (local, HTTP client or a test double); called once, and not
            at all for no items.
        items (`list[PRMItem]`): the N candidate steps to score.

    Returns:
        `list[float]`: N scores, item i's at index i, as the scorer gave them (``float``-converted;
        the [0, 1] range is the scorer's promise and not checked here).

    Raises:
        ScorerFault: the scorer returned M != N scores (the message names both counts); a failure
            of the machine (:func:`machine_failure`), never of the policy.
    """
    scores = [float(v) for v in scorer.score(items)] if items else []
    if len(scores) != len(items):
        raise ScorerFault(f"the PRM scorer returned {len(scores)} scores for {len(items)} items")
    return scores


def machine_failure(error: BaseException | str | None) -> bool:
    """Whether ``error``, which ended an episode, a query or a tree, is a failure of the machine and
    not of the policy's code: the one rule the search, the jobs, the trees and the RL rollout apply
    (issue 37; such a unit is ``not_executed``: no reward, label or rate counts it, the summaries
    count it and ``--retry_failed`` runs it again).

    The machine's: a sandbox that could not be started or used (``codetool.executor.ExecutorError``:
    no step's code makes the executor raise, see docs/EXECUTOR.md), a policy or PRM server that
    failed the request after every retry (``codetool.models.remote.ServerFailure``), a PRM scorer
    whose reply does not fit the items (:class:`ScorerFault`). Anything else (an HTTP 400 the
    server answered, a malformed entry, a bug elsewhere, a message string) stays the unit's own.

    Args:
        error (`BaseException`, `str` or `None`): what ended the unit (``None`` or a string:
            ``False``; a caller that knows a string's source decides for itself).
    """
    if not isinstance(error, BaseException):
        return False
    if isinstance(error, ScorerFault):
        return True
    from codetool.executor import ExecutorError  # (lazy: the rewards import neither executor nor HTTP client)
    from codetool.models.remote import ServerFailure

    return isinstance(error, (ExecutorError, ServerFailure))


@runtime_checkable
class PRMScorer(Protocol):
    """Anything that maps candidate steps to latent rewards.

    ``score(items) -> list[float]``: one score in [0, 1] per item, the probability that the step
    is "more promising". Items of one search step share their prefix (query, tools, history), and
    a good implementation computes that prefix once.
    """

    def score(self, items: list[PRMItem]) -> list[float]: ...


class ConstantScorer:
    """A scorer that gives every candidate the same latent reward (tests, "spot only" runs)."""

    def __init__(self, value: float = 0.5):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"ConstantScorer value must lie in [0, 1], got {value}.")
        self.value = value

    def score(self, items: list[PRMItem]) -> list[float]:
        return [self.value] * len(items)


def latent_reward(lr: float, tau: float, *, alpha: float = 0.9, beta: float = 0.95,
                  max_len: float = 20.0) -> float:
    """``alpha^(1 - LR) * beta^(tau / L)``: the CodeTool latent reward (paper, Eq. for R_latent).

    Args:
        lr (`float`): leaf success ratio in [0, 1] (share of successful leaves below the step).
        tau (`float`): steps from the node to its leaves (mean by default, see ``codetool.tree``).
        alpha (`float`, *optional*, defaults to 0.9): penalty base for failing leaves.
        beta (`float`, *optional*, defaults to 0.95): penalty base for long paths.
        max_len (`float`, *optional*, defaults to 20): L, the path-length normaliser.
    Returns:
        A float in (0, 1]; 1 only for LR = 1 and tau = 0.
    Raises:
        ValueError: if ``lr`` is outside [0, 1], ``tau`` is negative or ``max_len`` is not positive.
    """
    if not 0.0 <= lr <= 1.0:
        raise ValueError(f"LR must lie in [0, 1], got {lr}.")
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}.")
    if max_len <= 0:
        raise ValueError(f"L (max_len) must be > 0, got {max_len}.")
    return alpha ** (1.0 - lr) * beta ** (tau / max_len)


def on_the_spot(result, *, tool_error_is_failure: bool = True) -> float:
    """``R_spot``: 1.0 if the step ran cleanly, else 0.0 (CodeTool's on-the-spot reward).

    Args:
        result (`ExecutionResult`): the executed candidate (``ok`` and ``tool_calls``, each with a
            ``status``).
        tool_error_is_failure (`bool`, *optional*, defaults to `True`): whether a tool call that
            returned an error payload makes the step a failure even if the code caught it.
    """
    if not result.ok:
        return 0.0
    if tool_error_is_failure and any(c.status != "ok" for c in result.tool_calls):
        return 0.0
    return 1.0

DYNAMIC_LINES = 50  # what a site of code the cost model cannot read adds: 50 lines and one package
EXEC_NAMES = frozenset({"exec", "eval", "compile"})
IMPORT_NAMES = frozenset({"__import__", "import_module"})
# Names and attributes that reach code or modules by computed value, or the interpreter's internals.
DYNAMIC_NAMES = frozenset({"__builtins__", "globals", "vars", "locals", "__loader__", "__spec__"})
PLAIN_DUNDERS = frozenset({"__name__", "__doc__", "__class__", "__module__", "__qualname__"})
# Modules whose job is to run code or programs given as data (a pickle, a string, a command line),
# or to hand out a function by its name (``builtins`` itself, ``pydoc.locate``, ``pkgutil.resolve_name``):
# importing one is a site the cost model cannot read.
CODE_MODULES = frozenset({"pickle", "_pickle", "marshal", "dill", "cloudpickle", "shelve", "copyreg", "code", "codeop",
                          "runpy", "subprocess", "pty", "multiprocessing", "types", "ctypes", "timeit", "doctest",
                          "pdb", "bdb", "cProfile", "profile", "trace", "zipimport", "imp", "builtins", "__builtin__",
                          "pydoc", "pkgutil"})
# Attributes of a module that run another program, or hand out any loaded module without an import.
RUNNING_ATTRIBUTES = {"os": frozenset({"system", "popen", "execl", "execle", "execlp", "execlpe", "execv", "execve",
                                       "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv",
                                       "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp"}),
                      "sys": frozenset({"modules"})}
_MAX_NESTING = 4


@dataclass
class _Size:
    """What :func:`code_cost` counts: lines, statements (and ``:=``), packages, unreadable sites."""

    lines: int = 0
    statements: int = 0
    packages: set[str] = field(default_factory=set)
    dynamic: int = 0

    def add_package(self, name: str) -> None:
        self.packages.add(name.split(".")[0])
        self.dynamic += name.split(".")[0] in CODE_MODULES


@dataclass
class _Scope:
    """What the step's imports bind: ``modules`` (local name -> module: ``import builtins as b``) and
    ``names`` (local name -> ``module.attribute``: ``from builtins import exec as run``)."""

    modules: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def module(self, name: str) -> str:
        return self.modules.get(name, name)


def code_cost(code: str) -> float:
    """Dynamic cost of a code step (LIT): ``sqrt(lines) * max(imported_packages, 1) * 0.5``, costed on
    the code that actually runs, so packing a program cannot lower it (issue 37).

    - ``lines``: the non-blank, non-comment lines, or the statements (each ``:=`` counting as one
      more) when there are more of those (``a = 1; b = 2`` on one line is two);
    - ``imported_packages``: the distinct top-level modules imported (``import a.b`` and ``from a
      import b`` both count ``a``; ``__import__('a')`` and ``importlib.import_module('a')`` too);
    - code run by ``exec``/``eval``/``compile`` from a string the step spells out (a literal, a
      concatenation of literals, or a name the step binds once, to one) is costed as part of the step,
      its lines and packages added (nested up to 4 levels); the imports are followed, so
      ``from builtins import exec as run`` and ``import builtins as b`` reach the same rule;
    - every site the cost model cannot read (``exec`` of a computed string or an alias of it,
      ``__import__`` of a computed name, ``getattr`` of a computed or code-running name,
      ``__builtins__``/``globals()``/``vars()``, attributes such as ``__globals__``, ``__code__``,
      ``__subclasses__``; an import of a module that runs code given as data or hands out a function
      by name, :data:`CODE_MODULES`: ``pickle``, ``marshal``, ``subprocess``, ``runpy``, ``code``,
      ``builtins`` (``operator.attrgetter('exec')(builtins)``), ``pydoc``...; ``os.system``, ``os.exec*``,
      ``os.spawn*``, ``os.popen``; ``sys.modules``, which hands out a loaded module without an import)
      adds :data:`DYNAMIC_LINES` lines and one package.

    Limits: a module reached as an attribute of another (``json.decoder.re`` is ``re``) is not counted
    as a package; a module outside :data:`CODE_MODULES` that runs code from data or resolves a name
    (``logging.config``'s ``"()"`` factories) is costed as plain code; the code is read with the
    host's grammar, so a sandbox interpreter newer than the host's (``executor.python``) could run a
    step the cost cannot parse, which then costs its lines alone (docs/REWARD_HACKING.md).

    Args:
        code (`str`): the step's Python source.
    Returns:
        A float >= 0 (0 for empty code). Code that does not parse counts its lines and no imports.
    """
    size = _Size()
    _measure(code, size, 0)
    lines = max(size.lines, size.statements) + DYNAMIC_LINES * size.dynamic
    return math.sqrt(lines) * (max(len(size.packages), 1) + size.dynamic) * 0.5


def _measure(code: str, size: _Size, depth: int) -> None:
    size.lines += sum(1 for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#"))
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return
    bound: dict[str, str] = {}  # names bound once in the step, to a spelled-out string
    scope = _Scope()
    bindings = _bindings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _literal(node.value, bound)
            if text is not None and bindings[node.targets[0].id] == 1:
                bound[node.targets[0].id] = text
        elif isinstance(node, ast.Import):
            scope.modules.update({a.asname: a.name for a in node.names if a.asname})
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            scope.names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        size.statements += isinstance(node, (ast.stmt, ast.NamedExpr))
        if isinstance(node, ast.Import):
            for alias in node.names:
                size.add_package(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            size.add_package(node.module)
            running = RUNNING_ATTRIBUTES.get(node.module, frozenset())
            size.dynamic += sum(a.name in running for a in node.names)
        elif isinstance(node, ast.Call):
            _measure_call(node, size, bound, scope, depth)
        elif isinstance(node, ast.Name) and node.id in DYNAMIC_NAMES:
            size.dynamic += 1
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr not in PLAIN_DUNDERS:
            size.dynamic += 1
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.attr in RUNNING_ATTRIBUTES.get(scope.module(node.value.id), frozenset()):
            size.dynamic += 1
        elif _runner(node, scope) and id(node) not in called:
            size.dynamic += 1  # exec, eval, __import__... taken as a value (an alias)


def _bindings(tree: ast.AST) -> Counter[str]:
    """How many times each name is bound anywhere in ``tree`` (assigned, augmented, a loop, ``with``,
    ``except`` or ``:=`` target, a parameter, an import, a ``def``/``class``, a ``match`` capture,
    deleted): a name bound more than once may not hold the string its first binding spelled out."""
    names: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names[node.id] += 1
        elif isinstance(node, ast.arg):
            names[node.arg] += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] += 1
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names[node.name] += 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update({n: 2 for n in node.names})  # bound elsewhere too
    return names


def _runner(func: ast.AST, scope: _Scope) -> str | None:
    """The name of the code-running or importing builtin ``func`` refers to (``exec``,
    ``builtins.eval``, ``importlib.import_module``, or a name an import bound to one), else ``None``."""
    if isinstance(func, ast.Name):
        module, _, name = scope.names.get(func.id, f"builtins.{func.id}").rpartition(".")
        if (module == "builtins" and name in EXEC_NAMES | IMPORT_NAMES) or (module, name) == ("importlib", "import_module"):
            return name
        return None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module = scope.module(func.value.id)
        if module in ("builtins", "__builtins__") and func.attr in EXEC_NAMES | {"__import__"}:
            return func.attr
        if module == "importlib" and func.attr == "import_module":
            return func.attr
    return None


def _measure_call(node: ast.Call, size: _Size, bound: dict[str, str], scope: _Scope, depth: int) -> None:
    if getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
        attr = _literal(node.args[1], bound)
        size.dynamic += attr is None or attr in EXEC_NAMES | IMPORT_NAMES | DYNAMIC_NAMES
        return
    name = _runner(node.func, scope)
    if name is None:
        return
    arg = node.args[0] if node.args else None
    if isinstance(arg, ast.Call) and _runner(arg.func, scope) == "compile":
        return  # exec(compile(...)): the inner compile is costed on its own
    text = None if arg is None else _literal(arg, bound)
    if text is None or depth >= _MAX_NESTING:
        size.dynamic += 1
    elif name in IMPORT_NAMES:
        size.add_package(text)
    else:
        _measure(text, size, depth + 1)


def _literal(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The string ``node`` spells out (a str/bytes literal, ``+`` of such, a name bound to one), else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value if isinstance(node.value, str) else node.value.decode("utf-8", "replace")
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, bound), _literal(node.right, bound)
        return None if left is None or right is None else left + right
    return None


@dataclass
class ToolCostTable:
    """P + D + C cost per API (LIT), from ``codetool/resources/tool_costs.yaml`` or a user file.

    ``api_cost(api)`` takes an ``APISpec`` (or any object with ``category``, ``tool``, ``api`` and
    ``parameters``) and returns P + D + C: defaults, raised for model-backed APIs, and exact
    overrides keyed ``"<tool>"`` or ``"<tool>/<api>"``.
    """

    table: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path | None = None) -> ToolCostTable:
        """Read a cost table; ``None`` means the packaged default.

        Raises:
            CodetoolError: if the file is missing or lacks the ``defaults`` mapping.
        """
        if path is None:
            text = resources.files("codetool").joinpath("resources/tool_costs.yaml").read_text()
            where = "the packaged tool_costs.yaml"
        else:
            if not Path(path).is_file():
                raise CodetoolError(f"tool cost table not found: {path}. Copy "
                                    f"codetool/resources/tool_costs.yaml and edit it, or leave the setting empty.")
            text, where = Path(path).read_text(), str(path)
        table = yaml.safe_load(text) or {}
        if not isinstance(table.get("defaults"), dict):
            raise CodetoolError(f"{where}: a tool cost table needs a 'defaults' mapping with P, D and C.")
        return cls(table)

    def is_model_backed(self, api) -> bool:
        spec = self.table.get("model_backed") or {}
        if getattr(api, "category", "") in set(spec.get("categories", [])):
            return True
        name = f"{getattr(api, 'tool', '')} {getattr(api, 'api', '')}".lower()
        return any(k in name for k in spec.get("name_keywords", []))

    def api_cost(self, api) -> float:
        """P + D + C of one API (a float >= 0)."""
        d = self.table["defaults"]
        p, dd = float(d.get("P", 1.0)), float(d.get("D", 1.0))
        params = list(getattr(api, "parameters", []) or [])
        required = sum(1 for x in params if getattr(x, "required", False))
        c = (float(d.get("C", 1.0)) + required * float(d.get("per_required_parameter", 0.0))
             + (len(params) - required) * float(d.get("per_optional_parameter", 0.0)))
        if self.is_model_backed(api):
            mb = self.table.get("model_backed") or {}
            p, dd = float(mb.get("P", p)), float(mb.get("D", dd))
        overrides = self.table.get("overrides") or {}
        for key in (getattr(api, "tool", ""), f"{getattr(api, 'tool', '')}/{getattr(api, 'api', '')}"):
            o = overrides.get(key) or {}
            p, dd, c = float(o.get("P", p)), float(o.get("D", dd)), float(o.get("C", c))
        return p + dd + c


def step_cost(code: str, called_apis: list, table: ToolCostTable) -> float:
    """Cost of a step: ``code_cost(code)`` plus the P + D + C of every API call it made.

    Args:
        called_apis (`list`): the ``APISpec`` of each call, one entry per call (repeats count).
    """
    return code_cost(code) + sum(table.api_cost(api) for api in called_apis)
