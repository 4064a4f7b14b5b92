"""Decide first: a When2Tool-style decision stage in front of the stepwise search.

Many queries need one obvious function, or none. One short call asks a model which function to
call first, or ``NONE``, and how sure it is; only uncertain queries pay for the full search.

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
  (unparseable replies count in the denominator).

**Routes** (thresholds in :class:`RouterConfig`): ``NONE`` with confidence >= ``t_none`` ->
``direct`` (one short generation, the answer goes to ``final_answer``, no tools); a function with
confidence >= ``t_tool`` -> ``fast`` (one code step, prompted to call that function and
``finish``, executed once; if it fails, the full search continues from that state and history);
otherwise -> ``search``. Every trajectory records its decision in ``Trajectory.routing``.

Limits: the decision prompt lists names and one-line descriptions only (no signatures). Option
scoring treats a name that is a prefix of another as at least as likely as the longer one; set
``option_suffix`` (e.g. to the model's end-of-turn token) when the tool set has such names. A
fast-path fallback gets the search's full step budget after the fast step (so it may use
``max_steps + 1`` steps), which can only make the router look more expensive, never cheaper.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.models.completion import to_messages
from codetool.search.prompt import prompt_text
from codetool.search.records import Step, Trajectory
from codetool.search.search import SearchTask, StepwiseSearch, expand
from codetool.secrets import redact

logger = logging.getLogger(__name__)

NONE = "NONE"
ROUTES = ("direct", "fast", "search")
RESERVED = ("finish", "give_up")


@dataclass
class RouterConfig:
    """Settings of the decide-first stage (``codetool run --router``, ``codetool eval-decision``)."""

    enabled: bool = option(False, "send each query through the decision stage before the search")
    method: str = option("auto", "confidence source: logprobs (token probabilities), agreement (samples), "
                         "or auto (logprobs when the backend supports them)",
                         choices=["auto", "logprobs", "agreement"])
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

    def __post_init__(self):
        for name in ("t_none", "t_tool"):
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


def _available_tools(env) -> list[dict[str, Any]]:
    """``Trajectory.available_tools``: ``env.describe()``, or built from ``env.apis``."""
    describe = getattr(env, "describe", None)
    if callable(describe):
        return describe()
    return [{"name": a.name, "tool": a.tool, "api": a.api} for a in getattr(env, "apis", [])]


def decision_messages(query: str, candidates: Sequence[tuple[str, str]], max_description_chars: int = 100
                      ) -> list[dict[str, str]]:
    """The decision prompt: a system message listing the functions, and the request."""
    lines = []
    for name, description in candidates:
        desc = description if len(description) <= max_description_chars else (
            description[:max_description_chars].rstrip() + "...")
        lines.append(f"- {name}: {desc}" if desc else f"- {name}")
    system = prompt_text("decide_system").replace("{functions}", "\n".join(lines) or "(none)")
    user = prompt_text("decide_user").replace("{query}", query)
    return [{"role": "system", "content": redact(system)}, {"role": "user", "content": redact(user)}]


def answer_messages(query: str) -> list[dict[str, str]]:
    """The prompt of the direct route: answer the request without tools."""
    return [{"role": "system", "content": prompt_text("decide_answer")}, {"role": "user", "content": redact(query)}]


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
    if cfg.method == "logprobs" and not supported:
        raise CodetoolError(f"router.method is logprobs but the backend {getattr(backend, 'name', backend)!r} "
                            f"cannot score options; use router.method agreement (or auto).")
    if cfg.method == "auto":
        return "logprobs" if supported else "agreement"
    return cfg.method


def decide(backend, items: Sequence[tuple[str, Sequence[tuple[str, str]]]], cfg: RouterConfig) -> list[Decision]:
    """Decide, for many queries in one batched call, which function to call first (or NONE).

    Args:
        backend (`LLMBackend`): the deciding model (the policy, or a separate small model).
        items (`Sequence[tuple]`): ``(query, [(function name, description), ...])`` per query.
        cfg (`RouterConfig`): method and scoring settings (the thresholds are not used here).
    Returns:
        One :class:`Decision` per item, in order.
    Raises:
        CodetoolError: ``method: logprobs`` with a backend that cannot score options.
    """
    if not items:
        return []
    method = resolve_method(backend, cfg)
    prompts = [decision_messages(q, cands, cfg.max_description_chars) for q, cands in items]
    names = [[n for n, _ in cands] for _, cands in items]
    start = time.perf_counter()
    if method == "logprobs":
        decisions = _by_logprobs(backend, prompts, items, cfg)
    else:
        decisions = _by_agreement(backend, prompts, names, cfg)
    share = (time.perf_counter() - start) / len(decisions)
    for d in decisions:
        d.seconds = share
    return decisions


def _by_logprobs(backend, prompts, items, cfg: RouterConfig) -> list[Decision]:
    # option_logprobs takes one option list for all its prompts: group queries by tool set. With
    # calibrate, the group's content-free prompt rides along in the same call.
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (_, cands) in enumerate(items):
        groups.setdefault((NONE, *(n for n, _ in cands)), []).append(i)
    out: list[Decision | None] = [None] * len(prompts)
    for options, indices in tqdm(groups.items(), desc="decisions (tool sets)", unit="set", disable=len(groups) < 4,
                                 leave=False):
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
                              prompt_tokens=_prompt_tokens(backend, prompts[i]) + extra, scored_tokens=scored_tokens)
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
                                  completion_tokens=sum(c.completion_tokens for c in completions)))
    return decisions


def route_for(decision: Decision, cfg: RouterConfig) -> str:
    """``direct``, ``fast`` or ``search`` for a decision under the thresholds of ``cfg``."""
    if decision.choice == NONE and decision.confidence >= cfg.t_none:
        return "direct"
    if decision.tool is not None and decision.confidence >= cfg.t_tool:
        return "fast"
    return "search"


def fast_failure(expanded) -> str | None:
    """Why a fast-path step failed, or ``None`` when it succeeded.

    A success ran without error, had no failed tool call, called at least one tool and called
    ``finish``. Reasons: ``no_code``, ``code_error``, ``tool_error``, ``give_up``, ``no_finish``,
    ``no_tool_call`` (finished without calling any function: an unsupported answer).
    """
    cand = expanded.candidate
    result = cand.result
    if cand.code is None:
        return "no_code"
    if not result.get("ok", False):
        return "code_error"
    calls = result.get("tool_calls", [])
    if any(c.get("status") != "ok" for c in calls):
        return "tool_error"
    if expanded.ended == "give_up":
        return "give_up"
    if expanded.ended != "finish":
        return "no_finish"
    if not calls:
        return "no_tool_call"
    return None


def routing_record(decision: Decision, route: str, cfg: RouterConfig, fallback: str | None = None,
                   top: int = 5) -> dict[str, Any]:
    """The ``Trajectory.routing`` entry: route, decision, confidence, method, tokens, seconds.

    ``fallback`` is the fast path's failure reason when the full search took over, else ``None``.
    """
    ranked = sorted(decision.scores.items(), key=lambda kv: -kv[1])[:top]
    return {"route": route, "choice": decision.choice, "tool": decision.tool,
            "confidence": round(decision.confidence, 6), "method": decision.method,
            "scoring": (("pmi-" if cfg.calibrate else "") + cfg.length_norm) if decision.method == "logprobs" else None,
            "t_none": cfg.t_none, "t_tool": cfg.t_tool, "fallback": fallback,
            "top": [[name, round(p, 6)] for name, p in ranked], "samples": list(decision.samples),
            "tokens": {"prompt": decision.prompt_tokens, "completion": decision.completion_tokens,
                       "scored": decision.scored_tokens},
            "seconds": round(decision.seconds, 4)}


@dataclass
class _Pending:
    """A task's decision and, after a failed fast path, that step and what it cost."""

    task: SearchTask
    decision: Decision
    route: str
    fast_step: Step | None = None
    fast_reason: str | None = None
    fast_phases: dict[str, float] = field(default_factory=dict)


