"""A :class:`codetool.rewards.PRMScorer` that asks ``codetool serve-prm`` servers over HTTP.

The search uses it when ``--prm`` is a URL (or several, comma-separated: one per server): the PRM
runs in another process or on a GPU machine and several searches share it (the server batches
their concurrent requests). Requests go through :class:`~codetool.models.remote.RemoteClient`
with the ``prm_client`` settings: items in flight (an item is a sequence the server scores),
timeout, retries with backoff honouring ``Retry-After``, and, with several servers, routing by
query (a query's items share their prefix in that server's cache) and failover. A call with more
items than ``max_items`` is split into requests sent together.

The bearer key, when the server needs one, comes from an environment variable
(``CODETOOL_PRM_API_KEY`` by default) and is only ever sent in the ``Authorization`` header.
A 4xx other than 429 is the caller's fault and fails at once with the server's one-line reason.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from concurrent.futures import ThreadPoolExecutor

from codetool import CodetoolError
from codetool.models.remote import (
    NEVER_REACHED_RETRIES,
    BadReply,
    EndpointError,
    RemoteClient,
    RemoteConfig,
    ServerFailure,
    json_object,
    split_urls,
)
from codetool.rewards import PRMItem
from codetool.secrets import key_from_env

logger = logging.getLogger(__name__)

DEFAULT_KEY_ENV = "CODETOOL_PRM_API_KEY"


class HTTPScorer:
    """``score(items)`` by ``POST {url}/score``.

    Args:
        url (`str` or `list[str]`): base URL of the server, e.g. ``http://127.0.0.1:8600``; several
            servers of the same PRM as a list or comma-separated.
        api_key_env (`str`, *optional*, defaults to ``CODETOOL_PRM_API_KEY``): variable holding the
            bearer key; no header is sent when it is unset.
        client (`RemoteConfig`, *optional*): limits, timeout, retries (``prm_client``).
        max_items (`int`, *optional*, defaults to 256): items per request (keep it <= the
            server's ``max_items``).
        timeout_s, retries, backoff_s (*optional*): replace those fields of ``client``.

    Raises (from ``score``):
        CodetoolError: when the servers cannot be reached or answer with an error; the message
            carries the server's one-line reason.
    """

    thread_safe = True  # episodes in flight may call score() together
    continuous = True

    def __init__(self, url: str | list[str], *, api_key_env: str = DEFAULT_KEY_ENV, client: RemoteConfig | None = None,
                 max_items: int = 256, **overrides):
        self.urls = [u.rstrip("/") for u in split_urls(url)]
        self.api_key_env = api_key_env
        self.url = self.urls[0] if self.urls else ""
        key = key_from_env(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.max_items = max(int(max_items), 1)
        self.config = dataclasses.replace(client or RemoteConfig(), **overrides)
        self.remote = RemoteClient(self.urls, self.config, setting="prm_client", headers=lambda: dict(headers))

    def _post(self, chunk: list[PRMItem]) -> list[float]:
        body = {"items": [dataclasses.asdict(item) for item in chunk]}

        def describe(url: str, status: int, text: str) -> str:
            return f"PRM server {url} answered {status}: {_reason(text)}{_hint(status, text, self.api_key_env)}"

        try:  # a body that is not a JSON object, or not one score per item, is a fault retried like a 5xx
            values = self.remote.request("POST", "/score", body, key=f"{chunk[0].query}\x00{chunk[0].tools}",
                                         units=len(chunk), describe=describe,
                                         parse=lambda response: _scores(response, len(chunk)))
        except EndpointError:
            raise
        except CodetoolError as e:
            kind = type(e) if isinstance(e, ServerFailure) else CodetoolError
            raise kind(f"PRM server: {e} Start it with 'codetool serve-prm' or check --prm.") from None
        return values

    def score(self, items: list[PRMItem]) -> list[float]:
        chunks = [items[i:i + self.max_items] for i in range(0, len(items), self.max_items)]
        if len(chunks) <= 1:
            return [v for chunk in chunks for v in self._post(chunk)]
        with ThreadPoolExecutor(max_workers=min(len(chunks), self.config.max_in_flight)) as pool:
            return [v for values in pool.map(self._post, chunks) for v in values]

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail at once when no PRM server of ``urls`` can be reached (one ``GET /health`` of at most
        ``timeout_s``, with the retries a request gets before any server has answered: two, another
        endpoint first), instead of after the policy's first round of generation; any HTTP answer,
        even an error status, counts as reachable (the first ``/score`` reports what is wrong).

        Raises:
            FatalError: every endpoint refused the connection or timed out, naming the last one.
        """
        from codetool.resume import FatalError

        try:
            self.remote.request("GET", "/health", retries=NEVER_REACHED_RETRIES, timeout_s=timeout_s)
        except EndpointError:  # an HTTP answer (404 where there is no /health): the server is there
            return
        except CodetoolError as e:
            if not self.remote.answered:  # no endpoint answered at all (an HTTP error is an answer)
                raise FatalError(f"the PRM server cannot be reached ({e}); start it with 'codetool serve-prm --prm "
                                 "DIR' (or fix --prm), then rerun.") from None

    def serving_record(self) -> dict:
        """The servers and the client limits (JSON-able), for trajectories and summaries."""
        return {"endpoints": list(self.urls), "client": self.config.summary()}

    def stats(self) -> dict:
        return self.remote.stats()

    def close(self) -> None:
        self.remote.close()


def _scores(response, n: int) -> list[float]:
    """The ``scores`` of a ``/score`` reply for ``n`` items.

    Raises:
        ValueError: the body is not a JSON object; ``BadReply``: its ``scores`` is not a list of ``n``
            finite numbers. Either is the server's fault (``RemoteClient`` retries it, then raises
            ``ServerFailure``).
    """
    values = json_object(response).get("scores")
    if not isinstance(values, list) or len(values) != n or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise BadReply(f"'scores' is {values!r:.100}, not {n} finite numbers (one per item sent)")
    return [float(v) for v in values]


def _hint(status: int, text: str, key_env: str) -> str:
    """What setting to change for a PRM server's refusal (``""`` when nothing on our side is)."""
    if status in (401, 403):
        return f". Set {key_env} to the key the server was started with."
    if status == 413 and "items in one request" in text:
        return ". Start the server with a larger --max_items (it takes one step's candidates at least)."
    if status == 413:
        return (". The PRM items are larger than the server accepts: shorten what it sees (search.max_observation_chars, "
                "tool_doc) or start it with larger limits (--max_body_bytes, --max_history_steps).")
    return ""


def _reason(text: str) -> str:
    """The server's one-line reason: the ``error`` of a JSON body, else the text."""
    import json

    try:
        reason = json.loads(text).get("error", text)
    except (ValueError, AttributeError):
        reason = text
    return " ".join(str(reason).split())[:200]
