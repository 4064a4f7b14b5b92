"""Decide first, the decision stage: which function a query needs first, or none, and how sure.

One short call per query (batched across queries) asks a model to name the function to call
first, or ``NONE``. :func:`decide` returns a :class:`Decision`; :mod:`codetool.decide.router`
turns decisions into routes (direct answer, one-step fast path, full search). Source: the
When2Tool idea of deciding whether a tool is needed before planning with tools.

**Confidence** comes from the model itself, never from a number it writes:

- ``logprobs`` (backends with ``supports_logprobs``): ``option_logprobs`` scores every option
  (``NONE`` and each function name) as the whole reply; a softmax over the option scores gives
  probabilities, and the confidence is the probability of the best option.
  *Length.* The raw summed log-probability of an option is the model's probability of emitting
  exactly that name, but names are 10-20 tokens and ``NONE`` is 1-2, and a small model does not
  copy names with near-certainty: measured on SmolLM2-135M (``codetool eval-decision``), the raw
  sum picks NONE for every query and a per-character or per-token mean (lm-evaluation-harness's
  ``acc_norm``) picks a function for every query. So by default (``calibrate``) each option's
  log-probability under a content-free request (``null_query``) is subtracted first: the
  domain-conditional PMI of Holtzman et al. (2021), the contextual calibration of Zhao et al.
  (2021). Both terms score the same option tokens, so the length penalty cancels, and the softmax
  of the differences is the posterior over options with the model's prior for each name replaced
  by a uniform one. It costs one more scored prompt per tool set (batched into the same call).
  Known bias: a content-free request itself needs no function, so NONE's prior is overestimated
  and calibration leans towards functions. ``length_norm: chars`` divides the (calibrated) scores
  by the option's length in characters; ``codetool eval-decision`` reports every variant.
- ``agreement`` (any backend): ``samples`` sampled replies are parsed into names
  (:func:`parse_choice`); the confidence is the share of samples naming the top answer
  (unparseable replies count in the denominator). This is the *verbalised* confidence.
- ``probe`` (local transformers models): no question is asked; a probe reads the hidden states
  of the policy's first-step prompt and gives P(tool necessary) (:mod:`codetool.decide.probe`,
  routed by :func:`route_for` with ``t_probe`` and ``prefill``).

Every decision carries ``p_tool``, its probability that a tool is needed, so the methods can be
compared on one scale (``codetool eval-decision``'s ``compare``).

Limits: the decision prompt lists names and one-line descriptions only (no signatures). Option
scoring treats a name that is a prefix of another as at least as likely as the longer one; set
``option_suffix`` (e.g. to the model's end-of-turn token) when the tool set has such names.
"""

from __future__ import annotations

import difflib
import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from codetool import CodetoolError, prompts
from codetool.config import ConfigError, option
from codetool.models.completion import LLMBackend, to_messages
from codetool.models.spec import ModelSpec
from codetool.progress import ProgressFactory, ticker
from codetool.secrets import redact

NONE = "NONE"
RESERVED = ("finish", "give_up")
PREFILLS = ("soft", "hard")


