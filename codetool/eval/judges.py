"""Judges: an LLM labels a final answer Solved / Unsure / Unsolved, or picks the better of two.

Every judge has the same two batch methods, ``judge_answers(requests) -> list[Verdict]`` and
``compare_many(requests) -> list[Preference]`` (plus one-item conveniences), so the pass-rate and
win-rate bookkeeping of :mod:`codetool.eval.stabletoolbench` never knows which judge it talks to:

- :class:`~codetool.eval.llm_judge.LLMJudge` over any ``codetool.models`` backend (an
  OpenAI-compatible endpoint or a local transformers model; see :mod:`codetool.eval.llm_judge`);
- :class:`ScriptedJudge` for tests and replays of recorded verdicts.

This module holds the request and verdict records, the interface, :class:`JudgeConfig` (the
``judge.*`` settings) and :func:`make_judge`. The prompts are ours (``codetool/prompts/judge_*.txt``)
unless ``judge.prompts`` names a reference, whose prompts and forced functions are read from the
user's own checkout at run time (:mod:`codetool.eval.reference_prompts`). ``LLMJudge``,
``JudgeCache``, ``parse_choice`` and ``extract_json`` are importable from here too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.eval.reference_prompts import (
    PROMPT_SETS,
    STB_EVALUATOR,
    load_reference_prompts,
)
from codetool.models.remote import RemoteConfig
from codetool.secrets import redact

logger = logging.getLogger(__name__)

LABELS = ("Solved", "Unsure", "Unsolved")
LABEL_SCORES = {"Solved": 1.0, "Unsure": 0.5, "Unsolved": 0.0}
WINNERS = ("a", "b", "tie")
_FIELDS = re.compile(r"\{(query|answer|trajectory|answer_a|answer_b)\}")
PROTOCOLS = ("stabletoolbench", "codetool")
PAPER_JUDGE = "gpt-4-turbo-2024-04-09"  # CodeTool's judge (eval/config.yaml); StableToolBench's tables since 2024-06
STB_STANDARD_JUDGE = "gpt-4-turbo-preview"  # the standard evaluation model StableToolBench's README names


@dataclass
class Verdict:
    """The label of one final answer in one round.

    Args:
        label (`str`): ``Solved``, ``Unsure`` or ``Unsolved`` (scores 1 / 0.5 / 0).
        reason (`str`): the judge's one-sentence reason, or the rule that decided.
        source (`str`): ``rule`` (decided without a judge call), ``answer`` (judged on the final
            answer) or ``trajectory`` (an Unsure answer re-judged with the whole trajectory).
        cached (`bool`): whether the verdict came from the on-disk cache.
        parse_failed (`bool`): the judge's reply could not be read after all retries (the label
            is then ``Unsolved``, which never inflates a pass rate).
        error (`str`, *optional*): the judge request failed after its retries (an error record:
            the label is ``Unsolved``, nothing is cached, a rerun asks again).
    """

    label: str
    reason: str = ""
    source: str = "answer"
    cached: bool = False
    parse_failed: bool = False
    error: str | None = None

    @property
    def score(self) -> float:
        return LABEL_SCORES[self.label]


@dataclass
class Preference:
    """Which of two answers won one comparison: ``winner`` is ``a``, ``b`` or ``tie``.

    ``source`` is ``rule`` when no judge call was needed (one answer solved, or identical answers);
    ``cached``, ``parse_failed`` and ``error`` as in :class:`Verdict` (a failed parse or request is
    a tie).
    """

    winner: str
    reason: str = ""
    source: str = "judge"
    cached: bool = False
    parse_failed: bool = False
    error: str | None = None


@dataclass
class AnswerRequest:
    """One final answer to label; ``trajectory`` (rendered text) asks for the detailed check."""

    query: str
    answer: str
    trajectory: str | None = None
    round: int = 0
    reason: bool = True  # ask for a reason (StableToolBench's preference run checks answers without one)


@dataclass
class CompareRequest:
    """Two final answers to the same query, shown as A and B.

    ``details_a`` / ``details_b`` (the whole answers as JSON, as
    :func:`codetool.eval.stabletoolbench.answer_json` writes them) ask for StableToolBench's
    comparison of whole answers; ``allow_tie`` False leaves the judge A or B only.
    """

    query: str
    answer_a: str
    answer_b: str
    round: int = 0
    details_a: str | None = None
    details_b: str | None = None
    allow_tie: bool = True


class Judge:
    """The judge interface (subclasses implement the two batch methods).

    Attributes:
        name (`str`): shown in reports, e.g. ``openai:gpt-4o-mini`` or ``local:default``.
        weak (`bool`): a small local model whose verdicts are a smoke test, not a measurement.
    """

    name = "judge"
    kind = "custom"
    weak = False

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        raise NotImplementedError

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        raise NotImplementedError

    def judge_answer(self, query: str, answer: str, *, trajectory: str | None = None,
                     round: int = 0) -> Verdict:
        """Label one answer (see :meth:`judge_answers`)."""
        return self.judge_answers([AnswerRequest(query, answer, trajectory, round)])[0]

    def compare(self, query: str, answer_a: str, answer_b: str, *, round: int = 0) -> Preference:
        """Compare two answers (see :meth:`compare_many`)."""
        return self.compare_many([CompareRequest(query, answer_a, answer_b, round)])[0]

    def describe(self) -> dict[str, Any]:
        """What a report says about the judge."""
        note = ("a small local model: its verdicts are a smoke test, not comparable to published numbers"
                if self.weak else "")
        return {"name": redact(self.name), "kind": self.kind, "weak": self.weak, "note": note}


class ScriptedJudge(Judge):
    """A judge that answers from a script (tests, replays of recorded verdicts).

    Args:
        label (`str` or `Callable[[AnswerRequest], str | Verdict]`, *optional*, defaults to
            `"Solved"`): the label of every answer, or a function of the request.
        winner (`str` or `Callable[[CompareRequest], str | Preference]`, *optional*, defaults to
            `"tie"`): ``a``, ``b`` or ``tie``, or a function of the request.
        name (`str`, *optional*, defaults to `"scripted"`): the name shown in reports.

    Every request is recorded in ``answer_calls`` / ``compare_calls``.
    """

    kind = "scripted"

    def __init__(self, label: str | Callable = "Solved", winner: str | Callable = "tie", *,
                 name: str = "scripted", weak: bool = False):
        self.label, self.winner, self.name, self.weak = label, winner, name, weak
        self.answer_calls: list[AnswerRequest] = []
        self.compare_calls: list[CompareRequest] = []

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        out = []
        for req in requests:
            self.answer_calls.append(req)
            got = self.label(req) if callable(self.label) else self.label
            verdict = got if isinstance(got, Verdict) else Verdict(str(got), "scripted")
            if verdict.label not in LABELS:
                raise CodetoolError(f"ScriptedJudge: label must be one of {LABELS}, got {verdict.label!r}.")
            if req.trajectory is not None and verdict.source == "answer":
                verdict.source = "trajectory"
            out.append(verdict)
        return out

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        out = []
        for req in requests:
            self.compare_calls.append(req)
            got = self.winner(req) if callable(self.winner) else self.winner
            pref = got if isinstance(got, Preference) else Preference(str(got), "scripted")
            if pref.winner not in WINNERS:
                raise CodetoolError(f"ScriptedJudge: winner must be one of {WINNERS}, got {pref.winner!r}.")
            out.append(pref)
        return out


def load_prompt(name: str) -> str:
    """The packaged prompt ``codetool/prompts/<name>.txt``."""
    return resources.files("codetool").joinpath(f"prompts/{name}.txt").read_text()


def render_prompt(template: str, **fields: str) -> str:
    """Fill ``{query}``, ``{answer}``, ... in one pass (a value that contains ``{answer}`` is left
    alone) and redact secrets from the result."""
    return redact(_FIELDS.sub(lambda m: fields.get(m.group(1), m.group(0)), template))


def clip(text: str | None, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a visible marker."""
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} characters cut]"


