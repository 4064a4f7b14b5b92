"""OpenAI-compatible chat completions over HTTP (vLLM, SGLang, llama.cpp servers, hosted APIs).

One request per prompt (``n`` samples in it), several prompts in flight at once (a thread pool of
``max_concurrency``). Timeouts on every request; retries with exponential backoff (or the
server's ``Retry-After``) on HTTP 429, 5xx, timeouts and connection errors.

The API key is read only from the environment variable named by ``api_key_env`` at request time;
it is sent as a bearer token and never logged, stored on the object or put in an error message.
HTTP 401/403 is a one-line :class:`codetool.CodetoolError` naming the variable to set; an
unreachable endpoint is one naming the URL.

Constrained decoding (``generate(..., constraint=)``, issue 16): the constraint's regular expression
goes into the request field named by ``constraint_field``: ``structured_outputs`` sends
``{"structured_outputs": {"regex": ...}}`` (vLLM >= 0.12), ``guided_regex`` the older vLLM field,
``regex`` SGLang's; ``none`` sends nothing (hosted APIs without regex decoding: the reply is then
unconstrained, and a warning says so once).

Limits: the server reports token usage per request, not per sample, so with ``n > 1`` the
completion tokens are split among the samples in proportion to their text length (the total is
exact). ``option_logprobs`` is exact for an option that the greedy reply spells out and an upper
bound for one that leaves it (see :meth:`OpenAIBackend.option_logprobs`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from codetool import CodetoolError
from codetool.jsonl import clean_obj
from codetool.models.completion import (
    Completion,
    Constraints,
    Prompt,
    check_sampling,
    per_prompt,
    to_messages,
)
from codetool.secrets import key_from_env, redact

logger = logging.getLogger(__name__)

TOP_LOGPROBS = 20  # the most the OpenAI API (and vLLM by default) returns per position
MAX_RETRY_AFTER_S = 30.0
# How a constraint's regex travels in the request body, per server family (constraint_field).
CONSTRAINT_FIELDS = ("structured_outputs", "guided_regex", "regex", "none")


class EndpointError(CodetoolError):
    """The server answered with an HTTP error that retrying does not fix; ``status`` is its code."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _split_tokens(total: int, texts: list[str]) -> list[int]:
    """Split ``total`` tokens among ``texts`` in proportion to their length (largest remainder)."""
    weights = [max(len(t), 1) for t in texts]
    shares = [total * w / sum(weights) for w in weights]
    counts = [math.floor(s) for s in shares]
    by_remainder = sorted(range(len(texts)), key=lambda i: shares[i] - counts[i], reverse=True)
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