@dataclass
class RouterConfig:
    """Settings of the decide-first stage (``codetool run --router``, ``codetool eval-decision``)."""

    # 0.1's routing.enabled was never read (run --router turns the stage on): refused, naming that
    config_renamed = {"enabled": "it turned nothing on; codetool run --router routes queries through the decision stage"}

    method: str = option("auto", "confidence source: logprobs (token probabilities), agreement (samples), "
                         "probe (a hidden-state probe of tool necessity, When2Tool's Probe&Prefill; needs "
                         "router.probe), or auto (logprobs when the backend supports them)",
                         choices=["auto", "logprobs", "agreement", "probe"])
    t_none: float = option(0.6, "answer directly when NONE has at least this confidence")
    t_tool: float = option(0.6, "take the one-step fast path when a function has at least this confidence")
    calibrate: bool = option(True, "subtract each option's log-probability under a content-free request "
                             "(PMI; removes the model's prior for each name, long-name penalty included)")
    null_query: str = option("N/A", "the content-free request used by calibrate")
    length_norm: str = option("sum", "option scores: summed log-probability, or divided by the option's "
                              "characters", choices=["sum", "chars"])
    option_suffix: str = option("", "text appended to every option before scoring (e.g. an end-of-turn token)")
    samples: int = option(5, "sampled replies for agreement")
    temperature: float = option(0.7, "sampling temperature for agreement")
    max_new_tokens: int = option(24, "tokens per sampled decision reply")
    max_description_chars: int = option(100, "characters of each function description in the decision prompt")
    answer_max_new_tokens: int = option(160, "tokens of a direct answer")
    fast_temperature: float = option(0.0, "sampling temperature of the fast-path step (0 = greedy)")
    seed: int | None = option(0, "sampling seed (none = nondeterministic)")
    probe: str = option("", "folder of a probe trained by `codetool train-probe` (method probe)")
    probe_model: str = option("", "model whose hidden states the probe reads, when the decider is not a local "
                              "transformers model (vLLM and HTTP servers expose none); default: the decider")
    t_probe: float = option(0.5, "method probe: P(tool necessary) below this takes the no-tool side")
    prefill: str = option("soft", "method probe: soft (a steering sentence opens the first reply; the model may "
                          "override it) or hard (no tool side: the direct answer; tool side: the reply opens "
                          "a code block)", choices=list(PREFILLS))
    probe_temperature: float = option(0.0, "method probe: divide the probe's logit by this before the sigmoid "
                                      "(0: the probe's own, 1 unless trained otherwise)")

    def __post_init__(self):
        for name in ("t_none", "t_tool", "t_probe"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0 + 1e-9:
                raise ConfigError(f"router.{name} must lie in [0, 1] (a probability), got {value}; "
                                  f"use 1 to never take that route.")
        if self.samples < 1:
            raise ConfigError(f"router.samples must be >= 1, got {self.samples}.")
        if self.method == "agreement" and self.samples > 1 and self.temperature <= 0:
            raise ConfigError(f"router.method agreement with {self.samples} samples needs temperature > 0 "
                              f"(greedy samples always agree), got temperature {self.temperature}.")
        if self.max_new_tokens < 1 or self.answer_max_new_tokens < 1:
            raise ConfigError("router.max_new_tokens and router.answer_max_new_tokens must be >= 1.")
        if self.prefill not in PREFILLS:
            raise ConfigError(f"router.prefill must be one of {', '.join(PREFILLS)}, got {self.prefill!r}.")
        if self.method == "probe" and not self.probe:
            raise ConfigError("router.method probe needs router.probe, the folder `codetool train-probe` wrote.")
        if self.probe_temperature < 0:
            raise ConfigError(f"router.probe_temperature must be >= 0 (0: the probe's own), got {self.probe_temperature}.")
        # probe_model parsed once (not a setting); None: the probe reads the decider
        self.probe_spec = ModelSpec.parse(self.probe_model) if self.probe_model else None


@dataclass
class Decision:
    """The decision stage's answer for one query.

    Args:
        choice (`str` or `None`): ``"NONE"``, a function name, or ``None`` when no sample named
            anything recognisable (the query then goes to the full search).
        confidence (`float`): in [0, 1]; the probability (logprobs) or vote share (agreement) of
            ``choice``.
        method (`str`): ``logprobs`` or ``agreement``.
        scores (`dict[str, float]`): every option's probability or vote share.
        logprobs (`list[float]`): raw option log-probabilities in nats, aligned with
            ``["NONE", *names]`` (logprobs method only).
        null_logprobs (`list[float]`): the same under the content-free request (``calibrate``).
        samples (`list[str]`): the parsed vote of each sample (``"?"`` when unparseable).
        prompt_tokens, completion_tokens, scored_tokens (`int`): tokens read, generated, and
            scored as options.
        seconds (`float`): this query's share of the batched call's wall time.
        p_tool (`float`, *optional*): the decision's probability that a tool is needed: the
            probe's output, ``1 - P(NONE)`` for logprobs, ``1 -`` NONE's vote share for agreement.
    """

    choice: str | None
    confidence: float
    method: str
    scores: dict[str, float] = field(default_factory=dict)
    logprobs: list[float] = field(default_factory=list)
    null_logprobs: list[float] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    scored_tokens: int = 0
    seconds: float = 0.0
    p_tool: float | None = None

    @property
    def tool(self) -> str | None:
        """The chosen function name, or ``None`` for NONE / no decision."""
        return None if self.choice in (None, NONE) else self.choice


def _candidate_rows(rows) -> list[tuple[str, str]]:
    return [(name, " ".join(str(desc).split())) for name, desc in rows if name and name not in RESERVED]


def api_candidates(apis) -> list[tuple[str, str]]:
    """``(function name, one-line description)`` of each ``APISpec`` (``finish``/``give_up`` left out)."""
    return _candidate_rows((a.name, a.description or a.tool_description or f"{a.api} ({a.tool})") for a in apis)


def candidates_of(env) -> list[tuple[str, str]]:
    """The decision candidates of a tool environment: ``env.apis`` when present, else ``env.describe()``."""
    apis = getattr(env, "apis", None)
    if apis is not None:
        return api_candidates(apis)
    return _candidate_rows((d["name"], d.get("description") or f"{d.get('api', '')} ({d.get('tool', '')})")
                           for d in env.describe())


def decision_messages(query: str, candidates: Sequence[tuple[str, str]], max_description_chars: int = 100
                      ) -> list[dict[str, str]]:
    """The decision prompt: a system message listing the functions, and the request."""
    lines = []
    for name, description in candidates:
        desc = description if len(description) <= max_description_chars else (
            description[:max_description_chars].rstrip() + "...")
        lines.append(f"- {name}: {desc}" if desc else f"- {name}")
    system = prompts.render("decide_system", functions="\n".join(lines) or "(none)")
    user = prompts.render("decide_user", query=query)
    return [{"role": "system", "content": redact(system)}, {"role": "user", "content": redact(user)}]


def answer_messages(query: str) -> list[dict[str, str]]:
    """The prompt of the direct route: answer the request without tools."""
    return [{"role": "system", "content": prompts.load("decide_answer")}, {"role": "user", "content": redact(query)}]


_NO_FUNCTION = re.compile(r"\bno (function|tool|api)s?\b|\bwithout (any |a )?(function|tool)s?\b|"
                          r"\b(does not|doesn't|do not|don't) need\b")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_choice(text: str, names: Sequence[str]) -> str | None:
    """The function name (or ``NONE``) that a decision reply names, or ``None``.

    Robust to quotes, backticks, ``()``, a leading "Answer:" and chatter: the earliest
    case-insensitive whole-word mention of a name or of ``NONE`` wins (the longer name on a tie);
    then phrases such as "no function needed" mean ``NONE``; then an identifier in the reply that is
    a unique prefix (>= 6 characters) of one name, or within difflib ratio 0.85 of one, names it.
    """
    lowered = (text or "").lower()
    best: tuple[tuple[int, int], str] | None = None
    for name in [*names, NONE]:
        pattern = rf"(?<![a-z0-9_]){re.escape(name.lower())}(?![a-z0-9_])"
        match = re.search(pattern, lowered)
        if match and (best is None or (match.start(), -len(name)) < best[0]):
            best = ((match.start(), -len(name)), name)
    if best:
        return best[1]
    if _NO_FUNCTION.search(lowered):
        return NONE
    by_lower = {n.lower(): n for n in names}
    for token in _IDENT.findall(lowered):
        if len(token) < 4:
            continue
        prefixed = [n for low, n in by_lower.items() if low.startswith(token)]
        if len(token) >= 6 and len(prefixed) == 1:
            return prefixed[0]
        close = difflib.get_close_matches(token, list(by_lower), n=1, cutoff=0.85)
        if close:
            return by_lower[close[0]]
    return None


def option_probabilities(logprobs: Sequence[float], options: Sequence[str], length_norm: str = "sum"
                         ) -> list[float]:
    """Softmax over option scores.

    Args:
        logprobs (`Sequence[float]`): (n_options,) log-probabilities in nats of each option as the reply.
        options (`Sequence[str]`): the option texts (for ``chars``).
        length_norm (`str`, *optional*, defaults to `"sum"`): ``sum`` uses the log-probabilities as
            they are; ``chars`` divides each by its option's length in characters.
    Returns:
        (n_options,) probabilities summing to 1 (uniform when every score is -inf).
    """
    scores = [lp / max(len(o), 1) if length_norm == "chars" else lp for lp, o in zip(logprobs, options, strict=True)]
    top = max(scores)
    if top == -math.inf:
        return [1.0 / len(scores)] * len(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def _prompt_tokens(backend, prompt) -> int:
    encode = getattr(backend, "encode", None)
    if callable(encode):
        return len(encode(prompt))
    return sum(len(m["content"].split()) for m in to_messages(prompt))


def _text_tokens(backend, texts: Sequence[str]) -> int:
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is not None:
        return sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return sum(len(t.split()) for t in texts)


def resolve_method(backend, cfg: RouterConfig) -> str:
    """``logprobs`` or ``agreement`` for this backend (``auto`` picks logprobs when supported)."""
    supported = bool(getattr(backend, "supports_logprobs", False))
    if cfg.method == "probe":
        return "probe"
    if cfg.method == "logprobs" and not supported:
        raise CodetoolError(f"router.method is logprobs but the backend {getattr(backend, 'name', backend)!r} "
                            f"cannot score options; use router.method agreement (or auto).")
    if cfg.method == "auto":
        return "logprobs" if supported else "agreement"
    return cfg.method


def decide(backend: LLMBackend, items: Sequence[tuple[str, Sequence[tuple[str, str]]]], cfg: RouterConfig, *,
           progress: ProgressFactory | None = None) -> list[Decision]:
    """Decide, for many queries in one batched call, which function to call first (or NONE).

    Args:
        backend (`LLMBackend`): the deciding model (the policy, or a separate small model).
        items (`Sequence[tuple]`): ``(query, [(function name, description), ...])`` per query.
        cfg (`RouterConfig`): method and scoring settings (the thresholds are not used here).
        progress (`ProgressFactory`, *optional*): ``logprobs`` only: told the number of tool sets
            (one scoring call each, four or more), ticked after each (:mod:`codetool.progress`).
    Returns:
        One :class:`Decision` per item, in order.
    Raises:
        CodetoolError: ``method: logprobs`` with a backend that cannot score options.
    """
    if not items:
        return []
    method = resolve_method(backend, cfg)
    if method == "probe":
        raise CodetoolError("decide() scores named options; the probe reads the policy prompt instead: call "
                            "codetool.decide.probe.probe_decisions (the router does).")
    prompts = [decision_messages(q, cands, cfg.max_description_chars) for q, cands in items]
    names = [[n for n, _ in cands] for _, cands in items]
    start = time.perf_counter()
    if method == "logprobs":
        decisions = _by_logprobs(backend, prompts, items, cfg, progress)
    else:
        decisions = _by_agreement(backend, prompts, names, cfg)
    share = (time.perf_counter() - start) / len(decisions)
    for d in decisions:
        d.seconds = share
    return decisions


def _by_logprobs(backend, prompts, items, cfg: RouterConfig, progress: ProgressFactory | None = None) -> list[Decision]:
    # option_logprobs takes one option list for all its prompts: group queries by tool set. With
    # calibrate, the group's content-free prompt rides along in the same call.
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (_, cands) in enumerate(items):
        groups.setdefault((NONE, *(n for n, _ in cands)), []).append(i)
    out: list[Decision | None] = [None] * len(prompts)
    tick = ticker(progress if len(groups) >= 4 else None, len(groups))
    for options, indices in groups.items():
        texts = [o + cfg.option_suffix for o in options]
        batch = [prompts[i] for i in indices]
        if cfg.calibrate:
            batch.append(decision_messages(cfg.null_query, items[indices[0]][1], cfg.max_description_chars))
        scored = backend.option_logprobs(batch, texts)
        null = [float(x) for x in scored.pop()] if cfg.calibrate else []
        # the content-free pass is paid once per tool set: its tokens are shared by the group's queries
        passes = 1 + (1 / len(indices) if cfg.calibrate else 0)
        extra = round(_prompt_tokens(backend, batch[-1]) / len(indices)) if cfg.calibrate else 0
        scored_tokens = round(_text_tokens(backend, texts) * passes)
        for i, logprobs in zip(indices, scored, strict=True):
            raw = [float(x) for x in logprobs]
            probs = option_probabilities([a - b for a, b in zip(raw, null)] if null else raw, options, cfg.length_norm)
            best = max(range(len(options)), key=lambda j: (probs[j], -j))  # ties go to the earlier option
            out[i] = Decision(choice=options[best], confidence=probs[best], method="logprobs",
                              scores=dict(zip(options, probs)), logprobs=raw, null_logprobs=null,
                              prompt_tokens=_prompt_tokens(backend, prompts[i]) + extra, scored_tokens=scored_tokens,
                              p_tool=1.0 - probs[0])  # options[0] is NONE
        tick(options)
    return out  # type: ignore[return-value]


def _by_agreement(backend, prompts, names, cfg: RouterConfig) -> list[Decision]:
    outputs = backend.generate(prompts, n=cfg.samples, temperature=cfg.temperature if cfg.samples > 1 else 0.0,
                               top_p=1.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    decisions = []
    for completions, options in zip(outputs, names, strict=True):
        votes = [parse_choice(c.text, options) for c in completions]
        counts = Counter(v for v in votes if v is not None)
        if counts:
            first = {v: votes.index(v) for v in counts}
            choice = max(counts, key=lambda v: (counts[v], -first[v]))
            confidence = counts[choice] / len(completions)
        else:
            choice, confidence = None, 0.0
        decisions.append(Decision(choice=choice, confidence=confidence, method="agreement",
                                  scores={v: c / len(completions) for v, c in counts.items()},
                                  samples=[v or "?" for v in votes], prompt_tokens=completions[0].prompt_tokens,
                                  completion_tokens=sum(c.completion_tokens for c in completions),
                                  p_tool=1.0 - counts.get(NONE, 0) / len(completions)))
    return decisions


def route_for(decision: Decision, cfg: RouterConfig) -> str:
    """``direct``, ``fast`` or ``search`` for a decision under the thresholds of ``cfg``.

    A probe decision (When2Tool's Probe&Prefill) goes by ``p_tool`` against ``t_probe``: below it,
    ``hard`` answers directly (no tool can be called) and ``soft`` takes the fast path, one step
    whose reply opens with the no-tool steering sentence (the model may still call a tool);
    otherwise the full search, its first reply opened by the tool-side prefill.
    """
    if decision.method == "probe":
        if (decision.p_tool if decision.p_tool is not None else 1.0) < cfg.t_probe:
            return "direct" if cfg.prefill == "hard" else "fast"
        return "search"
    if decision.choice == NONE and decision.confidence >= cfg.t_none:
        return "direct"
    if decision.tool is not None and decision.confidence >= cfg.t_tool:
        return "fast"
    return "search"
