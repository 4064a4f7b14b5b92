"""The LLM judge: :class:`LLMJudge` over any ``codetool.models`` backend.

An OpenAI-compatible endpoint writes a JSON object or answers a forced function call (OpenAI
``tools`` + ``tool_choice``, as both StableToolBench's and CodeTool's judges ask); unparseable
replies are retried, then read leniently. A local transformers model by default scores the labels
with ``option_logprobs``, which never fails to parse, and samples among them at the judge
temperature.

Guarantees: every prompt goes through ``codetool.secrets.redact`` before it is sent, so a key
echoed by a tool into an answer never reaches the judge (the API key itself only travels in the
backend's HTTP header, read from the environment); with reference prompts
(:mod:`codetool.judge.reference_prompts`) the prompt is the reference's template filled as the
reference fills it and the forced function is the reference's own; every verdict is cached on
disk (JSONL, one line per verdict) under a hash of the judge, the sampling settings, the round,
the full prompt (and the reference's function), so a rerun costs nothing and a killed run
resumes. Not guaranteed: that a small local judge agrees with GPT-class judges. The default local
model (SmolLM2-135M) is close to chance; reports flag such a judge as weak (``Judge.weak``) and
its numbers as a smoke test only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import threading
from typing import Any

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.judge.cache import JudgeCache
from codetool.judge.records import (
    LABELS,
    AnswerRequest,
    CompareRequest,
    JudgeMixin,
    Preference,
    Verdict,
)
from codetool.progress import ProgressFactory, ticker
from codetool.prompts import fill as fill_prompt
from codetool.prompts import load as load_prompt
from codetool.prompts import path_of as prompt_path
from codetool.secrets import redact
from codetool.streaming import stream
from codetool.text import clip

logger = logging.getLogger(__name__)

# Forced function calls (OpenAI ``tools`` + ``tool_choice``), as StableToolBench's evaluator asks.
_FUNCTIONS = {
    "answer_status": ("record_answer_status", "Record the label of the answer."),
    "preferred": ("record_preference", "Record which answer is better."),
}


def render_prompt(template: str, /, source: str = "a judge prompt", **fields: str) -> str:
    """Fill ``{query}``, ``{answer}``, ... in one pass (:func:`codetool.prompts.fill`: a value that
    contains ``{answer}`` is left alone, a missing or unknown field is refused, naming ``source``)
    and redact secrets from the result."""
    return redact(fill_prompt(template, fields, source=source))


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
    then a ``"field": "value"`` fragment of a cut-off reply. A whole number (StableToolBench's
    ``index``) reads as its digits: ``1.0`` is ``"1"``."""
    lookup = {a.lower(): a for a in allowed}
    data = extract_json(text)
    if data is not None:
        value = data.get(field, "")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if str(value).strip().lower() in lookup:
            return lookup[str(value).strip().lower()], str(data.get("reason", ""))[:500]
    match = re.search(rf'"?{field}"?\s*:\s*"?([A-Za-z0-9]+)', text or "")
    if match and match.group(1).lower() in lookup:
        return lookup[match.group(1).lower()], ""
    return None


