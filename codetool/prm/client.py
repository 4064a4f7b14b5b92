"""A :class:`codetool.rewards.PRMScorer` that asks a ``codetool serve-prm`` server over HTTP.

The search uses it when ``--prm`` is a URL: the PRM runs in another process or on a GPU machine
and several searches share it (the server batches their concurrent requests). The bearer key,
when the server needs one, comes from an environment variable (``CODETOOL_PRM_API_KEY`` by
default) and is only ever sent in the ``Authorization`` header.

Transient failures (connection errors, timeouts, HTTP 5xx and 429) are retried with exponential
backoff (``retries`` times, ``backoff_s`` doubling, honouring a short ``Retry-After``); a 4xx
other than 429 is the caller's fault and fails at once with the server's one-line reason.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from codetool import CodetoolError
from codetool.jsonl import clean_obj
from codetool.rewards import PRMItem
from codetool.secrets import key_from_env

logger = logging.getLogger(__name__)

DEFAULT_KEY_ENV = "CODETOOL_PRM_API_KEY"


class HTTPScorer:
    """``score(items)`` by ``POST {url}/score``.

    Args:
        url (`str`): base URL of the server, e.g. ``http://127.0.0.1:8600``.
        api_key_env (`str`, *optional*, defaults to ``CODETOOL_PRM_API_KEY``): variable holding the
            bearer key; no header is sent when it is unset.
        timeout_s (`float`, *optional*, defaults to 120): per request.
        max_items (`int`, *optional*, defaults to 256): items per request; larger calls are split
            (keep it <= the server's ``max_items``).
        retries (`int`, *optional*, defaults to 4): further attempts after a transient failure.
        backoff_s (`float`, *optional*, defaults to 1.0): first wait; doubles on each retry.

    Raises (from ``score``):
        CodetoolError: when the server cannot be reached or answers with an error; the message
            carries the server's one-line reason.
    """

    def __init__(self, url: str, *, api_key_env: str = DEFAULT_KEY_ENV, timeout_s: float = 120.0,
                 max_items: int = 256, retries: int = 4, backoff_s: float = 1.0):
        import httpx

        self.url = url.rstrip("/")
        key = key_from_env(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.max_items = max(int(max_items), 1)
        self.retries, self.backoff_s = max(int(retries), 0), backoff_s
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def _post(self, body: dict):
        """``POST /score`` with retries on transient failures; returns the 200 response."""
        import httpx

        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                wait = self.backoff_s * 2 ** (attempt - 1)
                logger.warning("PRM server %s: %s; retry %d of %d in %.1f s", self.url, problem, attempt,
                               self.retries, wait)
                time.sleep(wait)
            try:
                response = self._client.post("/score", json=body)
            except httpx.HTTPError as e:
                problem = f"unreachable ({type(e).__name__}: {e})"
                continue
            if response.status_code == 200:
                return response
            try:
                reason = response.json().get("error", response.text[:200])
            except (ValueError, AttributeError):
                reason = response.text[:200]
            problem = f"answered {response.status_code}: {' '.join(str(reason).split())[:200]}"
            if response.status_code != 429 and response.status_code < 500:
                raise CodetoolError(f"PRM server {self.url} {problem}")
        raise CodetoolError(f"PRM server {self.url} {problem} after {self.retries + 1} attempts; start it with "
                            "'codetool serve-prm' or check --prm.")

    def score(self, items: list[PRMItem]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(items), self.max_items):
            chunk = items[start:start + self.max_items]
            body = clean_obj({"items": [dataclasses.asdict(item) for item in chunk]})
            response = self._post(body)
            try:
                values = response.json().get("scores")
            except (ValueError, AttributeError):
                values = None
            if not isinstance(values, list) or len(values) != len(chunk):
                raise CodetoolError(f"PRM server {self.url} returned {values!r:.100} for {len(chunk)} items.")
            scores += [float(v) for v in values]
        return scores

    def close(self) -> None:
        self._client.close()
