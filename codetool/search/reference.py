"""Steps as the public CodeTool code runs them: its program, its status and its output.

The public code never runs a step in the state its parent left. It builds one program per step
and runs it in a fresh interpreter (CodeTool ``src/engine.py`` ``PythonExecNet.run`` on the
programs of ``src/data_process.py`` and ``infer/step_infer.py``):

- the **program** of a first step is all its ```` ```python ```` blocks joined by newlines; of a
  later step, the first block of every earlier step with each ``print(...)`` call replaced by
  ``pass`` (:func:`strip_prints`), then the step's own first block. A reply without a
  ```` ```python ```` block (a bare ```` ``` ```` fence included) has no program;
- its **status**: 1 if the program raised (or does not compile), else 2 if what it printed
  contains ``Function executing from`` (StableToolBench's text for a tool function that failed;
  any case), else 0. Its **output** (``res``): what it printed, or the exception as
  ``Exception Type: <class>, Exception Value: <message>``, stripped;
- tools answer failures as values: a call that failed with an error payload (``api_error``)
  returns ``{"error": ..., "response": ...}`` instead of raising, and ``finish(x)`` /
  ``give_up(x)`` print ``x`` (the public code's last step prints its answer).

So an error outside a print repeats in every later step, an error inside a print does not, and a
printed error payload without the marker is no failure. ``trees.label_rule: reference``
(:mod:`codetool.tree.reference`), SCEP as the public code counts it and
``answer.final_answer: reference`` read these statuses and outputs.

:class:`ReferenceRunner` runs such programs in our sandbox (:mod:`codetool.executor`): one
executor per tree or trajectory, a fork of its clean state per program, the tools answering
through :class:`ReferenceTools` (each distinct call made once per runner). The program runs
as the public code wraps it: indented by one tab inside a ``try`` block with the output captured,
after ``import json`` and ``headers``; an exception is caught there, anything else (a syntax
error, ``SystemExit``, a timeout of our executor) is status 1.

Limits: the output of a program that does not compile is our executor's error text (the public
code stores execnet's remote traceback); our sandbox's time and memory limits apply (the public
code has none); a call that fails other than with an error payload (a timeout, unknown
arguments) still raises, as a failed request or a ``TypeError`` would there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from codetool import CodetoolError
from codetool.rewards import not_executed
from codetool.tools.spec import ToolResponse

logger = logging.getLogger(__name__)

PYTHON_BLOCK = re.compile(r"```python(.*?)```", re.DOTALL)  # what the public code counts as code
_FLAT = r"[^()]*"
# print(...) with at most one level of parentheses inside (as the public code's pattern matches);
# a call with deeper nesting stays as it is
PRINT_CALL = re.compile(rf"print\({_FLAT}(?:\({_FLAT}\))*{_FLAT}\)")
MARKER = "function executing from"
STATUS_OK, STATUS_RAISED, STATUS_MARKER = 0, 1, 2
MAX_OUTPUT_CHARS = 20000
TRUNCATION_NOTE = "\n[output truncated: only the first"  # what our executor appends to a cut output

_PRELUDE = """\
import io as _ref_io, json as _ref_json, sys as _ref_sys
import json, sys
try:
    import requests
except Exception:
    pass
headers = {'accept': 'application/json', 'Content-Type': 'application/json'}


def finish(answer):
    print(answer)


def give_up(reason=''):
    print(reason)
