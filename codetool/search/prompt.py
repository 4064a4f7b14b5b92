"""The policy's prompt and the parsing of its replies.

The policy sees a system message (how to work, the rendered tool functions), the query, and the
history of chosen steps as alternating assistant (the step) / user (its observation) messages.
Prompt texts live in ``codetool/prompts/`` (read and filled by :mod:`codetool.prompts`). Two settings shape it (``SearchConfig``):

- ``step_format``: ``step_text`` (the public CodeTool code: a one-line plan in words, then one
  fenced Python block) or ``code_only`` (one fenced block, nothing else; for small models, and
  the only format ``code_prefix`` applies to);
- ``observation_history``: ``last`` (the public code: only the latest step's output is shown,
  earlier steps show their code alone) or ``all`` (every step's output). Each shown output is
  cut to ``max_observation_chars`` (the public code: 500; 1,500 for TMDB).

:func:`visible_history` gives the PRM the same view of the history as the policy.

A reply with no code block is not an error of the search: :func:`parse_candidate` returns
``code=None`` and a short message that the next observation shows to the model.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

from codetool import prompts
from codetool.search.reference import reference_output
from codetool.secrets import redact

if TYPE_CHECKING:
    from codetool.executor.result import ExecutionResult

CODE_PREFIX = "```python\n"  # the opening fence every reply starts with (SearchConfig.code_prefix)
NO_CODE_MESSAGE = ("Your reply had no Python code block. Reply with exactly one block that starts "
                   "with ```python and ends with ```.")
EMPTY_CODE_MESSAGE = ("Your code block held only comments, so nothing ran. Write statements that call the "
                      "functions and print their results.")
STATE_LOST_NOTE = ("Note: the Python session was restarted, so variables, functions and imports "
                   "from earlier steps are gone; define again what you need.")

# An opening fence (```python, ```py, or a bare ```), the code, then a closing fence or the end of
# the text (a reply cut by max_new_tokens still yields its code).
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:\n?```|\Z)", re.DOTALL | re.IGNORECASE)


@dataclass
class ParsedCandidate:
    """``code`` is the first fenced Python block of a reply, or ``None`` with ``error`` set."""

    code: str | None
    error: str | None = None


def parse_candidate(text: str) -> ParsedCandidate:
    """Extract the first fenced Python block of a policy reply.

    Args:
        text (`str`): the raw model output.
    Returns:
        ParsedCandidate: the code (stripped of surrounding blank lines), or ``code=None`` and
        :data:`NO_CODE_MESSAGE` when no block with any code is found (:data:`EMPTY_CODE_MESSAGE`
        when the block holds only comments: a step that runs nothing is no step).
    """
    for match in _FENCE.finditer(text or ""):
        code = match.group(1).strip("\n")
        if code.strip():
            if _only_comments(code):
                return ParsedCandidate(code=None, error=EMPTY_CODE_MESSAGE)
            return ParsedCandidate(code=code)
    return ParsedCandidate(code=None, error=NO_CODE_MESSAGE)


def _only_comments(code: str) -> bool:
    """True when ``code`` parses to no statement at all (blank lines and comments only)."""
    try:
        return not ast.parse(code).body
    except (SyntaxError, ValueError):
        return False  # broken code runs, fails and gets its own error message


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` within ``max_chars``, with a marker in between."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n...[{cut} characters cut]...\n{text[-tail:] if tail else ''}"


# Lines the host writes into an observation; a printed line that starts like one of them is
# marked, so a step cannot make its output read as the host's verdict (issue 27).
HOST_LINES = ("Output:", "Error (", "The step ran and printed nothing.", "Tool calls that failed:",
              STATE_LOST_NOTE[:24], "[output truncated", "...[")
PRINTED_MARK = "(printed) "


def mark_printed(stdout: str) -> str:
    """``stdout`` with :data:`PRINTED_MARK` before each line that imitates a host line: one that starts
    like it once invisible format characters (zero-width spaces, a byte-order mark) are dropped and
    compatibility forms folded (NFKC: a full-width ``Ｏutput:``). A look-alike letter of another
    script (a Cyrillic ``О``) is not caught."""
    return "\n".join(PRINTED_MARK + line if _plain(line).startswith(HOST_LINES) else line
                     for line in stdout.split("\n"))


def _plain(line: str) -> str:
    visible = "".join(ch for ch in line if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFKC", visible).lstrip()


def cut_output(text: str, max_chars: int, cut: str = "middle") -> str:
    """``text`` within ``max_chars``: ``middle`` keeps head and tail (:func:`truncate_middle`),
    ``head`` its first ``max_chars`` characters (the public CodeTool code's ``[0:500]``)."""
    if cut == "head":
        return text[:max_chars] if max_chars > 0 else text
    return truncate_middle(text, max_chars)


def format_observation(result: ExecutionResult | None, *, max_chars: int = 1500, parse_error: str | None = None,
                       cut: str = "middle") -> str:
    """What the policy sees after a step: its output, its error, tool failures, lost state.
    Printed lines that start like the host's own lines are marked (:func:`mark_printed`); the
    executor already removed terminal control sequences from the output.

    Args:
        result (`ExecutionResult` or `None`): what the step's run gave (``None``: nothing ran).
        max_chars (`int`, *optional*, defaults to 1500): cap on the printed output shown.
        parse_error (`str`, *optional*): set when the reply had no code (nothing ran).
        cut (`str`, *optional*, defaults to ``"middle"``): how a longer output is cut (:func:`cut_output`).
    """
    if parse_error:
        return parse_error
    parts = []
    if result is None:
        return "Error (Error): the step failed"
    stdout = (result.stdout or "").rstrip()
    if stdout:
        parts.append("Output:\n" + mark_printed(cut_output(stdout, max_chars, cut)))
    if not result.ok:
        kind = result.error_type or result.outcome or "Error"
        first, newline, rest = (result.error_message or "the step failed").partition("\n")
        # the message of the code's own exception is the code's text: its later lines are marked too
        parts.append(f"Error ({kind}): {first}{newline}{mark_printed(rest) if newline else ''}")
    elif not stdout:
        parts.append("The step ran and printed nothing.")
    failed = [c for c in result.tool_calls if c.status != "ok"]
    if failed and result.ok:
        names = ", ".join(f"{c.name} ({c.status})" for c in failed[:3])
        parts.append(f"Tool calls that failed: {names}.")
    if result.state_lost:
        parts.append(STATE_LOST_NOTE)
    return redact("\n".join(parts))


STEP_FORMATS = ("step_text", "code_only")
OBSERVATION_HISTORIES = ("last", "all")


def shown_observations(history: list[dict], observation_history: str = "all") -> list[str | None]:
    """The observation the policy sees for each history step; ``None`` where it sees none.

    Args:
        history (`list[dict]`): steps with an ``observation`` each.
        observation_history (`str`, *optional*, defaults to ``"all"``): ``all`` shows every
            observation; ``last`` only the latest step's (the public CodeTool code).
    Raises:
        ValueError: on an unknown ``observation_history``.
    """
    if observation_history not in OBSERVATION_HISTORIES:
        raise ValueError(f"observation_history must be one of {OBSERVATION_HISTORIES}, got {observation_history!r}.")
    shown: list[str | None] = [str(step.get("observation") or "") for step in history]
    if observation_history == "last":
        shown = [*[None] * (len(shown) - 1), *shown[-1:]]
    return shown


PLAN_CHARS = 300  # a plan is one line; a longer preamble is cut


def step_plan(text: str | None) -> str:
    """The words a reply wrote before its first code fence (``step_format: step_text``'s one-line
    plan), stripped and cut to :data:`PLAN_CHARS`; ``""`` when the reply opens with the code."""
    head = (text or "").split("```", 1)[0].strip()
    return head[:PLAN_CHARS]


def history_entry(candidate, observation: str) -> dict:
    """One chosen step as a history entry: ``{"code", "text", "observation", "result"}`` (the parsed
    code, the whole reply, the observation shown, and its output in the public code's form for the
    reference PRM interface), the form :func:`policy_messages` and :func:`visible_history` read."""
    return {"code": candidate.code, "text": candidate.text, "observation": observation,
            "result": reference_output(candidate.result) if candidate.code is not None else ""}


def reference_prm_fields(history: list[dict], text: str | None) -> dict[str, str]:
    """What the public CodeTool PRM reads when it scores a candidate reply ``text`` after the
    chosen steps ``history`` (``infer/step_infer.py``): the reply with its stop word, the earlier
    replies with theirs joined by the two characters ``/n`` (as it joins them), and the last
    step's output; secrets of the environment are redacted (an item may travel to a PRM server)."""
    replies = [f"{h.get('text') or ''}[Step {k} Finished]\n" for k, h in enumerate(history, 1)]
    return {"step_text": redact(f"{text or ''}[Step {len(history) + 1} Finished]\n"),
            "previous_steps": redact("/n".join(replies)),
            "parent_result": redact(str(history[-1].get("result") or "")) if history else ""}


def visible_history(history: list[dict], observation_history: str = "all",
                    step_format: str = "code_only") -> list[dict]:
    """The PRM's history: ``{"code", "output"}`` per step, ``output`` being what the policy saw
    (``None`` for an output the policy was not shown, see :func:`shown_observations`), plus, with
    ``step_format='step_text'`` (where the policy sees its earlier replies whole), ``plan`` for a
    step whose reply had a plan line before its code."""
    steps = []
    for step, obs in zip(history, shown_observations(history, observation_history)):
        plan = step_plan(step.get("text")) if step.get("code") and step_format == "step_text" else ""
        steps.append({"code": step.get("code") or "", "output": obs, **({"plan": plan} if plan else {})})
    return steps


def policy_messages(query: str, tools_text: str, history: list[dict], *, step_format: str = "code_only",
                    observation_history: str = "all") -> list[dict[str, str]]:
    """Chat messages for the next step.

    Args:
        query (`str`): the user request.
        tools_text (`str`): rendered tool functions (``ToolEnvironment.render()``).
        history (`list[dict]`): chosen steps so far, each ``{"code": str, "observation": str}``
            (and ``text``, the raw reply); a step with ``code=None`` shows the raw reply that had
            no code; with ``step_format='step_text'`` a step shows its raw reply (plan and code).
        step_format (`str`, *optional*, defaults to ``"code_only"``): ``step_text`` or ``code_only``.
        observation_history (`str`, *optional*, defaults to ``"all"``): ``last`` or ``all``.
    Returns:
        ``[{"role": ..., "content": ...}, ...]`` ending with a user message.
    Raises:
        ValueError: on an unknown ``step_format`` or ``observation_history``.
    """
    if step_format not in STEP_FORMATS:
        raise ValueError(f"step_format must be one of {STEP_FORMATS}, got {step_format!r}.")
    system = prompts.render("policy_system", step_format=prompts.load(f"policy_format_{step_format}").rstrip(),
                            tools=tools_text)
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": prompts.render("policy_user", query=query)}]
    hidden = prompts.load("policy_observation_hidden").rstrip()
    for step, obs in zip(history, shown_observations(history, observation_history)):
        code = step.get("code")
        if code is None or (step_format == "step_text" and step.get("text")):
            reply = step.get("text") or ""
        else:
            reply = f"```python\n{code}\n```"
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": prompts.render("policy_observation",
                                                                   observation=hidden if obs is None else obs)})
    return [{"role": m["role"], "content": redact(m["content"])} for m in messages]
