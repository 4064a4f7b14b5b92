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

``final_answer: reference`` is the public code's procedure (CodeTool
``infer/generate_final_answer.py``): *every* trajectory with a step gets a new answer, finished
and given-up ones included (the ``finish`` answer is kept in ``extra["finish_answer"]``). Per
chosen step, its output (the reference re-run's, ``extra["reference_steps"]``; our run's where
there is none) is dropped when it contains an error-like marker; each remaining step gives what
the step set out to do (its reply's text between ``Step <k>`` and the next ```` ```python ````
in the replies of the path) and its output cut to 3,500 characters. When no step is left, the
model is asked to say that no valid information could be obtained; otherwise a system message and
a summary prompt carry the steps and the query; temperature 0. The texts (prompts and the marker
list) are read from the user's CodeTool checkout when ``answer.reference_dir`` or
``$CODETOOL_CODETOOL_DIR`` names one (``codetool.checkout``), else they are ours
(``codetool/prompts/final_answer_reference*.txt``, :data:`ERROR_MARKERS`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

from codetool import prompts
from codetool.config import ConfigError, option
from codetool.search.records import Trajectory
from codetool.secrets import redact

logger = logging.getLogger(__name__)


@dataclass
class AnswerConfig:
    """When and how a final answer is written after the search (``codetool run --answer.*``)."""

    final_answer: str = option("auto", "write a final answer from the execution log for episodes that ended "
                               "without one (max_steps, error): auto (on for stabletoolbench), on, or off; "
                               "reference: the public CodeTool code's procedure, a new answer for every "
                               "stabletoolbench trajectory from its steps' outputs, error-like ones dropped",
                               choices=["auto", "on", "off", "reference"])
    reference_dir: str = option("", "with final_answer reference: a checkout of LimOkii/CodeTool whose "
                                "infer/generate_final_answer.py gives the prompts and error markers (default: "
                                "$CODETOOL_CODETOOL_DIR; neither: our own texts)")
    max_new_tokens: int = option(256, "most tokens of a generated final answer")
    max_log_chars: int = option(8000, "the execution log shown to the model is cut to this many characters "
                                "(its end is kept)")

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.max_log_chars < 100:
            raise ConfigError(f"need answer.max_new_tokens >= 1 and answer.max_log_chars >= 100, got "
                              f"{self.max_new_tokens} and {self.max_log_chars}.")

    def enabled(self, benchmark: str | None) -> bool:
        """Whether answers are written for ``benchmark`` (``auto``, ``reference``: StableToolBench only)."""
        return self.final_answer == "on" or (self.final_answer in ("auto", "reference")
                                             and benchmark == "stabletoolbench")


def needs_answer(traj: Trajectory, cfg: AnswerConfig | None = None) -> bool:
    """An episode that ended without ``finish`` or ``give_up``, took a step, and has no answer;
    under ``final_answer: reference`` every episode that took a step."""
    if cfg is not None and cfg.final_answer == "reference":
        return bool(traj.steps)
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
    text = prompts.render("final_answer", query=traj.query, log=execution_log(traj, max_log_chars))
    return [{"role": "user", "content": redact(text)}]


# Our own markers of an error-like output (final_answer: reference without a checkout): an output
# that contains one (case-sensitive) says nothing about the query.
ERROR_MARKERS = ("Error", "error", "Exception", "Traceback", "not found", "Not Found", "does not exist",
                 "doesn't exist", "not subscribed", "Unauthorized", "unauthorized", "timed out", "Timeout",
                 "invalid", "Invalid", "missing", "'response': ''", "'response': []", "<!doctype html>", "<html",
                 "Rate limit", "rate limit")
STEP_OUTPUT_CHARS = 3500


@dataclass
class ReferenceTexts:
    """The texts of ``final_answer: reference``: the step entry, the summary prompt and its system
    message, the no-information request, the error markers, and where they came from.

    ``step`` is filled with ``step``, ``issue`` and ``info``; ``prompt`` with ``query`` and
    ``info`` (:meth:`fill`). :meth:`load` reads them from a CodeTool checkout, or takes ours.
    """

    step: str
    prompt: str
    system: str
    no_information: str
    markers: tuple[str, ...]
    source: str = "ours"

    @classmethod
    def load(cls, setting: str | None = None) -> ReferenceTexts:
        """From the checkout ``setting`` (or ``$CODETOOL_CODETOOL_DIR``), else ours.

        Raises:
            CodetoolError: a checkout is named but lacks the file or its texts.
        """
        from codetool.checkout import message_literals, module_literals, reference_dir

        checkout = reference_dir(setting)
        if checkout is None:
            return cls(prompts.load("final_answer_reference_step").rstrip("\n") + "\n",
                       prompts.load("final_answer_reference").rstrip("\n") + "\n",
                       prompts.load("final_answer_reference_system").strip(),
                       prompts.load("final_answer_no_information").strip(), ERROR_MARKERS)
        file = "infer/generate_final_answer.py"
        found = module_literals(checkout, file, ("filter_words", "PAIR_INFO", "GENERATE_FINAL_ANS"))
        messages = message_literals(checkout, file, "get_fianl_answer")
        if "user" not in messages or "system" not in messages:
            from codetool import CodetoolError

            raise CodetoolError(f"{checkout / file}: its get_fianl_answer() has no literal system and user "
                                "messages; the checkout is not the version codetool reads.")
        # its step entry names the step's issue {query}: rename, so both render alike
        step = found["PAIR_INFO"].replace("{query}", "{issue}")
        return cls(step, found["GENERATE_FINAL_ANS"], messages["system"], messages["user"],
                   tuple(str(w) for w in found["filter_words"]), source=str(checkout))

    def fill(self, template: str, name: str, **fields: object) -> str:
        """``template`` (``self.step`` or ``self.prompt``) filled: ours by :func:`codetool.prompts.fill`,
        a checkout's by ``str.format``, the rule its authors wrote it for (``{{`` is a brace)."""
        if self.source == "ours":
            return prompts.fill(template, fields, source=prompts.path_of(name))
        return template.format(**fields)


def reference_answer_messages(traj: Trajectory, texts: ReferenceTexts) -> list[dict[str, str]]:
    """The messages ``final_answer: reference`` sends for ``traj`` (see the module docstring)."""
    from codetool.search.reference import reference_output

    replies = [s.chosen_candidate.text or "" for s in traj.steps]
    path_text = "".join(f"{text}[Step {k} Finished]\n" for k, text in enumerate(replies, 1))
    recorded = (traj.extra or {}).get("reference_steps") or []
    entries = []
    for k, step in enumerate(traj.steps, 1):
        if k <= len(recorded):
            output = str(recorded[k - 1].get("res", ""))
        else:
            cand = step.chosen_candidate
            output = reference_output(cand.result) if cand.code is not None else ""
        if any(marker in output for marker in texts.markers):
            continue
        match = re.search(rf"{re.escape(f'Step {k}')}(.*?){re.escape('```python')}", path_text, re.DOTALL)
        if match:
            issue = match.group(1).strip().replace("Python Code:", "")
            entries.append(texts.fill(texts.step, "final_answer_reference_step", step=k, issue=issue,
                                      info=output[:STEP_OUTPUT_CHARS]))
    if not entries:
        return [{"role": "user", "content": texts.no_information}]
    info = redact("\n".join(entries))
    return [{"role": "system", "content": texts.system},
            {"role": "user", "content": texts.fill(texts.prompt, "final_answer_reference", query=redact(traj.query),
                                                   info=info)}]


def write_final_answers(trajs: list[Trajectory], backend, cfg: AnswerConfig | None = None) -> int:
    """Write the final answer of every trajectory in ``trajs`` that :func:`needs_answer`, in one
    ``generate`` call (temperature 0); returns how many were written. A failed call or an empty
    reply leaves its trajectories as they were (logged), but for the time: the call's seconds are
    added to each one's ``wall_time_s`` and, shared evenly, to its ``phase_seconds["generation"]``. Under ``final_answer: reference`` an
    answer replaces the ``finish`` answer, which stays in ``extra["finish_answer"]``."""
    cfg = cfg or AnswerConfig()
    todo = [t for t in trajs if needs_answer(t, cfg)]
    if not todo:
        return 0
    if cfg.final_answer == "reference":
        texts = ReferenceTexts.load(cfg.reference_dir)
        prompts = [reference_answer_messages(t, texts) for t in todo]
    else:
        prompts = [answer_messages(t, cfg.max_log_chars) for t in todo]
    started = time.perf_counter()
    try:
        batch = backend.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=cfg.max_new_tokens)
    except Exception as e:  # the search results stand without answers; the report shows the count
        logger.warning("writing %d final answers failed (%s: %s)", len(todo), type(e).__name__, e)
        return 0
    finally:
        # Each trajectory waited for the whole call (its wall time, like an episode's own time);
        # the call's generation time is shared evenly (as a search round's phases are).
        seconds = time.perf_counter() - started
        for traj in todo:
            traj.wall_time_s += seconds
            traj.phase_seconds["generation"] = traj.phase_seconds.get("generation", 0.0) + seconds / len(todo)
    written = 0
    for traj, [completion] in zip(todo, batch):
        answer = redact(completion.text.strip())
        if not answer:
            logger.warning("query %s: the model wrote an empty final answer", traj.query_id)
            continue
        if cfg.final_answer == "reference":
            traj.extra["finish_answer"] = traj.final_answer
            traj.extra["answer_procedure"], traj.extra["answer_texts"] = "reference", texts.source
        traj.final_answer = answer
        traj.extra["answer_source"] = "generated"
        traj.prompt_tokens += completion.prompt_tokens
        traj.completion_tokens += completion.completion_tokens
        written += 1
    return written


def write_final_answer(traj: Trajectory, backend, cfg: AnswerConfig | None = None) -> bool:
    """:func:`write_final_answers` for one trajectory; returns whether an answer was written."""
    return write_final_answers([traj], backend, cfg) == 1
