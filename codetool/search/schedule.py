"""How episodes (and tree nodes) share a policy: batched rounds or continuous scheduling (issue 28).

A local transformers policy is fast when many sequences decode in the same forward passes, so
the search sends the prompts of all its episodes in one ``generate`` call per round and waits for
all of them (``rounds``). A remote server batches by itself, and rounds in lockstep leave it idle
while the slowest episode of the round finishes, executes and is scored. With ``continuous``
scheduling every episode (every tree node) runs in its own worker thread: as soon as its own
generation returns it executes, is scored and asks for its next step, so the server always holds
up to the client's ``max_in_flight`` sequences (``codetool.models.remote``). Episodes are
streamed by :func:`codetool.streaming.stream`: a finished one is handed on in a thread of its own,
so what the caller does with it (write it, re-run its steps) never delays the next episode
(issue 39), and a memory cap may hold new ones back (``SearchParts.admit``).

``search.schedule: auto`` picks ``continuous`` for backends that say so (``continuous = True``:
the OpenAI-compatible backend) and ``rounds`` otherwise. Seeds never depend on the schedule's
order of completion: a step's seed comes from its query and step number (a tree node's from its
tree and node id), so a continuous run draws the same samples whatever the timing.

Limits: worker threads share the process; a local PRM scorer (or another object that is not
``thread_safe``) is called by one episode at a time (:class:`Serialized`), so it loses the
cross-episode batching of rounds. A hung request holds only its own episode, for at most its
client's ``timeout_s`` per attempt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from codetool.streaming import stream  # noqa: F401 - how episodes and tree nodes are streamed

logger = logging.getLogger(__name__)

SCHEDULES = ("auto", "rounds", "continuous")


def is_continuous(policy, schedule: str = "auto") -> bool:
    """Whether ``policy`` runs under continuous scheduling for the ``schedule`` setting."""
    if schedule == "auto":
        return bool(getattr(policy, "continuous", False))
    return schedule == "continuous"


def units_in_flight(setting: int | None, policy, continuous: bool, *, local_default: int, per_unit: int = 1) -> int:
    """How many episodes (or trees) to keep in flight.

    Args:
        setting (`int` or `None`): the user's value (``search.concurrency``, ``batch_trees``);
            ``None`` picks the default.
        continuous (`bool`): the schedule (see :func:`is_continuous`).
        local_default (`int`): the default under batched rounds.
        per_unit (`int`, *optional*, defaults to 1): sequences one unit asks for at a time (``k``).
    Returns:
        ``setting`` when given; under rounds ``local_default``; under continuous scheduling
        enough units that their requests alone fill the policy client's ``max_in_flight`` twice
        over (units also spend time executing and being scored), at least ``local_default``.
    """
    if setting is not None:
        return int(setting)
    if not continuous:
        return local_default
    limit = int(getattr(policy, "max_in_flight", local_default))
    return max(local_default, -(-2 * limit // max(per_unit, 1)))


def planned_units(setting: int | None, remote: bool, schedule: str, client, *, local_default: int,
                  per_unit: int = 1) -> int:
    """:func:`units_in_flight` before the policy is built: what a worker will pick (a Ray driver
    sends each worker that many units per call, ``codetool.distributed``).

    Args:
        remote (`bool`): the policy is a server (its backend schedules ``continuous`` under ``auto``).
        client (`RemoteConfig`): that server's client limits (``max_in_flight``).
    """
    continuous = schedule == "continuous" or (schedule == "auto" and remote)
    return units_in_flight(setting, client if remote else None, continuous, local_default=local_default,
                           per_unit=per_unit)


class Serialized:
    """A scorer (or any object) whose methods are called by one thread at a time.

    Wraps what is not ``thread_safe`` (a local PRM on one device, its tokenizer) when episodes
    run in threads; attributes are read through, calls of ``score`` and ``count_tokens`` hold
    the lock.
    """

    thread_safe = True

    def __init__(self, inner):
        self.inner = inner
        self._lock = threading.Lock()
        if callable(getattr(inner, "count_tokens", None)):
            self.count_tokens = self._locked(inner.count_tokens)

    def _locked(self, method):
        def call(*args, **kwargs):
            with self._lock:
                return method(*args, **kwargs)
        return call

    def score(self, items):
        with self._lock:
            return self.inner.score(items)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def thread_safe(scorer):
    """``scorer`` itself when it says it is ``thread_safe`` (or is ``None``), else :class:`Serialized`."""
    if scorer is None or getattr(scorer, "thread_safe", False):
        return scorer
    return Serialized(scorer)


def serving_records(**parts) -> dict[str, Any]:
    """``{name: part.serving_record()}`` for the parts that have one (remote clients)."""
    out = {}
    for name, part in parts.items():
        record = getattr(part, "serving_record", None)
        if callable(record):
            out[name] = record()
    return out


@contextmanager
def closed_on_interrupt(*parts) -> Iterator[None]:
    """Close the remote clients among ``parts`` (``continuous`` ones) when the block is
    interrupted (Ctrl-C): their requests in flight are cancelled and their connections closed, so
    the servers stop generating, and the worker threads waiting on them end."""
    try:
        yield
    except KeyboardInterrupt:
        for part in parts:
            close = getattr(part, "close", None)
            if getattr(part, "continuous", False) and callable(close):
                close()
        raise