@dataclass
class JudgeConfig:
    """Which judge scores answers, and by which procedure (``codetool eval --judge.model ...``).

    ``protocol`` picks the procedure (see :mod:`codetool.eval.stabletoolbench`):
    ``stabletoolbench`` (its evaluator: two stages, an Unsure answer decided again from the whole
    answer with its details; forced function calls where the server supports them; temperature
    0.2; 3 rounds) or ``codetool`` (CodeTool's ``eval/eval_pass_rate.py``: one forced call per
    answer on the query and final answer at temperature 0, one round, no rule).
    ``rounds``, ``temperature`` and ``max_new_tokens`` left empty take the protocol's / prompts'.
    ``prompts`` picks the wording: ``ours`` (``codetool/prompts/judge_*.txt``) or a reference's,
    read from the user's checkout (``reference_dir``, else ``$CODETOOL_STABLETOOLBENCH_DIR`` or
    ``$CODETOOL_CODETOOL_DIR``, see :mod:`codetool.eval.reference_prompts`).
    """

    model: str = option("default", "'none' (judge-free metrics only), 'default' (the embedded local "
                        "model: a weak smoke-test judge), a local model directory or Hub id, or the "
                        "http(s):// base URL of an OpenAI-compatible server")
    remote_model: str = option("", "model name sent to an http(s) judge (default: the server's first model); "
                               f"the papers' judge is {PAPER_JUDGE}")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable that holds the judge's API key")
    protocol: str = option("stabletoolbench", "judging procedure: stabletoolbench (two-stage, 3 rounds at 0.2) "
                           "or codetool (single pass on query + final answer at temperature 0)",
                           choices=list(PROTOCOLS))
    rounds: int | None = option(None, "judge rounds per answer; the pass rate is their mean, with their spread "
                                "(default: 3 for stabletoolbench, 1 for codetool)")
    mode: str = option("auto", "json: the judge writes JSON; tools: a forced function call (OpenAI tools + "
                       "tool_choice, JSON text where refused); options: score the labels by log-probs (local "
                       "models); auto: options for local models, tools for servers under the stabletoolbench "
                       "protocol, else json", choices=["auto", "json", "tools", "options"])
    temperature: float | None = option(None, "judge sampling temperature (default: 0.2 for stabletoolbench, "
                                       "as its evaluator; 0 for codetool)")
    max_new_tokens: int | None = option(None, "most tokens of a judge reply (default: 256 with our prompts, 1000 "
                                        "with a reference's, StableToolBench's max_tokens)")
    prompts: str = option("ours", "judge prompts: ours, stabletoolbench (its evaluator's template and functions) or "
                          "codetool (CodeTool's eval/utils.py instruction), the last two read from your own checkout "
                          "(judge.reference_dir)", choices=list(PROMPT_SETS))
    reference_dir: str = option("", "your clone of StableToolBench or CodeTool for judge.prompts stabletoolbench / "
                                "codetool (default: $CODETOOL_STABLETOOLBENCH_DIR / $CODETOOL_CODETOOL_DIR)")
    stabletoolbench_evaluator: str = option(STB_EVALUATOR, "StableToolBench evaluator folder the prompts are read "
                                            "from (toolbench/tooleval/evaluators/<name>)")
    codetool_instruction: str = option("v2", "CodeTool's judge instruction: v2 (EVAL_INST_V2, what its "
                                       "run_pass_rate.sh passes) or v1", choices=["v1", "v2"])
    retries: int = option(2, "extra attempts when a judge reply does not parse")
    batch_size: int | None = option(None, "prompts per judge call; verdicts are cached after each batch (none: 8 "
                                    "for a local judge, judge.client.max_in_flight for a server)")
    client: RemoteConfig = field(default_factory=RemoteConfig)
    cache: str = option("", "JSONL file of cached verdicts (default: judge_cache.jsonl in the output folder)")
    weak: bool | None = option(None, "flag the judge as weak in reports (default: true for local models)")
    dtype: str = option("auto", "dtype of a local judge", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device of a local judge: auto, cpu, cuda, ...")
    max_answer_chars: int = option(2000, "answers shown to the judge are cut to this many characters")
    max_trajectory_chars: int = option(0, "the answer details (steps and tool calls) shown to the judge are cut "
                                       "to this many characters; 0: never cut (StableToolBench's evaluator "
                                       "shows them whole; a cut is reported as a deviation)")
    seed: int = option(0, "seed of the win rate's random draws: the order of the two answers in each comparison "
                       "and the pick between identical answers")
    blank_finish: str = option("unsolved", "under protocol stabletoolbench, a finish with an empty or blank answer: "
                               "unsolved (ours: Unsolved, no judge call) or judge (StableToolBench: its export "
                               "holds ToolBench's JSON text there, which its evaluator judges); protocol codetool "
                               "judges every answer", choices=["unsolved", "judge"])

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"judge.protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}.")
        if self.prompts not in PROMPT_SETS:
            raise ConfigError(f"judge.prompts must be one of {', '.join(PROMPT_SETS)}, got {self.prompts!r}.")
        if self.max_new_tokens is None:
            self.max_new_tokens = 256 if self.prompts == "ours" else 1000
        if self.max_new_tokens < 1:
            raise ConfigError(f"judge.max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.rounds is None:
            self.rounds = 3 if self.protocol == "stabletoolbench" else 1
        if self.temperature is None:
            self.temperature = 0.2 if self.protocol == "stabletoolbench" else 0.0
        if self.rounds < 1:
            raise ConfigError(f"judge.rounds must be >= 1, got {self.rounds}.")
        if self.temperature < 0:
            raise ConfigError(f"judge.temperature must be >= 0, got {self.temperature}.")
        if self.retries < 0 or (self.batch_size is not None and self.batch_size < 1):
            raise ConfigError(f"need judge.retries >= 0 and judge.batch_size >= 1, got {self.retries}, "
                              f"{self.batch_size}.")
        if self.max_trajectory_chars < 0:
            raise ConfigError(f"judge.max_trajectory_chars must be >= 0 (0: no cut), got {self.max_trajectory_chars}.")

    @property
    def enabled(self) -> bool:
        return self.model.strip().lower() not in ("", "none")


def make_judge(cfg: JudgeConfig, cache_path: str | None = None) -> Judge | None:
    """The judge described by ``cfg`` (``None`` for ``model: none``). A local model is checked now
    and loaded on the first verdict that is not cached; a server is asked its model name unless
    ``remote_model`` is given. ``cache_path`` is used when ``cfg.cache`` is empty.

    Raises:
        ConfigError: ``cfg.prompts`` names a reference but no usable checkout was given.
        CodetoolError: what the backend raises (a missing default model, a server that is not
            reachable, a missing API key variable).
    """
    if not cfg.enabled:
        return None
    reference = load_reference_prompts(cfg.prompts, cfg.reference_dir, evaluator=cfg.stabletoolbench_evaluator,
                                       instruction=cfg.codetool_instruction)  # no checkout: fails before any model
    from functools import partial

    from codetool.models.backends import make_backend
    from codetool.models.spec import ModelSpec

    spec = ModelSpec.parse(cfg.model, role="judge", remote_model=cfg.remote_model, api_key_env=cfg.api_key_env,
                           dtype=cfg.dtype, device=cfg.device, client=cfg.client)
    remote = spec.remote
    if remote:
        backend = make_backend(spec)
        # The model's name is part of every cache key: ask the server once when it was not given.
        served = cfg.remote_model or (backend.resolved_model() if hasattr(backend, "resolved_model") else "")
        name = f"openai:{served or 'server-default'}@{cfg.model}"
        if cfg.mode == "options" and callable(getattr(backend, "feature", None)) and not backend.feature("logprobs"):
            raise ConfigError(f"judge.mode is 'options' (labels scored by log-probabilities), but the judge server "
                              f"{cfg.model} returns none ({backend.features.notes.get('logprobs', '')}); set "
                              "--judge.mode json or tools.")
    else:
        from codetool.models.loading import resolve_model

        resolve_model(cfg.model)  # a missing model fails now, with its fix; loading waits for a cache miss
        backend = partial(make_backend, spec)  # loaded on the first verdict that is not cached
        name = f"local:{cfg.model}"
    from codetool.eval.llm_judge import LLMJudge

    weak = (not remote) if cfg.weak is None else cfg.weak
    mode = cfg.mode
    if mode == "auto" and remote:  # both references force a function call (StableToolBench, CodeTool)
        mode = "tools"
    return LLMJudge(backend, name=name, kind="openai" if remote else "local", weak=weak,
                    cache_path=cfg.cache or cache_path, mode=mode, temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens, retries=cfg.retries,
                    batch_size=cfg.batch_size or (cfg.client.max_in_flight if remote else 8),
                    max_answer_chars=cfg.max_answer_chars,
                    max_trajectory_chars=cfg.max_trajectory_chars or 10**9, reference=reference)


_BACKEND_NAMES = ("LLMJudge", "JudgeCache", "parse_choice", "extract_json")


def __getattr__(name: str):
    """``LLMJudge`` and its helpers live in :mod:`codetool.eval.llm_judge`; importable from here too."""
    if name in _BACKEND_NAMES:
        from codetool.eval import llm_judge

        return getattr(llm_judge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
