"""Judges: an LLM labels a final answer Solved / Unsure / Unsolved, or picks the better of two.

Every judge has the same two batch methods, ``judge_answers(requests) -> list[Verdict]`` and
``compare_many(requests) -> list[Preference]`` (plus one-item conveniences), so the pass-rate and
win-rate bookkeeping of :mod:`codetool.eval.stabletoolbench` never knows which judge it talks to:

- :class:`LLMJudge` over any ``codetool.models`` backend: an OpenAI-compatible endpoint (the model
  writes a JSON object; unparseable replies are retried, then read leniently) or a local
  transformers model (by default it scores the three labels with ``option_logprobs``, which
  never fails to parse, and samples among them at the judge temperature);
- :class:`ScriptedJudge` for tests and replays of recorded verdicts.

Guarantees: the prompts are ours (``codetool/prompts/judge_*.txt``); every prompt goes through
``codetool.secrets.redact`` before it is sent, so a key echoed by a tool into an answer never
reaches the judge (the API key itself only travels in the backend's HTTP header, read from the
environment); every verdict of an LLMJudge is cached on disk (JSONL, one line per verdict) under
a hash of the judge, the sampling settings, the round and the full prompt, so a rerun costs
nothing and a killed run resumes. Not guaranteed: that a small local judge agrees with GPT-class
judges. The default local model (SmolLM2-135M) is close to chance; reports flag such a judge as
weak (``Judge.weak``) and their numbers as a smoke test only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tqdm.auto import tqdm

from codetool import CodetoolError
from codetool.config import ConfigError, option
from codetool.jsonl import append_jsonl, read_jsonl
from codetool.models.remote import RemoteConfig
from codetool.secrets import redact

logger = logging.getLogger(__name__)

LABELS = ("Solved", "Unsure", "Unsolved")
LABEL_SCORES = {"Solved": 1.0, "Unsure": 0.5, "Unsolved": 0.0}
WINNERS = ("a", "b", "tie")
_FIELDS = re.compile(r"\{(query|answer|trajectory|answer_a|answer_b)\}")
PROTOCOLS = ("stabletoolbench", "codetool")
PAPER_JUDGE = "gpt-4-turbo-2024-04-09"  # the judge of CodeTool's and StableToolBench's tables
# Forced function calls (OpenAI ``tools`` + ``tool_choice``), as StableToolBench's evaluator asks.
_FUNCTIONS = {
    "answer_status": ("record_answer_status", "Record the label of the answer."),
    "preferred": ("record_preference", "Record which answer is better."),
}


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
    """

    label: str
    reason: str = ""
    source: str = "answer"
    cached: bool = False
    parse_failed: bool = False

    @property
    def score(self) -> float:
        return LABEL_SCORES[self.label]


@dataclass
class Preference:
    """Which of two answers won one comparison: ``winner`` is ``a``, ``b`` or ``tie``.

    ``source`` is ``rule`` when no judge call was needed (one answer solved, or identical answers);
    ``cached`` and ``parse_failed`` as in :class:`Verdict` (a failed parse is a tie).
    """

    winner: str
    reason: str = ""
    source: str = "judge"
    cached: bool = False
    parse_failed: bool = False


@dataclass
class AnswerRequest:
    """One final answer to label; ``trajectory`` (rendered text) asks for the detailed check."""

    query: str
    answer: str
    trajectory: str | None = None
    round: int = 0


