"""Final answers written after the search, for trajectories that ended without one.

CodeTool (Lu et al., ACL 2025) judges every StableToolBench trajectory on a final answer: when the
policy ran out of steps before calling ``finish``, a model summarises the execution log into an
answer after the search. Without this, an episode that found everything but never called
``finish`` is Unsolved by rule, and a pass rate measures how often the policy remembers to finish
as much as whether it solved the query.

:func:`write_final_answer` does it for one trajectory: the chosen steps (code, tool calls with
their responses, printed output) become an execution log, the model (the policy by default)
writes the answer at temperature 0 from our prompt ``codetool/prompts/final_answer.txt``, and the
trajectory records ``final_answer`` and ``extra["answer_source"] = "generated"`` (finished ones
read as ``finish``; see :func:`codetool.eval.metrics.answer_source`). ``finish_type`` keeps how
the episode ended. Give-ups get no answer (StableToolBench counts a give-up as Unsolved), nor do
episodes without a step. Every text sent passes through ``codetool.secrets.redact``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from codetool.config import ConfigError, option
from codetool.search.prompt import prompt_text
from codetool.search.records import Trajectory
from codetool.secrets import redact

logger = logging.getLogger(__name__)


@dataclass
class AnswerConfig:
    """When and how a final answer is written after the search (``codetool run --answer.*``)."""

    final_answer: str = option("auto", "write a final answer from the execution log for episodes that ended "
                               "without one (max_steps, error): auto (on for stabletoolbench, as CodeTool does), "
                               "on, or off", choices=["auto", "on", "off"])
    max_new_tokens: int = option(256, "most tokens of a generated final answer")
    max_log_chars: int = option(8000, "the execution log shown to the model is cut to this many characters "
                                "(its end is kept)")

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.max_log_chars < 100:
            raise ConfigError(f"need answer.max_new_tokens >= 1 and answer.max_log_chars >= 100, got "
                              f"{self.max_new_tokens} and {self.max_log_chars}.")

    def enabled(self, benchmark: str | None) -> bool:
        """Whether answers are written for ``benchmark`` (``auto``: StableToolBench only)."""
        return self.final_answer == "on" or (self.final_answer == "auto" and benchmark == "stabletoolbench")


def needs_answer(traj: Trajectory) -> bool:
    """An episode that ended without ``finish`` or ``give_up``, took a step, and has no answer."""
    return (traj.finish_type in ("max_steps", "error") and bool(traj.steps)
            and not (traj.final_answer or "").strip())


def execution_log(traj: Trajectory, max_chars: int = 8000) -> str:
    """The chosen steps of ``traj`` as text: code, each tool call and its response, printed output
    and errors. A log longer than ``max_chars`` keeps its end (the latest results)."""
    lines = []
    for step in traj.steps:
        cand = step.chosen_candidate
        lines.append(f"### Step {step.index + 1}")
        lines.append(f"```python\n{cand.code}\n```" if cand.code else f"(no code) {cand.text[:1000]}")
        for call in cand.result.tool_calls if cand.result is not None else []:
            args = call.arguments
            args = getattr(call, "arguments_text", "") if args is None else json.dumps(args, ensure_ascii=False)
            body = call.response
            body = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
            lines.append(f"tool call {call.name or '?'}({args[:300]}) -> {call.status}: {body[:1500]}")
        result = cand.result
        printed = (result.stdout if result is not None else "") or step.observation
        if printed:
            lines.append(f"printed: {printed[:1500]}")
        if result is not None and result.error_type:
            lines.append(f"error: {result.error_type}: {str(result.error_message or '')[:300]}")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = f"[{len(text) - max_chars} earlier characters left out]\n" + text[-max_chars:]
    return redact(text)


def answer_messages(traj: Trajectory, max_log_chars: int = 8000) -> list[dict[str, str]]:
    """The chat messages that ask for ``traj``'s final answer."""
    fields = {"query": traj.query, "log": execution_log(traj, max_log_chars)}
    text = re.sub(r"\{(query|log)\}", lambda m: fields[m.group(1)], prompt_text("final_answer"))
    return [{"role": "user", "content": redact(text)}]


def write_final_answers(trajs: list[Trajectory], backend, cfg: AnswerConfig | None = None) -> int:
    """Write the final answer of every trajectory in ``trajs`` that :func:`needs_answer`, in one
    ``generate`` call (temperature 0); returns how many were written. A failed call or an empty
    reply leaves its trajectories as they were (logged)."""
    cfg = cfg or AnswerConfig()
    todo = [t for t in trajs if needs_answer(t)]
    if not todo:
        return 0
    try:
        batch = backend.generate([answer_messages(t, cfg.max_log_chars) for t in todo], n=1, temperature=0.0,
                                 top_p=1.0, max_new_tokens=cfg.max_new_tokens)
    except Exception as e:  # the search results stand without answers; the report shows the count
        logger.warning("writing %d final answers failed (%s: %s)", len(todo), type(e).__name__, e)
        return 0
    written = 0
    for traj, [completion] in zip(todo, batch):
        answer = redact(completion.text.strip())
        if not answer:
            logger.warning("query %s: the model wrote an empty final answer", traj.query_id)
            continue
        traj.final_answer = answer
        traj.extra["answer_source"] = "generated"
        traj.prompt_tokens += completion.prompt_tokens
        traj.completion_tokens += completion.completion_tokens
        written += 1
    return written


def write_final_answer(traj: Trajectory, backend, cfg: AnswerConfig | None = None) -> bool:
    """:func:`write_final_answers` for one trajectory; returns whether an answer was written."""
    return write_final_answers([traj], backend, cfg) == 1