class Router:
    """Decide first, then answer directly, take the one-step fast path, or run the full search.

    Args:
        config (`RouterConfig`): thresholds and decision settings.
        search (`StepwiseSearch`): the full search (its policy, config, scorer, executors).
        policy (`LLMBackend`): writes direct answers and fast-path steps (normally ``search.policy``).
        make_executor (`Callable[[SearchTask], Executor]`, *optional*): executors for fast paths
            (default: ``search.make_executor``); a failed fast path hands its executor to the search.
        decider (`LLMBackend`, *optional*): the deciding model (default: ``policy``).
    """

    def __init__(self, config: RouterConfig, search: StepwiseSearch, policy=None,
                 make_executor: Callable[[SearchTask], Any] | None = None, decider=None):
        self.cfg, self.search = config, search
        self.policy = policy if policy is not None else search.policy
        self.make_executor = make_executor or search.make_executor
        self.decider = decider if decider is not None else self.policy
        self.method = f"{search.cfg.method}+router"

    def run(self, tasks: Sequence[SearchTask], on_done: Callable[[Trajectory], None] | None = None,
            decisions: Sequence[Decision] | None = None) -> list[Trajectory]:
        """Route and solve every task; returns trajectories in task order.

        Args:
            on_done (`Callable`, *optional*): sees each finished trajectory as soon as it exists.
            decisions (`Sequence[Decision]`, *optional*): decisions already made for ``tasks``
                (benchmarks reuse one decision across threshold settings); made here otherwise.
        Raises:
            CodetoolError: two tasks share a query id.
        """
        tasks = list(tasks)
        ids = [t.query_id for t in tasks]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise CodetoolError(f"the router got query id {dup!r} twice; query ids of one run must be unique.")
        if decisions is None:
            decisions = decide(self.decider, [(t.query, candidates_of(t.env)) for t in tasks], self.cfg)
        pending = [_Pending(t, d, route_for(d, self.cfg)) for t, d in zip(tasks, decisions, strict=True)]
        for p in pending:
            logger.debug("%s: %s (%s %.3f) -> %s", p.task.query_id, p.decision.choice, p.decision.method,
                         p.decision.confidence, p.route)
        done: dict[str, Trajectory] = {}

        def emit(traj: Trajectory) -> None:
            done[traj.query_id] = traj
            if on_done:
                on_done(traj)

        for traj in self._direct([p for p in pending if p.route == "direct"]):
            emit(traj)
        held: dict[str, Any] = {}
        for traj in self._fast([p for p in pending if p.route == "fast"], held):
            emit(traj)
        rest = {p.task.query_id: p for p in pending
                if p.route == "search" or (p.route == "fast" and p.fast_reason is not None)}
        if rest:
            def make(task: SearchTask):
                state = held.pop(task.query_id, None)
                return state if state is not None else self.search.make_executor(task)

            def finished(traj: Trajectory) -> None:
                self._complete(traj, rest[traj.query_id])
                emit(traj)

            runner = StepwiseSearch(self.search.policy, self.search.cfg, make, scorer=self.search.scorer,
                                    config_hash=self.search.config_hash)
            search_tasks = [p.task if p.fast_step is None else replace(p.task, history=[
                {"code": p.fast_step.chosen_candidate.code, "text": p.fast_step.chosen_candidate.text,
                 "observation": p.fast_step.observation}]) for p in rest.values()]
            runner.run(search_tasks, on_done=finished)
        for state in held.values():  # only left when the search failed to start an episode
            state.close()
        return [done[i] for i in ids]

    def _trajectory(self, p: _Pending) -> Trajectory:
        task = p.task
        traj = Trajectory(query_id=task.query_id, query=task.query, benchmark=task.benchmark, group=task.group,
                          method=self.method, config_hash=self.search.config_hash,
                          available_tools=_available_tools(task.env), extra=dict(task.extra),
                          phase_seconds={"decision": 0.0, "generation": 0.0, "execution": 0.0, "scoring": 0.0})
        self._add_decision(traj, p)
        return traj

    def _add_decision(self, traj: Trajectory, p: _Pending, fallback: str | None = None) -> None:
        d = p.decision
        traj.method = self.method
        traj.prompt_tokens += d.prompt_tokens + d.scored_tokens
        traj.completion_tokens += d.completion_tokens
        traj.phase_seconds["decision"] = traj.phase_seconds.get("decision", 0.0) + d.seconds
        traj.wall_time_s += d.seconds
        traj.routing = routing_record(d, p.route, self.cfg, fallback)

    def _direct(self, pending: list[_Pending]) -> list[Trajectory]:
        """One batched generation answers every NONE query; no tools, no code."""
        if not pending:
            return []
        prompts = [answer_messages(p.task.query) for p in pending]
        start = time.perf_counter()
        outputs = self.policy.generate(prompts, n=1, temperature=0.0, max_new_tokens=self.cfg.answer_max_new_tokens,
                                       seed=self.cfg.seed)
        share = (time.perf_counter() - start) / len(pending)
        out = []
        for p, [completion] in zip(pending, outputs, strict=True):
            traj = self._trajectory(p)
            traj.final_answer, traj.finish_type = completion.text.strip(), "finish"
            traj.prompt_tokens += completion.prompt_tokens
            traj.completion_tokens += completion.completion_tokens
            traj.phase_seconds["generation"] += share
            traj.wall_time_s += share
            out.append(traj)
        return out

    def _fast(self, pending: list[_Pending], held: dict[str, Any]) -> list[Trajectory]:
        """One code step per query, prompted to call the chosen function and finish.

        Returns the trajectories of the successes; a failure keeps its step on the pending entry
        and its executor (the state after the step) in ``held`` for the search to continue from.
        """
        if not pending:
            return []
        cfg = replace(self.search.cfg, temperature=self.cfg.fast_temperature)
        hint = prompt_text("decide_fast")
        nodes = []
        for p in pending:
            hinted = replace(p.task, query=p.task.query + "\n\n" + hint.replace("{tool}", p.decision.tool).strip())
            nodes.append((self.make_executor(p.task), [], hinted))
        timings: dict[str, float] = {}
        start = time.perf_counter()
        rows = expand(self.policy, nodes, 1, cfg, seed=self.cfg.seed, timings=timings)
        n = len(pending)
        phases = {"wall": (time.perf_counter() - start) / n,
                  **{phase: timings.get(phase, 0.0) / n for phase in ("generation", "execution")}}
        out = []
        for p, (parent, _, _), [e] in zip(pending, nodes, rows, strict=True):
            cand = e.candidate
            cand.chosen = True
            step = Step(index=0, candidates=[cand], chosen=0, observation=e.observation)
            reason = fast_failure(e)
            if reason is None:
                if e.state is not None:
                    e.state.close()
                parent.close()
                traj = self._trajectory(p)
                traj.steps = [step]
                traj.final_answer, traj.finish_type = str(cand.result["final_answer"]), "finish"
                self._add_step_cost(traj, step, phases)
                out.append(traj)
                continue
            logger.debug("%s: fast path failed (%s); the full search continues", p.task.query_id, reason)
            if e.state is not None:
                parent.close()
                held[p.task.query_id] = e.state
            else:
                held[p.task.query_id] = parent
            p.fast_step, p.fast_reason, p.fast_phases = step, reason, phases
        return out

    @staticmethod
    def _add_step_cost(traj: Trajectory, step: Step, phases: dict[str, float]) -> None:
        """Add a fast step's tokens, tool cost and seconds (``wall``, ``generation``, ``execution``)."""
        cand = step.chosen_candidate
        traj.prompt_tokens += cand.prompt_tokens
        traj.completion_tokens += cand.completion_tokens
        traj.tool_cost += cand.cost
        traj.isolation = cand.result.get("isolation", traj.isolation) or traj.isolation
        for phase in ("generation", "execution"):
            traj.phase_seconds[phase] = traj.phase_seconds.get(phase, 0.0) + phases.get(phase, 0.0)
        traj.wall_time_s += phases.get("wall", 0.0)

    def _complete(self, traj: Trajectory, p: _Pending) -> None:
        """Add the decision (and a failed fast step) to a trajectory the search produced."""
        if p.fast_step is not None:
            traj.steps = [p.fast_step, *traj.steps]
            for i, step in enumerate(traj.steps):
                step.index = i
            self._add_step_cost(traj, p.fast_step, p.fast_phases)
        self._add_decision(traj, p, fallback=p.fast_reason)


def route_and_solve(tasks: Sequence[SearchTask], router_cfg: RouterConfig, search: StepwiseSearch, policy=None,
                    make_executor: Callable[[SearchTask], Any] | None = None, *, decider=None,
                    on_done: Callable[[Trajectory], None] | None = None,
                    decisions: Sequence[Decision] | None = None) -> list[Trajectory]:
    """Decide first for every task, then answer directly, take the fast path, or search.

    A thin wrapper over :class:`Router` (see it for the arguments); returns trajectories in task
    order, each with its decision in ``Trajectory.routing``.
    """
    return Router(router_cfg, search, policy, make_executor, decider).run(tasks, on_done=on_done,
                                                                           decisions=decisions)