class OpenAIBackend:
    """An :class:`~codetool.models.completion.LLMBackend` over an OpenAI-compatible server.

    Args:
        base_url (`str`): e.g. ``http://127.0.0.1:8000/v1``; a URL without a path gets ``/v1``.
        model (`str`, *optional*): the model name to request; defaults to the first model the
            server lists at ``/models`` (vLLM and SGLang serve one).
        api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`): name of the environment
            variable holding the key; unset means no ``Authorization`` header (local servers).
        timeout (`float`, *optional*, defaults to `120.0`): seconds per request.
        retries (`int`, *optional*, defaults to `3`): extra attempts after a retryable failure.
        backoff_s (`float`, *optional*, defaults to `1.0`): first wait; doubled each retry.
        max_concurrency (`int`, *optional*, defaults to `8`): prompts in flight at once.
        constraint_field (`str`, *optional*, defaults to `"structured_outputs"`): the request field
            that carries a call constraint's regex, one of ``CONSTRAINT_FIELDS`` (module docstring).
    """

    supports_logprobs = True

    def __init__(self, base_url: str, model: str | None = None, *, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, retries: int = 3, backoff_s: float = 1.0, max_concurrency: int = 8,
                 constraint_field: str = "structured_outputs"):
        import httpx

        if constraint_field not in CONSTRAINT_FIELDS:
            raise CodetoolError(f"constraint_field must be one of {', '.join(CONSTRAINT_FIELDS)}, got "
                                f"{constraint_field!r}.")
        self.constraint_field = constraint_field
        self._warned_unconstrained = False
        parsed = urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise CodetoolError(f"base_url must look like http://host:port/v1, got {base_url!r}.")
        self.base_url = base_url.rstrip("/") + ("/v1" if parsed.path in ("", "/") else "")
        self.model = model
        self.api_key_env = api_key_env
        key_from_env(api_key_env)  # refuse a blank key now; redact this variable's value by value
        self.timeout, self.retries, self.backoff_s = timeout, retries, backoff_s
        self.max_concurrency = max(1, max_concurrency)
        self.name = f"openai:{self.base_url}" + (f"#{model}" if model else "")
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _headers(self) -> dict[str, str]:
        key = key_from_env(self.api_key_env)  # registered for redaction by value, whatever its name
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _clean(self, text: str) -> str:
        """Server text safe for an error message: secrets redacted, one line, short."""
        key = os.environ.get(self.api_key_env, "")
        text = redact(text.replace(key, "[REDACTED]") if key else text)
        return " ".join(text.split())[:200]

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict[str, Any]:
        """One API call with retries; returns the decoded JSON body.

        Raises:
            EndpointError: HTTP 401/403 (names the key variable) or another non-retryable 4xx.
            CodetoolError: retries exhausted (unreachable, timeouts, 429/5xx) or a non-JSON body.
        """
        import httpx

        url = self.base_url + path
        problem, fix = "", ""
        for attempt in range(self.retries + 1):
            wait = self.backoff_s * 2 ** attempt
            try:
                response = self._client.request(method, url, json=clean_obj(payload), headers=self._headers())
            except httpx.TimeoutException:
                problem = f"no answer within {self.timeout:g} s"
                fix = "raise the timeout, or check that the server is not overloaded"
            except httpx.TransportError as e:
                problem = f"cannot connect ({type(e).__name__})"
                fix = "check that the server is running and that the URL is right"
            else:
                status = response.status_code
                if status in (401, 403):
                    state = "is not set" if not os.environ.get(self.api_key_env) else "holds a key the server rejected"
                    raise EndpointError(f"{url} answered HTTP {status}: the environment variable "
                                        f"{self.api_key_env} {state}. Set {self.api_key_env} to a valid API key.",
                                        status)
                if status == 429 or status >= 500:
                    problem = f"HTTP {status} ({self._clean(response.text)})"
                    fix = "the server is overloaded or failing; retry later or lower max_concurrency"
                    retry_after = response.headers.get("retry-after", "")
                    if retry_after.replace(".", "", 1).isdigit():
                        wait = min(float(retry_after), MAX_RETRY_AFTER_S)
                elif status >= 400:
                    raise EndpointError(f"{url} answered HTTP {status}: {self._clean(response.text)}. "
                                        f"Check the request settings (model name, n, max_tokens).", status)
                else:
                    try:
                        return response.json()
                    except ValueError:
                        raise CodetoolError(f"{url} answered {status} with a body that is not JSON "
                                            f"({self._clean(response.text)}); is it an OpenAI-compatible "
                                            f"endpoint (usually ending in /v1)?") from None
            if attempt < self.retries:
                logger.warning("%s: %s; retry %d/%d in %.1f s", url, problem, attempt + 1, self.retries, wait)
                time.sleep(wait)
        raise CodetoolError(f"{url}: {problem} after {self.retries + 1} attempts; {fix}.")

    def resolved_model(self) -> str:
        """The model name sent with requests (asks the server's ``/models`` once if not given)."""
        if self.model is None:
            data = self._request("GET", "/models").get("data") or []
            if not data or "id" not in data[0]:
                raise CodetoolError(f"{self.base_url}/models lists no model; pass the model name explicitly.")
            self.model = str(data[0]["id"])
            logger.info("%s serves %s", self.base_url, self.model)
        return self.model

    def chat(self, prompt: Prompt, **params) -> dict[str, Any]:
        """One ``/chat/completions`` request; returns the server's JSON body as it came.

        Args:
            prompt (`Prompt`): a string or chat messages; a final assistant message is continued.
            params: other request fields (``n``, ``temperature``, ``max_tokens``, ``tools``,
                ``tool_choice``, ...); ``None`` values are left out.
        Raises:
            CodetoolError: the server answered with an error after the retries, or not JSON.
        """
        messages = to_messages(prompt)
        body = {"model": self.resolved_model(), "messages": messages}
        if messages[-1]["role"] == "assistant":
            # Continue the final assistant message: vLLM's and SGLang's extension of the API.
            body.update({"continue_final_message": True, "add_generation_prompt": False})
        body.update({k: v for k, v in params.items() if v is not None})
        return self._request("POST", "/chat/completions", body)

    def constraint_body(self, constraint) -> dict[str, Any]:
        """The request fields that carry ``constraint`` (a CallConstraint or ``None``)."""
        if constraint is None:
            return {}
        if self.constraint_field == "none":
            if not self._warned_unconstrained:
                logger.warning("%s: constraint_field is 'none', so the call constraint is not sent and replies "
                               "are unconstrained", self.base_url)
                self._warned_unconstrained = True
            return {}
        if self.constraint_field == "structured_outputs":
            return {"structured_outputs": {"regex": constraint.regex()}}
        return {self.constraint_field: constraint.regex()}

    def _complete_one(self, prompt: Prompt, n: int, params: dict, constraint=None) -> list[Completion]:
        params = {**params, **self.constraint_body(constraint)}
        completions: list[Completion] = []
        while len(completions) < n:  # servers that ignore `n` return one choice per request
            body = self.chat(prompt, n=n - len(completions), **params)
            choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
            if not choices:
                raise CodetoolError(f"{self.base_url}/chat/completions returned no choices: {self._clean(str(body))}")
            texts = [(c.get("message") or {}).get("content") or "" for c in choices]
            usage = body.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", 0))
            total = usage.get("completion_tokens")
            counts = (_split_tokens(int(total), texts) if total is not None
                      else [math.ceil(len(t) / 4) for t in texts])  # no usage reported: ~4 chars a token
            for choice, text, count in zip(choices, texts, counts):
                finish = "length" if choice.get("finish_reason") == "length" else "stop"
                completions.append(Completion(text, prompt_tokens, count, finish))
        return completions[:n]

    def generate(self, prompts: list[Prompt], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, stop: list[str] | None = None, seed: int | None = None,
                 constraint: Constraints = None) -> list[list[Completion]]:
        """``n`` completions per prompt, prompts in parallel; see ``LLMBackend`` (``constraint``: one
        for all prompts or one per prompt, sent as ``constraint_field``)."""
        check_sampling(n, temperature, top_p, max_new_tokens)
        constraints = per_prompt(constraint, len(prompts))
        params = {"temperature": temperature, "top_p": top_p, "max_tokens": max_new_tokens,
                  "stop": [s for s in (stop or []) if s] or None, "seed": seed}
        self.resolved_model()  # once, before the threads start
        if len(prompts) <= 1:
            return [self._complete_one(p, n, params, c) for p, c in zip(prompts, constraints)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(lambda pc: self._complete_one(pc[0], n, params, pc[1]), zip(prompts, constraints)))

    def option_logprobs(self, prompts: list[Prompt], options: list[str]) -> list[list[float]]:
        """Log-probability (nats) of each option as the start of the reply, from ``top_logprobs``.

        One greedy request per prompt with ``logprobs`` and the top 20 alternatives per position.
        Walking the greedy tokens: an option that the greedy reply spells out gets the exact sum
        of its token log-probabilities; one that leaves it at some position gets the greedy
        prefix plus the best listed alternative that starts the rest of the option (the rest is
        counted as certain, so it is an upper bound), or the lowest listed log-probability when
        no alternative fits.

        Raises:
            NotImplementedError: the server does not return log-probabilities.
        """
        if not options:
            return [[] for _ in prompts]
        max_tokens = min(64, max(len(o) for o in options) + 1)
        scores = []
        for prompt in prompts:
            try:
                body = self.chat(prompt, max_tokens=max_tokens, temperature=0.0, logprobs=True,
                                  top_logprobs=TOP_LOGPROBS)
            except EndpointError as e:
                if e.status in (401, 403):
                    raise
                raise NotImplementedError(f"{self.base_url} refused a logprobs request: {e}") from None
            content = (((body.get("choices") or [{}])[0].get("logprobs")) or {}).get("content")
            if not content:
                raise NotImplementedError(f"{self.base_url} returned no token log-probabilities")
            scores.append([self._walk(content, option) for option in options])
        return scores

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
