"""OpenAI-compatible chat completions over HTTP (vLLM, SGLang, ``transformers serve``, hosted APIs).

Requests go through :class:`~codetool.models.remote.RemoteClient` (one or several endpoints,
sequences in flight, timeouts, retries, failover; settings ``policy_client.*``/``judge.client.*``).
The backend takes servers as they are (issue 25): what a server does with ``n``, ``seed``,
sampling, continuation, constraints, ``logprobs`` and ``tool_choice`` is probed with tiny requests
the first time it matters (:mod:`codetool.models.openai_probe`), once per backend (``tool_choice``
is read off the first forced function call), and the requests adapt:

- **continuation** refused: the final assistant message (the search's opening code fence) is
  asked for in the last user message instead (``prompts/reply_prefix.txt``); a stop string that
  the prefix contains is not sent (it would end the reply at its own opening fence) but applied
  to the reply, from the prefix on (:func:`~codetool.models.openai_probe.without_prefix`);
- **n** ignored: each sample is its own request with its own seed (``seed``, ``seed'``...), sent
  together; missing choices are re-requested with new seeds, never the same one;
- **sampling** only with ``generation_config`` (``transformers serve``): sent with ``do_sample``;
- **seed** refused: left out (samples are then not reproducible);
- **constraints** (``generate(..., constraint=)``, issue 16): the regex goes into the field that
  works (``constraint_field: auto`` tries ``structured_outputs``, ``guided_regex``, ``regex``);
  where none does, :meth:`OpenAIBackend.check_constraints` stops the run with a one-line error
  (``require_constraints``) or warns once and samples unconstrained.

What was found and adapted is in :meth:`OpenAIBackend.serving_record` (copied into every
trajectory and the run summary). Prompts whose samples all came back identical at a temperature
above 0 are counted, with one warning when most are. A non-retryable HTTP 4xx names the setting
that put the refused field into the request.

The API key is read only from the environment variable named by ``api_key_env`` at request time;
it is sent as a bearer token and never logged, stored or put in an error message (HTTP 401/403
names the variable to set).

Limits: the server reports token usage per request, so with ``n > 1`` the completion tokens are
split among the samples in proportion to their length (the total is exact). ``option_logprobs``
is exact for an option that the greedy reply spells out and an upper bound for one that leaves it.
The continuation fallback relies on the model following the instruction, and without the stop
string on the server a reply runs to its end of turn or ``max_new_tokens``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from codetool import CodetoolError, prompts
from codetool.config import ConfigError
from codetool.models.completion import (
    Completion,
    Constraints,
    Prompt,
    Seeds,
    check_sampling,
    per_prompt,
    per_prompt_seeds,
    to_messages,
)
from codetool.models.openai_probe import (
    CONTINUATION,
    DO_SAMPLE,
    ServerFeatures,
    constraint_body,
    describe_refusal,
    note_tool_choice,
    probe_constraint,
    probe_continuation,
    probe_logprobs,
    probe_sampling,
    sample_seed,
    without_prefix,
)
from codetool.models.remote import (
    CONSTRAINT_FIELDS,
    EndpointError,
    RemoteClient,
    RemoteConfig,
    json_object,
    split_urls,
)
from codetool.secrets import key_from_env, redact

logger = logging.getLogger(__name__)

__all__ = ["CONSTRAINT_FIELDS", "EndpointError", "OpenAIBackend", "sample_seed"]

TOP_LOGPROBS = 20  # the most the OpenAI API (and vLLM by default) returns per position
# Constructor keywords of earlier versions -> RemoteConfig fields.
_LEGACY = {"timeout": "timeout_s", "max_concurrency": "max_in_flight"}
_PROBES = {"sampling": probe_sampling, "continuation": probe_continuation, "logprobs": probe_logprobs}
def _split_tokens(total: int, texts: list[str]) -> list[int]:
    """Split ``total`` tokens among ``texts`` in proportion to their length (largest remainder)."""
    weights = [max(len(t), 1) for t in texts]
    shares = [total * w / sum(weights) for w in weights]
    counts = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(texts)), key=lambda i: shares[i] - counts[i], reverse=True)
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def _base_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise CodetoolError(f"base_url must look like http://host:port/v1, got {url!r}.")
    return url.rstrip("/") + ("/v1" if parsed.path in ("", "/") else "")


def _affinity(messages: list[dict[str, str]]) -> str:
    """A request's affinity key: its first two messages (system prompt and query), which every
    step of a query shares, so its requests stay on one endpoint's prefix cache."""
    return "\x00".join(m["content"] for m in messages[:2])


