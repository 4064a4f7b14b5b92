"""A :class:`codetool.rewards.PRMScorer` that asks a ``codetool serve-prm`` server over HTTP.

The search uses it when ``--prm`` is a URL: the PRM runs in another process or on a GPU machine
and several searches share it (the server batches their concurrent requests). The bearer key,
when the server needs one, comes from an environment variable (``CODETOOL_PRM_API_KEY`` by
default) and is only ever sent in the ``Authorization`` header.
"""

from __future__ import annotations

import dataclasses
import os

from codetool import CodetoolError
from codetool.rewards import PRMItem

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

    Raises (from ``score``):
        CodetoolError: when the server cannot be reached or answers with an error; the message
            carries the server's one-line reason.
    """

    def __init__(self, url: str, *, api_key_env: str = DEFAULT_KEY_ENV, timeout_s: float = 120.0,
                 max_items: int = 256):
        import httpx

        self.url = url.rstrip("/")
        key = os.environ.get(api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.max_items = max(int(max_items), 1)
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def score(self, items: list[PRMItem]) -> list[float]:
        import httpx

        scores: list[float] = []
        for start in range(0, len(items), self.max_items):
            chunk = items[start:start + self.max_items]
            body = {"items": [dataclasses.asdict(item) for item in chunk]}
            try:
                response = self._client.post("/score", json=body)
            except httpx.HTTPError as e:
                raise CodetoolError(f"PRM server {self.url} unreachable ({type(e).__name__}: {e}); start it with "
                                    "'codetool serve-prm' or check --prm.") from None
            if response.status_code != 200:
                try:
                    reason = response.json().get("error", response.text[:200])
                except ValueError:
                    reason = response.text[:200]
                raise CodetoolError(f"PRM server {self.url} answered {response.status_code}: {reason}")
            values = response.json().get("scores")
            if not isinstance(values, list) or len(values) != len(chunk):
                raise CodetoolError(f"PRM server {self.url} returned {values!r:.100} for {len(chunk)} items.")
            scores += [float(v) for v in values]
        return scores

    def close(self) -> None:
        self._client.close()