class LLMJudge(JudgeMixin):
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
        batch_size (`int`, *optional*, defaults to 8): prompts per backend call (cached after each);
            against a server (a ``continuous`` backend) the requests in flight, one per prompt, each
            verdict cached as it lands (its seed from its own key, not from its batch's first).
        max_answer_chars (`int`, *optional*, defaults to 2000): answers are cut to this length
            (our prompts only; reference prompts get what the reference procedure gives them).
        max_trajectory_chars (`int`, *optional*, defaults to 6000): trajectories are cut to this
            (our prompts only).
        reference (`ReferencePrompts`, *optional*): judge with a reference's prompts and forced
            functions (:mod:`codetool.judge.reference_prompts`); tasks it has no prompt for use ours.
        progress (`ProgressFactory`, *optional*): told the number of batches each call sends to the
            backend (when it sends any) and ticked after each (:mod:`codetool.progress`); a command may
            also set the ``progress`` attribute after :func:`codetool.assemble.make_judge`.
    """

    def __init__(self, backend, *, name: str | None = None, kind: str = "openai", weak: bool = False,
                 cache_path: str | None = None, mode: str = "auto", temperature: float = 0.2,
                 max_new_tokens: int = 256, retries: int = 2, batch_size: int = 8,
                 max_answer_chars: int = 2000, max_trajectory_chars: int = 6000, reference=None,
                 progress: ProgressFactory | None = None):
        if mode not in ("auto", "json", "options", "tools"):
            raise CodetoolError(f"judge mode must be auto, json, tools or options, got {mode!r}.")
        lazy = callable(backend) and not hasattr(backend, "generate")
        if mode == "auto":
            logprobs = True if lazy else getattr(backend, "supports_logprobs", False)
            mode = "options" if kind == "local" and logprobs else "json"
        self._backend, self.mode, self.kind, self.weak = backend, mode, kind, weak
        self._lazy = lazy
        self.name = name or str(getattr(backend, "name", "llm"))
        self.temperature, self.max_new_tokens, self.retries = temperature, max_new_tokens, retries
        self.batch_size = max(1, batch_size)
        self.max_answer_chars, self.max_trajectory_chars = max_answer_chars, max_trajectory_chars
        self.cache = JudgeCache(cache_path)
        self.calls = 0  # prompts sent to the backend (not counting cache hits)
        self.tool_fallbacks = 0  # tools mode: prompts answered as JSON text instead
        self.errors = 0  # requests that failed after their retries (error records, not cached)
        self._lock = threading.Lock()
        self._logps: dict[tuple[str, str], list[float]] = {}  # options mode: (prompt, field) -> log-probs
        self.templates = {name: load_prompt(f"judge_{name}")
                          for name in ("answer", "trajectory", "compare", "compare_details")}
        self.reference = reference
        self.progress = progress

    def _count(self, name: str, n: int) -> None:
        """Add ``n`` to the counter ``name`` (verdicts are asked from several threads on a server)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    @property
    def backend(self):
        """The model; a factory given instead is called on first use (cached reruns never load it)."""
        if self._lazy:
            self._backend, self._lazy = self._backend(), False
        return self._backend

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(mode=self.mode, temperature=self.temperature, tool_fallbacks=self.tool_fallbacks,
                    prompts=self.reference.kind if self.reference is not None else "ours")
        return info

    def _key(self, task: str, prompt: str, round: int, tool: dict | None = None) -> str:
        data = {"judge": self.name, "mode": self.mode, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "task": task, "round": round, "prompt": prompt}
        if tool is not None:  # a reference's function (with or without its reason field)
            data["tool"] = tool
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def _reference_prompt(self, task: str):
        return self.reference.prompts.get(task) if self.reference is not None else None

    def judge_answers(self, requests: list[AnswerRequest]) -> list[Verdict]:
        """Label each answer; requests with ``trajectory`` use the detailed prompt. With reference
        prompts the detailed prompt's ``{answer}`` is the request's ``trajectory`` (StableToolBench's
        ``parse_answer_status`` reads the whole answer there), and nothing is cut."""
        prompts, tasks, tools = [], [], []
        for req in requests:
            task = "answer" if req.trajectory is None else "trajectory"
            ref = self._reference_prompt(task)
            if ref is not None:
                prompts.append(redact(ref.render(query=req.query, answer=req.answer if req.trajectory is None
                                                 else req.trajectory)))
                tools.append(ref.tool(req.reason))
            else:
                fields = {"query": clip(req.query, self.max_answer_chars),
                          "answer": clip(req.answer, self.max_answer_chars)}
                if req.trajectory is not None:
                    fields["trajectory"] = clip(req.trajectory, self.max_trajectory_chars)
                prompts.append(render_prompt(self.templates[task], prompt_path(f"judge_{task}"), **fields))
                tools.append(None)
            tasks.append(task)
        records = self._run(prompts, tasks, [r.round for r in requests], "answer_status", LABELS, tools)
        return [Verdict(r["value"] if r["value"] else "Unsolved", r["reason"], task,
                        cached=r["cached"], parse_failed=r["value"] is None and not r.get("error"),
                        error=r.get("error"))
                for r, task in zip(records, tasks)]

    def compare_many(self, requests: list[CompareRequest]) -> list[Preference]:
        """Pick the better answer of each pair (``a``, ``b`` or ``tie``; requests with details compare
        the whole answers, requests with ``allow_tie`` False get A or B only). Requests are judged
        in groups of the same kind, in order. With reference prompts a comparison of whole answers
        shows ``details_a`` as ``{answer_0}`` and ``details_b`` as ``{answer_1}``, and the judge's
        ``index`` 0 / 1 is ``a`` / ``b``."""
        out: list[Preference | None] = [None] * len(requests)
        kinds: dict[tuple[bool, bool], list[int]] = {}
        for i, r in enumerate(requests):
            kinds.setdefault((r.details_a is not None, r.allow_tie), []).append(i)
        for (details, tie), idx in kinds.items():
            task = "compare_details" if details else "compare"
            ref = self._reference_prompt(task)
            prompts, tools = [], []
            for i in idx:
                r = requests[i]
                if ref is not None:
                    prompts.append(redact(ref.render(query=r.query, answer_0=r.details_a or "",
                                                     answer_1=r.details_b or "")))
                    tools.append(ref.tool(True))
                    continue
                a, b = (r.details_a, r.details_b) if details else (r.answer_a, r.answer_b)
                limit = self.max_trajectory_chars if details else self.max_answer_chars
                prompts.append(render_prompt(self.templates[task], prompt_path(f"judge_{task}"),
                                             query=clip(r.query, self.max_answer_chars),
                                             answer_a=clip(a, limit), answer_b=clip(b or "", limit)))
                tools.append(None)
            rounds = [requests[i].round for i in idx]
            if ref is not None:
                records = self._run(prompts, [task] * len(prompts), rounds, ref.value_field, ("0", "1"), tools)
                picks = [{"0": "a", "1": "b"}.get(r["value"] or "") for r in records]
            else:
                records = self._run(prompts, [task] * len(prompts), rounds, "preferred",
                                    ("A", "B", "tie") if tie else ("A", "B"))
                picks = [r["value"].lower() if r["value"] else None for r in records]
            for i, record, pick in zip(idx, records, picks):
                out[i] = Preference(pick or "tie", record["reason"], "judge", cached=record["cached"],
                                    parse_failed=pick is None and not record.get("error"), error=record.get("error"))
        return out  # type: ignore[return-value]

    def _run(self, prompts: list[str], tasks: list[str], rounds: list[int], field: str,
             allowed: tuple[str, ...], tools: list[dict | None] | None = None) -> list[dict]:
        """Cached values for every prompt; the misses go to the backend in batches (a server: one
        request per prompt, ``batch_size`` in flight, :func:`codetool.streaming.stream`). ``tools`` (a
        reference's function per prompt, ``None``: ours) is what a forced call sends. A batch whose
        request fails (after the backend's retries) is asked again one prompt at a time; a prompt
        that still fails gets a record with its ``error`` (not cached), so one failed request is
        that query's error, not the end of the evaluation."""
        tools = tools or [None] * len(prompts)
        keys = [self._key(t, p, r, tool) for p, t, r, tool in zip(prompts, tasks, rounds, tools)]
        out: list[dict | None] = []
        for key in keys:
            hit = self.cache.get(key)
            out.append(dict(hit, cached=True) if hit else None)
        missing = [i for i, r in enumerate(out) if r is None]

        def keep(chunk: list[int], values: list) -> None:
            for i, (value, reason, raw, error) in zip(chunk, values):
                record = {"key": keys[i], "task": tasks[i], "round": rounds[i], "judge": self.name,
                          "value": value, "reason": reason, "raw": clip(raw, 1000)}
                if error is None:
                    self.cache.put(record)
                    out[i] = dict(record, cached=False)
                else:
                    out[i] = dict(record, cached=False, error=error)

        def ask(chunk: list[int]) -> tuple[list[int], list]:
            return chunk, self._ask_each([prompts[i] for i in chunk], [keys[i] for i in chunk], field, allowed,
                                         [tools[i] for i in chunk])

        if missing and getattr(self.backend, "continuous", False):
            # A server: one request per prompt, batch_size of them in flight, each verdict kept (and
            # cached) as it lands, so no request waits for the slowest of a batch (issue 39).
            tick = ticker(self.progress if missing else None, len(missing))  # one long request is progress too

            def landed(result: tuple[list[int], list]) -> None:
                keep(*result)
                tick(len(result[0]))

            stream(ask, ([i] for i in missing), self.batch_size, landed)
            return out  # type: ignore[return-value]
        starts = range(0, len(missing), self.batch_size)
        tick = ticker(self.progress if starts else None, len(starts))  # one long batch is progress too
        for first in starts:
            chunk = missing[first:first + self.batch_size]
            keep(*ask(chunk))
            tick(len(chunk))
        return out  # type: ignore[return-value]

    def _ask_each(self, prompts: list[str], keys: list[str], field: str, allowed: tuple[str, ...],
                  tools: list[dict | None]) -> list[tuple[str | None, str, str, str | None]]:
        """``(value, reason, raw, error)`` per prompt: the batch in one call; if that raises, each
        prompt alone, and a prompt whose request still fails gets its one-line ``error``."""
        ask = {"options": self._ask_options, "tools": self._ask_tools}.get(self.mode, self._ask_json)
        try:
            return [(*v, None) for v in ask(prompts, keys, field, allowed, tools)]
        except ConfigError:  # a setting the judge cannot follow (judge.mode options without log-probs)
            raise
        except CodetoolError as e:
            if len(prompts) == 1:
                error = redact(" ".join(f"{type(e).__name__}: {e}".split()))[:500]
                logger.warning("judge %s: a request failed after its retries (%s); that verdict is an error record",
                               self.name, error)
                self._count("errors", 1)
                return [(None, "the judge request failed", "", error)]
            logger.warning("judge %s: a batch of %d requests failed (%s); asking one at a time", self.name,
                           len(prompts), " ".join(str(e).split())[:200])
        return [v for j in range(len(prompts))
                for v in self._ask_each([prompts[j]], [keys[j]], field, allowed, [tools[j]])]

    def _ask_json(self, prompts: list[str], keys: list[str], field: str, allowed: tuple[str, ...],
                  tools: list[dict | None] | None = None) -> list[tuple[str | None, str, str]]:
        results: list[tuple[str | None, str, str]] = [(None, "", "")] * len(prompts)
        # a reference prompt asks for a function call: as text, the reply is that call's JSON arguments
        prompts = [p if not tool else p + f'\n\nReply with the JSON arguments of {tool["function"].get("name")}: '
                   f'{{"{field}": ..., "reason": ...}}.' for p, tool in zip(prompts, tools or [None] * len(prompts))]
        pending = list(range(len(prompts)))
        for attempt in range(self.retries + 1):
            if not pending:
                break
            temperature = self.temperature if attempt == 0 else max(self.temperature, 0.7)
            seed = int(keys[pending[0]][:8], 16) + attempt
            batch = self.backend.generate([[{"role": "user", "content": prompts[i]}] for i in pending], n=1,
                                          temperature=temperature, top_p=1.0,
                                          max_new_tokens=self.max_new_tokens, seed=seed)
            self._count("calls", len(pending))
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

    def _ask_tools(self, prompts: list[str], keys: list[str], field: str, allowed: tuple[str, ...],
                   tools: list[dict | None] | None = None) -> list[tuple[str | None, str, str]]:
        """Forced function calls (``tools`` + ``tool_choice``); replies that do not parse, and
        servers that refuse tools, go through :meth:`_ask_json` instead. A reference's function
        (``tools``) is sent as the reference sends it, the prompt unchanged; ours gets our schema
        and a line naming the function."""
        from concurrent.futures import ThreadPoolExecutor

        tools = tools or [None] * len(prompts)
        backend = self.backend
        chat = getattr(backend, "chat", None)  # OpenAIBackend's one chat-completions request
        if chat is None:
            self._count("tool_fallbacks", len(prompts))
            return self._ask_json(prompts, keys, field, allowed, tools)
        name, description = _FUNCTIONS.get(field, ("record_" + field, "Record the value."))
        ours: dict[str, Any] = {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "required": ["reason", field], "properties": {
                "reason": {"type": "string", "description": "one short sentence"},
                field: {"type": "string", "enum": list(allowed)}}}}}

        def one(j: int) -> tuple[str | None, str, str]:
            schema = tools[j] or ours
            called = schema["function"]["name"]
            text = prompts[j] if tools[j] else prompts[j] + f"\n\nGive your reply by calling the function {called}."
            body = chat([{"role": "user", "content": text}], tools=[schema],
                        tool_choice={"type": "function", "function": {"name": called}},
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
            self._count("tool_fallbacks", len(prompts))
            return self._ask_json(prompts, keys, field, allowed, tools)
        self._count("calls", len(prompts))
        failed = [j for j, r in enumerate(results) if r[0] is None]
        if failed:
            self._count("tool_fallbacks", len(failed))
            retried = self._ask_json([prompts[j] for j in failed], [keys[j] for j in failed], field, allowed,
                                     [tools[j] for j in failed])
            for j, r in zip(failed, retried):
                results[j] = r
        return results

    def _ask_options(self, prompts: list[str], keys: list[str], field: str, allowed: tuple[str, ...],
                     tools: list[dict | None] | None = None) -> list[tuple[str | None, str, str]]:
        # The reply starts like the JSON the prompt asks for; only the value differs between options.
        options = [f'{{"{field}": "{value}"' for value in allowed]
        # The log-probs do not depend on the round: score each distinct prompt once, sample per round.
        new = list(dict.fromkeys(p for p in prompts if (p, field) not in self._logps))
        if new:
            try:
                scored = self.backend.option_logprobs([[{"role": "user", "content": p}] for p in new], options)
            except NotImplementedError as e:  # every verdict would fail alike: the setting is wrong
                raise ConfigError(f"judge {self.name}: judge.mode options needs token log-probabilities, but {e}; "
                                  "set --judge.mode json or tools.") from None
            self._logps.update({(p, field): s for p, s in zip(new, scored)})
            self._count("calls", len(new))
        scores = [self._logps[(p, field)] for p in prompts]
        results: list[tuple[str | None, str, str]] = []
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