class OpenAIBackend:
    """An :class:`~codetool.models.completion.LLMBackend` over an OpenAI-compatible server.

    Args:
        base_url (`str` or `list[str]`): e.g. ``http://127.0.0.1:8000/v1``; several endpoints of
            the same model as a list or comma-separated; a URL without a path gets ``/v1``.
        model (`str`, *optional*): the model name to request; defaults to the first model the
            server lists at ``/models``.
        api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`): name of the environment
            variable holding the key; unset means no ``Authorization`` header (local servers).
        client (`RemoteConfig`, *optional*): limits, timeouts, retries, constraint field.
        setting (`str`, *optional*, defaults to `"policy_client"`): the settings group of
            ``client``, named in errors.
        role (`str`, *optional*, defaults to `"policy"`): ``policy`` or ``judge``: which settings
            an HTTP 4xx names.
        **overrides: fields of ``client`` to replace (``timeout``/``max_concurrency`` are read as
            ``timeout_s``/``max_in_flight``).
    """

    supports_logprobs = True  # probed on first use: option_logprobs raises NotImplementedError if not
    continuous = True  # each search episode and tree node advances on its own (codetool.search)

    def __init__(self, base_url: str | list[str], model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 client: RemoteConfig | None = None, setting: str = "policy_client", role: str = "policy",
                 **overrides):
        overrides = {_LEGACY.get(k, k): v for k, v in overrides.items()}
        unknown = set(overrides) - {f.name for f in dataclasses.fields(RemoteConfig)}
        if unknown:
            raise TypeError(f"OpenAIBackend got unknown options {sorted(unknown)}")
        if overrides.get("constraint_field", "auto") not in ("auto", *CONSTRAINT_FIELDS):
            raise CodetoolError(f"constraint_field must be one of auto, {', '.join(CONSTRAINT_FIELDS)}, got "
                                f"{overrides['constraint_field']!r}.")
        self.config = dataclasses.replace(client or RemoteConfig(), **overrides)
        self.urls = [_base_url(u) for u in split_urls(base_url)]
        if not self.urls:
            raise CodetoolError(f"base_url must look like http://host:port/v1, got {base_url!r}.")
        self.base_url = self.urls[0]
        self.model, self.api_key_env, self.setting, self.role = model, api_key_env, setting, role
        key_from_env(api_key_env)  # refuse a blank key now; redact this variable's value by value
        self.name = f"openai:{','.join(self.urls)}" + (f"#{model}" if model else "")
        self.remote = RemoteClient(self.urls, self.config, setting=setting, headers=self._headers, clean=self._clean)
        self.features = ServerFeatures()
        self.adaptations: list[str] = []
        self._probe_lock = threading.Lock()
        self._lock = threading.Lock()
        self._constraints_off = False
        self._rows = self._identical_rows = 0
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------ plumbing
    @property
    def max_in_flight(self) -> int:
        return self.config.max_in_flight

    max_concurrency = max_in_flight  # the name the judge's forced function calls read

    @property
    def constraint_field(self) -> str:
        """The configured constraint field (``auto`` until probed, then the one found)."""
        found = self.features.constraint_field
        return self.config.constraint_field if found is None else (found or "none")

    def close(self) -> None:
        """Close the HTTP connections."""
        self.remote.close()

    def _headers(self) -> dict[str, str]:
        key = key_from_env(self.api_key_env)  # registered for redaction by value, whatever its name
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _clean(self, text: str) -> str:
        """Server text safe for an error message: secrets redacted, one line, short."""
        key = os.environ.get(self.api_key_env, "")
        text = redact(text.replace(key, "[REDACTED]") if key else text)
        return " ".join(text.split())[:200]

    def _describe(self, body: dict | None):
        """The message of an HTTP error for ``body`` (:func:`~codetool.models.openai_probe.describe_refusal`)."""
        def describe(url: str, status: int, text: str) -> str:
            return describe_refusal(url, status, text, body, role=self.role, key_env=self.api_key_env)
        return describe

    def _post(self, body: dict, *, key: str = "", units: int = 1) -> dict[str, Any]:
        """One ``/chat/completions`` request; a reply whose body is not a JSON object is a fault,
        retried like a 5xx (``RemoteClient.request``)."""
        body = {k: v for k, v in body.items() if v is not None}
        return self.remote.request("POST", "/chat/completions", body, key=key, units=units,
                                   describe=self._describe(body), parse=json_object)

    def resolved_model(self) -> str:
        """The model name sent with requests (asks the server's ``/models`` once if not given)."""
        with self._lock:
            if self.model is None:
                listing = self.remote.request("GET", "/models", describe=self._describe(None), parse=json_object)
                data = listing.get("data") or []
                if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "id" not in data[0]:
                    raise CodetoolError(f"{self.base_url}/models lists no model; pass the model name explicitly.")
                self.model = str(data[0]["id"])
                logger.info("%s serves %s", self.base_url, self.model)
        return self.model

    # ------------------------------------------------------------------------------- probing
    def _adapt(self, text: str, *, warn: bool = False) -> None:
        with self._lock:
            if text in self.adaptations:
                return
            self.adaptations.append(text)
        (logger.warning if warn else logger.info)("%s: %s", self.base_url, text)

    def feature(self, name: str):
        """The probed value of feature ``name`` (``sampling`` also gives ``n`` and ``seed``;
        ``constraint_field``), probing the server the first time (module docstring)."""
        attribute = "constraint_field" if name == "constraint" else name
        if getattr(self.features, attribute) is not None:
            return getattr(self.features, attribute)
        model = self.resolved_model()
        with self._probe_lock:
            if getattr(self.features, attribute) is None:
                def send(body: dict) -> dict:
                    return self._post({"model": model, **body})

                if name == "constraint":
                    fields = CONSTRAINT_FIELDS if self.config.constraint_field == "auto" else (
                        self.config.constraint_field,)
                    probe_constraint(send, self.features, fields)
                else:
                    _PROBES["sampling" if name in ("n", "seed") else name](send, self.features)
                self._record_probe(name)
        return getattr(self.features, attribute)

    def _record_probe(self, name: str) -> None:
        f, notes = self.features, self.features.notes
        if name in ("sampling", "n", "seed"):
            if f.n is False:
                self._adapt(f"n: each sample is its own request with its own seed ({notes.get('n', '')})")
            if f.seed is False:
                self._adapt(f"seed: not sent, samples are not reproducible ({notes.get('seed', '')})", warn=True)
            if f.sampling == "generation_config":
                self._adapt("sampling: generation_config with do_sample sent (the server samples only then)")
            elif f.sampling == "no":
                self._adapt("sampling: the server answers alike whatever the seed at temperature 1; the k "
                            "candidates of a step will not differ", warn=True)
        elif name == "continuation" and not f.continuation:
            self._adapt("code prefix: asked for in the prompt (the server does not continue a final assistant "
                        f"message: {notes.get('continuation', '')})")

    def check_constraints(self, setting: str = "search.constrain", value: str = "call") -> None:
        """Make sure the server can apply call constraints before a run relies on them.

        Raises:
            ConfigError: the server applies none of the constraint fields and
                ``require_constraints`` is on; the message names ``setting`` and the fix.
        """
        if self.feature("constraint"):
            return
        reason = self.features.notes.get("constraint", "")
        if self.config.require_constraints:
            raise ConfigError(f"{setting} is {value!r}, but the policy server {self.base_url} applies no regex "
                              f"constraint ({reason}). Set --{self.setting}.constraint_field to the field your "
                              f"server takes, --{setting} off, or --{self.setting}.require_constraints false to "
                              "sample unconstrained.")
        self._constraints_off = True
        self._adapt(f"constraint: off, the server applies none ({reason}); {setting} {value} is not enforced",
                    warn=True)

    def serving_record(self) -> dict[str, Any]:
        """What was used: endpoints, model, the probed features, the adaptations, the client
        limits and how many prompts got identical samples (JSON-able)."""
        with self._lock:
            record = {"endpoints": list(self.urls), "model": self.model, "features": self.features.to_dict(),
                      "adaptations": list(self.adaptations), "client": self.config.summary()}
            if self._identical_rows:
                record["identical_samples"] = f"{self._identical_rows} of {self._rows} prompts"
        return record

    def stats(self) -> dict[str, Any]:
        """The client's counters and in-flight measurements (``RemoteClient.stats``)."""
        return self.remote.stats()

    # ------------------------------------------------------------------------------ requests
    def chat(self, prompt: Prompt, **params) -> dict[str, Any]:
        """One ``/chat/completions`` request; returns the server's JSON body as it came.

        Args:
            prompt (`Prompt`): a string or chat messages; a final assistant message is continued
                (or asked for in the prompt where the server cannot continue it).
            params: other request fields (``n``, ``temperature``, ``max_tokens``, ``tools``,
                ``tool_choice``, ...); ``None`` values are left out.
        Raises:
            EndpointError: the server refused the request.
            CodetoolError: the server failed after the retries, or answered with no JSON.
        """
        messages, extra, _ = self._messages(to_messages(prompt))
        body = {"model": self.resolved_model(), "messages": messages, **extra,
                **{k: v for k, v in params.items() if v is not None}}
        reply = self._post(body, key=_affinity(messages), units=int(params.get("n") or 1))
        if params.get("tool_choice") and self.features.tool_choice is None:  # seen on the first forced call
            note_tool_choice(reply, self.features)
            if not self.features.tool_choice:
                self._adapt(f"tool_choice: {self.features.notes['tool_choice']} (the judge reads the text)")
        return reply

    def _messages(self, messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict, str]:
        """The messages to send, the continuation fields, and the prefix asked for in the prompt
        (``""`` when the server continues the final assistant message itself)."""
        if messages[-1]["role"] != "assistant":
            return messages, {}, ""
        if self.feature("continuation"):
            return messages, dict(CONTINUATION), ""
        prefix = messages[-1]["content"]
        ask = prompts.render("reply_prefix", prefix=prefix)
        rest = messages[:-1]
        if rest and rest[-1]["role"] == "user":
            rest = rest[:-1] + [{"role": "user", "content": f"{rest[-1]['content']}\n\n{ask}"}]
        else:
            rest = rest + [{"role": "user", "content": ask}]
        return rest, {}, prefix

    def _sample(self, prompt: Prompt, n: int, params: dict, constraint=None) -> list[Completion]:
        """``n`` completions of one prompt, adapted to the server (module docstring)."""
        messages, extra, prefix = self._messages(to_messages(prompt))
        stop = params.get("stop")
        if prefix and stop:  # the reply writes the prefix itself: a stop string in it would end it there
            stop = [s for s in stop if s not in prefix] or None
        body = {"model": self.resolved_model(), "messages": messages, **extra, **params, "stop": stop}
        if constraint is not None and not self._constraints_off and self.feature("constraint"):
            if prefix and not constraint.trigger:  # the reply now writes the prefix itself
                constraint = dataclasses.replace(constraint, trigger=prefix)
            field = self.features.constraint_field
            assert field is not None  # feature("constraint") found the field the server takes
            body.update(constraint_body(field, constraint.regex()))
        elif constraint is not None and not self._constraints_off:  # (check_constraints said so already)
            self._adapt(f"constraint: not sent ({self.features.notes.get('constraint', 'turned off')}); replies are "
                        "unconstrained", warn=True)
        seed = params.get("seed")
        sampling = params["temperature"] > 0
        # Probed where candidates must differ (n > 1); a single sample uses what is known.
        how = self.feature("sampling") if n > 1 and sampling else self.features.sampling
        if sampling and how == "generation_config":
            body.update(DO_SAMPLE)
        if seed is not None and self.features.seed is False:
            body.pop("seed", None)
            seed = None
        split = n > 1 and not self.feature("n")
        plan = [(1, sample_seed(seed, i)) for i in range(n)] if split else [(n, seed)]
        key = _affinity(messages)

        def ask(part: tuple[int, int | None]) -> list[Completion]:
            count, part_seed = part
            return self._completions(self._post({**body, "n": count, "seed": part_seed}, key=key, units=count))

        completions = [c for row in _parallel(ask, plan, n) for c in row]
        while len(completions) < n:  # fewer choices than asked for: ask again with a new seed
            completions += ask((n - len(completions), sample_seed(seed, len(completions) + n)))
        completions = completions[:n]
        if prefix:
            completions = [without_prefix(c, prefix, params.get("stop")) for c in completions]
        if n > 1 and sampling:
            self._count_identical(completions)
        return completions

    def _completions(self, body: dict) -> list[Completion]:
        choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
        if not choices:
            raise CodetoolError(f"{self.base_url}/chat/completions returned no choices: {self._clean(str(body))}")
        texts = [(c.get("message") or {}).get("content") or "" for c in choices]
        usage = body.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        total = usage.get("completion_tokens")
        counts = (_split_tokens(int(total), texts) if total is not None
                  else [math.ceil(len(t) / 4) for t in texts])  # no usage reported: ~4 chars a token
        return [Completion(text, prompt_tokens, count, "length" if c.get("finish_reason") == "length" else "stop")
                for c, text, count in zip(choices, texts, counts)]

    def _count_identical(self, completions: list[Completion]) -> None:
        with self._lock:
            self._rows += 1
            self._identical_rows += len({c.text for c in completions}) == 1
            suspicious = self._rows >= 4 and 2 * self._identical_rows > self._rows
        if suspicious and "identical" not in self._warned:
            self._warned.add("identical")
            self._adapt(f"identical samples: {self._identical_rows} of {self._rows} prompts got the same text for "
                        "every sample at a temperature above 0; the server may ignore n, seed or temperature, "
                        "and the search then degrades to one sample", warn=True)

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: Seeds = None,
                 constraint: Constraints = None) -> list[list[Completion]]:
        """``n`` completions per prompt, every request in flight together (within
        ``max_in_flight``); see ``LLMBackend`` (``constraint``: one for all prompts or one per
        prompt, sent in the field the server takes; ``seed``: one for all prompts or one per prompt)."""
        check_sampling(n, temperature, top_p, max_new_tokens)
        constraints = per_prompt(constraint, len(prompts))
        seeds = per_prompt_seeds(seed, len(prompts))
        params = {"temperature": temperature, "top_p": top_p, "max_tokens": max_new_tokens,
                  "stop": [s for s in (stop or []) if s] or None}
        self.resolved_model()  # once, before the threads start
        return _parallel(lambda pcs: self._sample(pcs[0], n, {**params, "seed": pcs[2]}, pcs[1]),
                         list(zip(prompts, constraints, seeds)), self.max_in_flight)

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """Log-probability (nats) of each option as the start of the reply, from ``top_logprobs``.

        One greedy request per prompt (sent together) with ``logprobs`` and the top 20
        alternatives per position. Walking the greedy tokens: an option that the greedy reply
        spells out gets the exact sum of its token log-probabilities; one that leaves it at some
        position gets the greedy prefix plus the best listed alternative that starts the rest of
        the option (the rest is counted as certain, so it is an upper bound), or the lowest listed
        log-probability when no alternative fits.

        Raises:
            NotImplementedError: the server does not return log-probabilities (probed once).
        """
        if not options:
            return [[] for _ in prompts]
        if not self.feature("logprobs"):
            raise NotImplementedError(f"{self.base_url} returns no token log-probabilities "
                                      f"({self.features.notes.get('logprobs', '')})")
        max_tokens = min(64, max(len(o) for o in options) + 1)

        def one(prompt: Prompt) -> list[float]:
            body = self.chat(prompt, max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=TOP_LOGPROBS)
            content = (((body.get("choices") or [{}])[0].get("logprobs")) or {}).get("content")
            if not content:
                raise NotImplementedError(f"{self.base_url} returned no token log-probabilities")
            return [self._walk(content, option) for option in options]

        return _parallel(one, list(prompts), self.max_in_flight)

    @staticmethod
    def _walk(content: list[dict], option: str) -> float:
        total, rest = 0.0, option
        for position in content:
            if not rest:
                break
            token, logprob = position.get("token", ""), float(position.get("logprob", 0.0))
            if token and rest.startswith(token):
                total, rest = total + logprob, rest[len(token):]
                continue
            listed = {t.get("token", ""): float(t.get("logprob", 0.0)) for t in position.get("top_logprobs") or []}
            listed[token] = logprob
            fits = [lp for t, lp in listed.items() if t and (rest.startswith(t) or t.startswith(rest))]
            return total + (max(fits) if fits else min(listed.values()))
        return total


def _parallel(func, items: list, workers: int) -> list:
    """``[func(x) for x in items]`` in up to ``workers`` threads (the client's in-flight limit
    decides how many requests are really out)."""
    if len(items) <= 1 or workers <= 1:
        return [func(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(func, items))