"""


def python_blocks(text: str | None) -> list[str]:
    """The ```` ```python ```` blocks of a reply, as captured (surrounding newlines kept)."""
    return PYTHON_BLOCK.findall(text or "")


def strip_prints(code: str) -> str:
    """``code`` with every ``print(...)`` call replaced by ``pass`` (a call whose arguments nest
    parentheses two levels deep is left alone, as in the public code)."""
    return PRINT_CALL.sub("pass", code)


def step_program(earlier: list[str], blocks: list[str]) -> str:
    """The program of a step: ``earlier`` (the print-stripped first blocks of the steps before
    it) then its first block; with nothing earlier, all its ``blocks``. Stripped."""
    if not earlier:
        return "\n".join(blocks).strip()
    return ("\n".join(earlier) + "\n" + blocks[0]).strip()


def chosen_programs(texts: list[str]) -> list[str | None]:
    """The programs of a search trajectory's chosen steps (``texts``: each chosen reply), ``None``
    for a reply without a ```` ```python ```` block. As the public search does, such a step still
    adds an (empty) entry to the history, so the next step runs only its first block."""
    earlier: list[str] = []
    out: list[str | None] = []
    for text in texts:
        blocks = python_blocks(text)
        out.append(step_program(earlier, blocks) if blocks else None)
        earlier.append(strip_prints(blocks[0]) if blocks else "")
    return out


def _as_run(program: str) -> str:
    """What the public code's runner makes of a program before it runs it: the first fenced
    block inside it if any, without fences and ``[Python code]``."""
    inner = PYTHON_BLOCK.findall(program)
    body = inner[0] if inner else program
    for token in ("```python", "[Python code]", "```", "``"):
        body = body.replace(token, "")
    return body


def _wrapped(program: str, sentinel: str, limit: int) -> str:
    body = "\n".join("\t" + line for line in _as_run(program).split("\n"))
    return (
        "_ref_keep = _ref_sys.stdout\n"
        "_ref_sys.stdout = _ref_io.StringIO()\n"
        f"try:\n{body}\n"
        "except Exception as _ref_exc:\n"
        "    _ref_sys.stdout, _ref_ran = _ref_keep, False\n"
        "    _ref_kind, _ref_value = type(_ref_exc).__name__, str(_ref_exc)\n"
        "    if _ref_kind == 'ToolError' and getattr(_ref_exc, 'status', '') == 'error':\n"
        "        _ref_kind, _, _ref_value = _ref_value.split(' failed (error): ', 1)[-1].partition(': ')\n"
        "    _ref_text = ' Exception Type: ' + _ref_kind + ', Exception Value: ' + _ref_value\n"
        "else:\n"
        "    _ref_text = _ref_sys.stdout.getvalue()\n"
        "    _ref_sys.stdout, _ref_ran = _ref_keep, True\n"
        "_ref_text = _ref_text.strip()\n"
        f"_ref_marked = {MARKER!r} in _ref_text.lower()\n"
        f"_ref_text = _ref_text[:{int(limit)}]\n"
        # the verdict first, on a line of its own, then the output: a cut output keeps the verdict
        f"print({sentinel!r} + _ref_json.dumps([_ref_ran, _ref_marked, len(_ref_text)]))\n"
        "print(_ref_text)\n")


@dataclass
class ReferenceOutcome:
    """One program's result as the public code records it (its ``exec_res`` entry).

    Args:
        status (`int`): 0 ran, 1 raised (or did not compile), 2 ran but printed the marker.
        res (`str`): what it printed, or the exception text, stripped (cut to the runner's limit).
    """

    status: int
    res: str


class ReferenceTools:
    """A query's tool functions as the public code's programs see them.

    Wraps an environment's host callables (``env.functions()``): an ``api_error`` response
    becomes an ``ok`` one whose content is ``{"error": ..., "response": ...}`` (the payload the
    public code's request returns), and each distinct call (name and arguments) is made once per
    instance, later re-runs reuse its answer. A :class:`~codetool.tools.environment.ToolEnvironment`
    is shadowed by a copy on the same backend, so re-runs do not enter its call log. Every other
    attribute is the wrapped environment's.

    Args:
        env: anything with ``functions() -> {name: callable}``.
    """

    def __init__(self, env):
        from codetool.tools.environment import ToolEnvironment

        if isinstance(env, ToolEnvironment):
            env = ToolEnvironment(env.apis, env.backend, max_response_chars=env.max_response_chars,
                                  render_style=env.render_style)
        self.env = env
        self._answers: dict[str, Any] = {}

    def __getattr__(self, name: str):
        return getattr(self.env, name)

    def functions(self) -> dict[str, Any]:
        return {name: self._wrap(name, func) for name, func in self.env.functions().items()}

    def _wrap(self, name: str, func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            key = json.dumps([name, args, kwargs], sort_keys=True, default=str)
            if key in self._answers:
                return self._answers[key]
            answer = as_payload(func(*args, **kwargs))
            if not (isinstance(answer, ToolResponse) and answer.outage):  # a re-run asks again
                self._answers[key] = answer
            return answer

        return call


def as_payload(response: Any) -> Any:
    """An ``api_error`` :class:`ToolResponse` as the ``ok`` answer ``{"error", "response"}``; any
    other value unchanged."""
    if not isinstance(response, ToolResponse) or response.status != "api_error":
        return response
    content = response.content or ""
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    payload = json.dumps({"error": response.error or "", "response": value}, ensure_ascii=False)
    return dataclasses.replace(response, status="ok", content=payload, error=None)


class ReferenceNotRun(CodetoolError):
    """A reference program the executor could not run (``not_executed``): no status exists for it.
    A tree labelled by ``label_rule: reference`` then becomes an error record (``--retry_failed``
    rebuilds it); a chosen step of a trajectory gets status ``None``, which SCEP leaves out."""


class ReferenceRunner:
    """Runs reference programs (see the module docstring) in forks of one clean sandbox state.

    Args:
        executor (`Executor`): a fresh executor whose tools answer as :class:`ReferenceTools`
            does; closed by :meth:`close`.
        max_chars (`int`, *optional*, defaults to 20000): outputs are cut to this many characters
            (the marker is looked for in the whole output).

    Use :meth:`for_task` to build one from a search task and an executor factory.
    """

    def __init__(self, executor, max_chars: int = MAX_OUTPUT_CHARS):
        self.root, self.max_chars = executor, int(max_chars)
        result = executor.run(_PRELUDE)
        if not result.ok:
            raise RuntimeError(f"the reference runner's prelude failed: {result.error_message}")

    @classmethod
    def for_task(cls, task, make_executor, **kwargs) -> ReferenceRunner:
        """A runner on ``task``'s tools: ``make_executor`` (``task -> Executor``, reading
        ``task.env.functions()``) gets a copy of the task whose tools are :class:`ReferenceTools`."""
        return cls(make_executor(dataclasses.replace(task, env=ReferenceTools(task.env))), **kwargs)

    def run(self, program: str) -> ReferenceOutcome:
        """Run one program in a fork of the clean state; never raises for what the code does.

        Raises:
            ReferenceNotRun: the executor could not run it (a failure of the machine after its
                retries): the public code has no such outcome, so the program gets no status.
        """
        sentinel = f"@@reference-run-{secrets.token_hex(8)}@@"
        fork = self.root.fork()
        try:
            result = fork.run(_wrapped(program, sentinel, self.max_chars))
        finally:
            fork.close()
        if not_executed(result):
            raise ReferenceNotRun(f"a reference program could not be run ({result.error_message or result.outcome}; "
                                  f"{result.attempts} attempts): a failure of the machine, so it has no status")
        if not result.ok:
            return ReferenceOutcome(STATUS_RAISED, exception_text(result))
        stdout = result.stdout or ""
        start = stdout.find(sentinel)
        end = stdout.find("\n", start)
        try:
            ran, marked, length = json.loads(stdout[start + len(sentinel):end]) if start >= 0 and end > 0 else []
        except ValueError:
            return ReferenceOutcome(STATUS_RAISED, stdout.strip()[: self.max_chars])
        text = stdout[end + 1:]
        if result.output_truncated:  # our executor's cap came first: drop its note
            text = text.split(TRUNCATION_NOTE)[0]
        status = STATUS_RAISED if not ran else STATUS_MARKER if marked else STATUS_OK
        return ReferenceOutcome(status, text[:int(length)])

    def close(self) -> None:
        self.root.close()

    def __enter__(self) -> ReferenceRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def exception_text(result) -> str:
    """``Exception Type: X, Exception Value: msg`` from one of our :class:`ExecutionResult`'s
    errors (its first line, without our ``at line N`` locator)."""
    kind = result.error_type or "Error"
    message = (result.error_message or "").split("\n  at line ")[0].split("\n  called from line ")[0]
    if message.startswith(f"{kind}: "):
        message = message[len(kind) + 2:]
    elif message == kind:
        message = ""
    return f"Exception Type: {kind}, Exception Value: {message}"


def reference_output(result) -> str:
    """A step's output in the public code's form from our own run of it (an approximation where
    no reference run exists: no print-stripped re-run, tool errors as our executor raised them):
    what it printed, stripped, or :func:`exception_text`."""
    if result is None:
        return ""
    if not result.ok:
        return exception_text(result)
    return (result.stdout or "").strip()


def reference_steps(traj, runner: ReferenceRunner) -> list[dict[str, Any]]:
    """``{"status", "res"}`` of each chosen step of ``traj`` as the public search records them
    (``StepInfer``'s ``exec_res``): a reply without a ```` ```python ```` block is status 1 with
    no output; otherwise the program's status, the marker (2) folded into 1. A program the executor
    could not run (:class:`ReferenceNotRun`) has status ``None`` and ``not_executed: true`` (SCEP
    leaves it out; the public code has no such step)."""
    return [step_entry(runner, program) for program in chosen_programs(chosen_texts(traj))]


def chosen_texts(traj) -> list[str]:
    """The chosen reply of each step of ``traj``."""
    return [step.chosen_candidate.text or "" for step in traj.steps]


def step_entry(runner: ReferenceRunner, program: str | None) -> dict[str, Any]:
    """One entry of :func:`reference_steps`: the ``{"status", "res"}`` of ``program``."""
    if program is None:
        return {"status": STATUS_RAISED, "res": ""}
    try:
        outcome = runner.run(program)
    except ReferenceNotRun:
        return {"status": None, "res": "", "not_executed": True}
    return {"status": STATUS_OK if outcome.status == STATUS_OK else STATUS_RAISED, "res": outcome.res}


def record_reference_steps(traj, task, make_executor) -> bool:
    """Store :func:`reference_steps` of ``traj`` in ``traj.extra["reference_steps"]`` (one
    sandbox for the trajectory); returns whether it did. A trajectory without steps is left
    alone; a sandbox that cannot start is logged and leaves the trajectory without them."""
    if not traj.steps:
        return False
    try:
        with ReferenceRunner.for_task(task, make_executor) as runner:
            traj.extra["reference_steps"] = reference_steps(traj, runner)
    except Exception as exc:  # noqa: BLE001 - the trajectory stands; its reference SCEP is missing
        rerun_failed(traj, exc)
        return False
    return True


def rerun_failed(traj, exc: BaseException) -> None:
    """Log that the reference re-run of ``traj``'s steps failed with ``exc`` (it has none)."""
    logger.warning("query %s: the reference re-run of its steps failed (%s: %s)", traj.query_id,
                   type(exc).__name__, exc)