@dataclass
class CompareRequest:
    """Two final answers to the same query, shown as A and B.

    ``details_a`` / ``details_b`` (the whole answers with their steps and tool calls, as
    :func:`codetool.eval.stabletoolbench.answer_details` lays them out) ask for StableToolBench's
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


def extract_json(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` (fenced or inline), or ``None``."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text or ""):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_choice(text: str, field: str, allowed: tuple[str, ...]) -> tuple[str, str] | None:
    """Read ``field`` from a judge reply: ``(value, reason)`` with ``value`` spelled as in ``allowed``
    (case-insensitive), or ``None`` when the reply holds no valid value. Reads a JSON object first,
    then a ``"field": "value"`` fragment of a cut-off reply."""
    lookup = {a.lower(): a for a in allowed}
    data = extract_json(text)
    if data is not None and str(data.get(field, "")).strip().lower() in lookup:
        return lookup[str(data[field]).strip().lower()], str(data.get("reason", ""))[:500]
    match = re.search(rf'"?{field}"?\s*:\s*"?([A-Za-z]+)', text or "")
    if match and match.group(1).lower() in lookup:
        return lookup[match.group(1).lower()], ""
    return None


class JudgeCache:
    """Verdicts on disk by key: a JSONL file read once, appended to after every batch.

    Args:
        path (`str` or `None`): the JSONL file; ``None`` keeps verdicts in memory only.
    """

    def __init__(self, path: str | None):
        self.path = path
        self.records: dict[str, dict] = {}
        if path:
            for record in read_jsonl(path):
                if "key" in record:
                    self.records[record["key"]] = record
            logger.debug("judge cache %s: %d verdicts", path, len(self.records))

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def put(self, record: dict) -> None:
        self.records[record["key"]] = record
        if self.path:
            append_jsonl(self.path, record)


class LLMJudge(Judge):
    """A judge on an LLM backend (``generate`` / ``option_logprobs``, see ``codetool.models``).

    Args:
        backend (`LLMBackend` or `Callable[[], LLMBackend]`): the model, or a function that loads
            it (called on the first verdict that is not cached).
        name (`str`, *optional*): shown in reports; defaults to the backend's name.
        kind (`str`, *optional*, defaults to `"openai"`): ``openai`` or ``local`` (for reports).
        weak (`bool`, *optional*, defaults to `False`): flag the judge as weak in reports.
        cache_path (`str`, *optional*): JSONL file of cached verdicts (``None``: memory only).
        mode (`str`, *optional*, defaults to `"auto"`): ``json`` (the model writes a JSON object),
            ``tools`` (a forced function call: OpenAI ``tools`` + ``tool_choice``; a server that
            refuses it falls back to ``json``, counted in ``tool_fallbacks``), ``options`` (score
            the labels with ``option_logprobs``), or ``auto`` (``options`` for a local backend
            that supports it, else ``json``).
        temperature (`float`, *optional*, defaults to 0.2): sampling temperature (StableToolBench's
            evaluator uses 0.2); rounds differ through the seed. 0 makes every round identical.
        max_new_tokens (`int`, *optional*, defaults to 256): reply length in ``json`` mode.
        retries (`int`, *optional*, defaults to 2): extra attempts for a reply that does not parse
            (at temperature >= 0.7 with a new seed).
        batch_size (`int`, *optional*, defaults to 8): prompts per backend call (cached after each).
        max_answer_chars (`int`, *optional*, defaults to 2000): answers are cut to this length.
        max_trajectory_chars (`int`, *optional*, defaults to 6000): trajectories are cut to this.
    """

    def __init__(self, backend, *, name: str | None = None, kind: str = "openai", weak: bool = False,
                 cache_path: str | None = None, mode: str = "auto", temperature: float = 0.2,
                 max_new_tokens: int = 256, retries: int = 2, batch_size: int = 8,
                 max_answer_chars: int = 2000, max_trajectory_chars: int = 6000):
        if mode not in ("auto", "json", "options", "tools"):
            raise CodetoolError(f"judge mode must be auto, json, tools or options, got {mode!r}.")
        lazy = callable(backend) and not hasattr(backend, "generate")
        if mode == "auto":
            logprobs = True if lazy else getattr(backend, "supports_logprobs", False)
            mode = "options" if kind == "local" and logprobs else "json"
        self._backend, self.mode, self.kind, self.weak = backend, mode, kind, weak
        self._lazy = lazy
        self.name = name or getattr(backend, "name", "llm")
        self.temperature, self.max_new_tokens, self.retries = temperature, max_new_tokens, retries
        self.batch_size = max(1, batch_size)
        self.max_answer_chars, self.max_trajectory_chars = max_answer_chars, max_trajectory_chars
        self.cache = JudgeCache(cache_path)
        self.calls = 0  # prompts sent to the backend (not counting cache hits)
        self.tool_fallbacks = 0  # tools mode: prompts answered as JSON text instead
        self._logps: dict[tuple[str, str], list[float]] = {}  # options mode: (prompt, field) -> log-probs
        self.templates = {name: load_prompt(f"judge_{name}")
                          for name in ("answer", "trajectory", "compare", "compare_details")}

    @property
    def backend(self):
        """The model; a factory given instead is called on first use (cached reruns never load it)."""
        if self._lazy:
            self._backend, self._lazy = self._backend(), False
        return self._backend

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(mode=self.mode, temperature=self.temperature, tool_fallbacks=self.tool_fallbacks)
        return info

    def _key(self, task: str, prompt: str, round: int) -> str:
        blob = json.dumps({"judge": self.name, "mode": self.mode, "temperature": self.temperature,
                           "max_new_tokens": self.max_new_tokens, "task": task, "round": round,
                           "prompt": prompt}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        """Label each answer; requests with ``trajectory`` use the detailed prompt."""
        prompts, tasks = [], []
        for req in requests:
            fields = {"query": clip(req.query, self.max_answer_chars),
                      "answer": clip(req.answer, self.max_answer_chars)}
            if req.trajectory is None:
                prompts.append(render_prompt(self.templates["answer"], **fields))
                tasks.append("answer")
            else:
                fields["trajectory"] = clip(req.trajectory, self.max_trajectory_chars)
                prompts.append(render_prompt(self.templates["trajectory"], **fields))
                tasks.append("trajectory")
        records = self._run(prompts, tasks, [r.round for r in requests], "answer_status", LABELS)
        return [Verdict(r["value"] if r["value"] else "Unsolved", r["reason"], task,
                        cached=r["cached"], parse_failed=r["value"] is None)
                for r, task in zip(records, tasks)]

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        """Pick the better answer of each pair (``a``, ``b`` or ``tie``; requests with details compare
        the whole answers, requests with ``allow_tie`` False get A or B only). Requests are judged
        in groups of the same kind, in order."""
        out: list[Preference | None] = [None] * len(requests)
        kinds: dict[tuple[bool, bool], list[int]] = {}
        for i, r in enumerate(requests):
            kinds.setdefault((r.details_a is not None, r.allow_tie), []).append(i)
        for (details, tie), idx in kinds.items():
            prompts = []
            for i in idx:
                r = requests[i]
                a, b = (r.details_a, r.details_b) if details else (r.answer_a, r.answer_b)
                limit = self.max_trajectory_chars if details else self.max_answer_chars
                prompts.append(render_prompt(self.templates["compare_details" if details else "compare"],
                                             query=clip(r.query, self.max_answer_chars),
                                             answer_a=clip(a, limit), answer_b=clip(b or "", limit)))
            task = "compare_details" if details else "compare"
            records = self._run(prompts, [task] * len(prompts), [requests[i].round for i in idx], "preferred",
                                ("A", "B", "tie") if tie else ("A", "B"))
            for i, r in zip(idx, records):
                out[i] = Preference(r["value"].lower() if r["value"] else "tie", r["reason"], "judge",
                                    cached=r["cached"], parse_failed=r["value"] is None)
        return out  # type: ignore[return-value]

    def _run(self, prompts: list[str], tasks: list[str], rounds: list[int], field: str,
             allowed: tuple[str, ...]) -> list[dict]:
        """Cached values for every prompt; the misses go to the backend in batches."""
        keys = [self._key(t, p, r) for p, t, r in zip(prompts, tasks, rounds)]
        out: list[dict | None] = []
        for key in keys:
            hit = self.cache.get(key)
            out.append(dict(hit, cached=True) if hit else None)
        missing = [i for i, r in enumerate(out) if r is None]
        starts = range(0, len(missing), self.batch_size)
        for start in tqdm(starts, desc=f"judge {self.name}", unit="batch", disable=len(starts) < 2):
            chunk = missing[start:start + self.batch_size]
            ask = {"options": self._ask_options, "tools": self._ask_tools}.get(self.mode, self._ask_json)
            values = ask([prompts[i] for i in chunk], [keys[i] for i in chunk], field, allowed)
            for i, (value, reason, raw) in zip(chunk, values):
                record = {"key": keys[i], "task": tasks[i], "round": rounds[i], "judge": self.name,
                          "value": value, "reason": reason, "raw": clip(raw, 1000)}
                self.cache.put(record)
                out[i] = dict(record, cached=False)
        return out  # type: ignore[return-value]

    def _ask_json(self, prompts: list[str], keys: list[str], field: str,
                  allowed: tuple[str, ...]) -> list[tuple[str | None, str, str]]:
        results: list[tuple[str | None, str, str]] = [(None, "", "")] * len(prompts)
        pending = list(range(len(prompts)))
        for attempt in range(self.retries + 1):
            if not pending:
                break
            temperature = self.temperature if attempt == 0 else max(self.temperature, 0.7)
            seed = int(keys[pending[0]][:8], 16) + attempt
            batch = self.backend.generate([[{"role": "user", "content": prompts[i]}] for i in pending], n=1,
                                          temperature=temperature, top_p=1.0,
                                          max_new_tokens=self.max_new_tokens, seed=seed)
            self.calls += len(pending)
            still = []
            for i, completions in zip(pending, batch):
                text = completions[0].text
                parsed = parse_choice(text, field, allowed)
                if parsed is None:
                    results[i] = (None, "the judge's reply could not be read", text)
                    still.append(i)
                else:
                    results[i] = (parsed[0], parsed[1], text)
            if still:
                logger.warning("judge %s: %d replies without a valid '%s' (attempt %d of %d)", self.name,
                               len(still), field, attempt + 1, self.retries + 1)
            pending = still
        return results

    def _ask_tools(self, prompts: list[str], keys: list[str], field: str,
                   allowed: tuple[str, ...]) -> list[tuple[str | None, str, str]]:
        """Forced function calls (``tools`` + ``tool_choice``); replies that do not parse, and
        servers that refuse tools, go through :meth:`_ask_json` instead."""
        from concurrent.futures import ThreadPoolExecutor

        backend = self.backend
        chat = getattr(backend, "chat", None)  # OpenAIBackend's one chat-completions request
        if chat is None:
            self.tool_fallbacks += len(prompts)
            return self._ask_json(prompts, keys, field, allowed)
        name, description = _FUNCTIONS[field]
        schema = {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "required": ["reason", field], "properties": {
                "reason": {"type": "string", "description": "one short sentence"},
                field: {"type": "string", "enum": list(allowed)}}}}}
        note = f"\n\nGive your reply by calling the function {name}."

        def one(j: int) -> tuple[str | None, str, str]:
            body = chat([{"role": "user", "content": prompts[j] + note}], tools=[schema],
                        tool_choice={"type": "function", "function": {"name": name}},
                        temperature=self.temperature, max_tokens=self.max_new_tokens,
                        seed=int(keys[j][:8], 16))
            message = ((body.get("choices") or [{}])[0].get("message") or {})
            calls = message.get("tool_calls") or []
            raw = calls[0].get("function", {}).get("arguments", "") if calls else (message.get("content") or "")
            parsed = parse_choice(raw if isinstance(raw, str) else json.dumps(raw), field, allowed)
            return (parsed[0], parsed[1], str(raw)) if parsed else (None, "", str(raw))

        from codetool.models.openai_backend import EndpointError

        try:
            with ThreadPoolExecutor(max_workers=max(1, min(getattr(backend, "max_concurrency", 8),
                                                           len(prompts)))) as pool:
                results = list(pool.map(one, range(len(prompts))))
        except EndpointError as e:
            if e.status not in (400, 404, 422):
                raise
            logger.warning("judge %s: the server refused forced function calls (%s); using JSON text replies",
                           self.name, e)
            self.mode = "json"
            self.tool_fallbacks += len(prompts)
            return self._ask_json(prompts, keys, field, allowed)
        self.calls += len(prompts)
        failed = [j for j, r in enumerate(results) if r[0] is None]
        if failed:
            self.tool_fallbacks += len(failed)
            retried = self._ask_json([prompts[j] for j in failed], [keys[j] for j in failed], field, allowed)
            for j, r in zip(failed, retried):
                results[j] = r
        return results

    def _ask_options(self, prompts: list[str], keys: list[str], field: str,
                     allowed: tuple[str, ...]) -> list[tuple[str | None, str, str]]:
        # The reply starts like the JSON the prompt asks for; only the value differs between options.
        options = [f'{{"{field}": "{value}"' for value in allowed]
        # The log-probs do not depend on the round: score each distinct prompt once, sample per round.
        new = list(dict.fromkeys(p for p in prompts if (p, field) not in self._logps))
        if new:
            try:
                scored = self.backend.option_logprobs([[{"role": "user", "content": p}] for p in new], options)
            except NotImplementedError as e:
                raise CodetoolError(f"judge {self.name}: judge.mode options needs token log-probabilities, but {e}; "
                                    "set --judge.mode json or tools.") from None
            self._logps.update({(p, field): s for p, s in zip(new, scored)})
            self.calls += len(new)
        scores = [self._logps[(p, field)] for p in prompts]
        results = []
        for key, logps in zip(keys, scores):
            if self.temperature <= 0:
                pick = max(range(len(allowed)), key=lambda j: logps[j])
            else:
                top = max(logps)
                weights = [math.exp((lp - top) / self.temperature) for lp in logps]
                pick = random.Random(int(key[:16], 16)).choices(range(len(allowed)), weights=weights)[0]
            shown = ", ".join(f"{a} {lp:.2f}" for a, lp in zip(allowed, logps))
            results.append((allowed[pick], f"option log-probs: {shown}", shown))
        return results


@dataclass
class JudgeConfig:
    """Which judge scores answers, and by which procedure (``codetool eval --judge.model ...``).

    ``protocol`` picks the procedure (see :mod:`codetool.eval.stabletoolbench`):
    ``stabletoolbench`` (its evaluator: two stages, an Unsure answer decided again from the whole
    answer with its details; forced function calls where the server supports them; temperature
    0.2; 3 rounds) or ``codetool`` (the CodeTool paper's single pass on the query and final answer
    at temperature 0, one round). ``rounds`` and ``temperature`` left empty take the protocol's.
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
    max_new_tokens: int = option(256, "most tokens of a judge reply (json mode)")
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
    seed: int = option(0, "seed of the win rate's coin flips (identical answers, undecided comparisons)")

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"judge.protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}.")
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
        CodetoolError: what the backend raises (a missing default model, a server that is not
            reachable, a missing API key variable).
    """
    if not cfg.enabled:
        return None
    from codetool.models.spec import ModelSpec

    spec = ModelSpec.parse(cfg.model, role="judge", remote_model=cfg.remote_model, api_key_env=cfg.api_key_env,
                           dtype=cfg.dtype, device=cfg.device, client=cfg.client)
    remote = spec.remote
    if remote:
        backend = spec.build()
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
        backend = spec.build  # loaded on the first verdict that is not cached
        name = f"local:{cfg.model}"
    weak = (not remote) if cfg.weak is None else cfg.weak
    mode = cfg.mode
    if mode == "auto" and remote:
        mode = "tools" if cfg.protocol == "stabletoolbench" else "json"
    return LLMJudge(backend, name=name, kind="openai" if remote else "local", weak=weak,
                    cache_path=cfg.cache or cache_path, mode=mode, temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens, retries=cfg.retries,
                    batch_size=cfg.batch_size or (cfg.client.max_in_flight if remote else 8),
                    max_answer_chars=cfg.max_answer_chars,
                    max_trajectory_chars=cfg.max_trajectory_chars or 10**9)
