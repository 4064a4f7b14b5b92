"""What an OpenAI-compatible server does with our request fields, found out with tiny requests.

Servers differ (issue 25): vLLM takes ``n``, ``seed``, ``logprobs``, ``continue_final_message``
and ``structured_outputs``; ``transformers serve`` answers HTTP 422 to the fields it does not
know, silently returns one choice for ``n``, and samples only when its ``generation_config``
says ``do_sample``; hosted APIs refuse vLLM's extensions. :class:`ServerFeatures` holds what one
server was found to do; each ``probe_*`` function sends one to three requests of a few tokens and
fills in its part, once per backend (the backend calls them when a feature is first needed);
``tool_choice`` is read off the first real forced function call (:func:`note_tool_choice`). The
rest of the module is how the backend adapts: a refused request's message names the setting
behind the refused field (:func:`describe_refusal`), samples asked for one by one get seeds of
their own (:func:`sample_seed`), and a reply to a prompt that asked for the code prefix reads as
its continuation (:func:`without_prefix`).

A probe only trusts what it can see: ``n`` counts the choices, sampling compares replies drawn
with different seeds at temperature 1, a constraint field must make the reply match its regular
expression, ``logprobs`` (and a tool call) must come back in the reply. Continuation is taken
as working when the server accepts its fields (a server that accepted and ignored them would
start a new message instead; nothing cheap tells the two apart).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from codetool.models.completion import Completion, find_stop
from codetool.models.remote import EndpointError

logger = logging.getLogger(__name__)

# (probe request body) -> (reply JSON); raises EndpointError for a refused request.
Send = Callable[[dict], dict]

SAMPLING_PROMPT = "Write twelve random letters and digits, nothing else."
CONSTRAINT_REGEX = "(qx|zv)[0-9]"  # a reply no model writes unasked
CONTINUATION = {"continue_final_message": True, "add_generation_prompt": False}
DO_SAMPLE = {"generation_config": json.dumps({"do_sample": True})}  # transformers serve's own field


@dataclass
class ServerFeatures:
    """What a server was found to do; ``None`` where nothing was probed yet.

    Args:
        n (`bool`): returns ``n`` choices for ``n > 1`` (else each sample is its own request).
        seed (`bool`): accepts ``seed`` (else it is left out and samples are not reproducible).
        sampling (`str`): ``yes`` (different seeds give different replies at temperature 1),
            ``generation_config`` (only with transformers serve's ``generation_config`` asking for
            ``do_sample``) or ``no`` (it always answers alike: candidates cannot differ).
        continuation (`bool`): continues a final assistant message (vLLM's
            ``continue_final_message``); else the code prefix goes into the prompt.
        constraint_field (`str`): the field that applies a regex (``""``: none works).
        logprobs (`bool`): returns token log-probabilities (``judge.mode options``, routing).
        tool_choice (`bool`): makes a forced function call (``judge.mode tools``).
        notes (`dict[str, str]`): why a probe said no (the server's reason, one line).
    """

    n: bool | None = None
    seed: bool | None = None
    sampling: str | None = None
    continuation: bool | None = None
    constraint_field: str | None = None
    logprobs: bool | None = None
    tool_choice: bool | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The probed features only (JSON-able), with the notes."""
        data = {k: v for k, v in asdict(self).items() if v is not None and k != "notes"}
        if self.notes:
            data["notes"] = dict(self.notes)
        return data


def _texts(body: dict) -> list[str]:
    return [((c.get("message") or {}).get("content") or "") for c in body.get("choices") or []]


def _refused(error: EndpointError) -> str:
    return f"HTTP {error.status}: {error.text}"[:200]


def probe_sampling(send: Send, features: ServerFeatures) -> None:
    """``n``, ``seed`` and ``sampling``: one request for two samples at temperature 1, then single
    requests with other seeds until two replies differ (at most three), then the same with
    ``generation_config`` where the replies never differed."""
    base = {"messages": [{"role": "user", "content": SAMPLING_PROMPT}], "temperature": 1.0, "top_p": 1.0,
            "max_tokens": 8}
    features.seed = True
    try:
        first = send({**base, "n": 2, "seed": 1})
    except EndpointError as e:
        if "seed" in e.text.lower():
            features.seed, features.notes["seed"] = False, _refused(e)
        else:
            features.n, features.notes["n"] = False, _refused(e)
        first = send({**base, **({"n": 2} if features.n is None else {}),
                      **({"seed": 1} if features.seed else {})})
    texts = _texts(first)
    if features.n is None:
        features.n = len(texts) >= 2
        if not features.n:
            features.notes["n"] = f"asked for 2 choices, got {len(texts)}"

    def draws(extra: dict) -> set[str]:
        seen = set(texts[:2]) if not extra else set()
        for seed in range(2, 5):
            if len(seen) > 1:
                break
            seen |= set(_texts(send({**base, "n": 1, **({"seed": seed} if features.seed else {}), **extra}))[:1])
        return seen

    if len(draws({})) > 1:
        features.sampling = "yes"
        return
    try:
        features.sampling = "generation_config" if len(draws(DO_SAMPLE)) > 1 else "no"
    except EndpointError:
        features.sampling = "no"
    if features.sampling == "no":
        features.notes["sampling"] = "replies drawn with different seeds at temperature 1 were identical"


def probe_continuation(send: Send, features: ServerFeatures) -> None:
    """``continuation``: whether the server accepts ``continue_final_message``."""
    try:
        send({"messages": [{"role": "user", "content": "Count from 1 to 5."}, {"role": "assistant", "content": "1, 2,"}],
              "max_tokens": 3, "temperature": 0.0, **CONTINUATION})
        features.continuation = True
    except EndpointError as e:
        features.continuation, features.notes["continuation"] = False, _refused(e)


def constraint_body(field_name: str, regex: str) -> dict[str, Any]:
    """The request fields that carry ``regex`` under ``field_name`` (``none``: nothing)."""
    if field_name == "none":
        return {}
    if field_name == "structured_outputs":
        return {"structured_outputs": {"regex": regex}}
    return {field_name: regex}


def probe_constraint(send: Send, features: ServerFeatures, fields: tuple[str, ...]) -> None:
    """``constraint_field``: the first of ``fields`` whose regex the reply follows (``""``: none)."""
    reasons = []
    for name in fields:
        if name == "none":
            continue
        try:
            body = send({"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6,
                         "temperature": 0.0, **constraint_body(name, CONSTRAINT_REGEX)})
        except EndpointError as e:
            reasons.append(f"{name}: {_refused(e)}")
            continue
        text = (_texts(body) or [""])[0].strip()
        if re.fullmatch(CONSTRAINT_REGEX, text):
            features.constraint_field = name
            return
        reasons.append(f"{name}: accepted but not applied (replied {text[:30]!r})")
    features.constraint_field = ""
    features.notes["constraint"] = "; ".join(reasons)[:300] or "constraint_field is none"


def probe_logprobs(send: Send, features: ServerFeatures) -> None:
    """``logprobs``: whether a reply carries token log-probabilities with alternatives."""
    try:
        body = send({"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 1, "temperature": 0.0,
                     "logprobs": True, "top_logprobs": 2})
    except EndpointError as e:
        features.logprobs, features.notes["logprobs"] = False, _refused(e)
        return
    content = (((body.get("choices") or [{}])[0].get("logprobs")) or {}).get("content")
    features.logprobs = bool(content)
    if not content:
        features.notes["logprobs"] = "the reply carried no token log-probabilities"


def note_tool_choice(reply: dict, features: ServerFeatures) -> None:
    """``tool_choice`` from the reply to a forced function call: did a tool call come back?"""
    calls = (((reply.get("choices") or [{}])[0].get("message")) or {}).get("tool_calls")
    features.tool_choice = bool(calls)
    if not calls:
        features.notes["tool_choice"] = "a forced function call came back as text"


# Which setting puts a request field there, per role (named in HTTP 4xx errors).
FIELD_SETTINGS = {
    "policy": {"model": "remote_model", "n": "search.k (trees: branching)", "max_tokens": "search.max_new_tokens",
               "temperature": "search.temperature", "top_p": "search.top_p", "stop": "search.code_prefix",
               "seed": "search.seed", "continue_final_message": "search.code_prefix",
               "add_generation_prompt": "search.code_prefix", "structured_outputs": "search.constrain",
               "guided_regex": "search.constrain", "regex": "search.constrain", "logprobs": "routing.method",
               "top_logprobs": "routing.method", "tools": "judge.mode", "tool_choice": "judge.mode",
               "generation_config": "search.temperature",
               "messages": "the prompt's length (tool_doc, search.max_observation_chars, search.max_steps)"},
    "judge": {"model": "judge.remote_model", "max_tokens": "judge.max_new_tokens", "temperature": "judge.temperature",
              "logprobs": "judge.mode", "top_logprobs": "judge.mode",
              "tools": "judge.mode", "tool_choice": "judge.mode", "generation_config": "judge.temperature",
              "messages": "the prompt's length (judge.max_answer_chars, judge.max_trajectory_chars)"},
}


def describe_refusal(url: str, status: int, text: str, body: dict | None, *, role: str = "policy",
                     key_env: str = "OPENAI_API_KEY") -> str:
    """The one-line message of a refused request: HTTP 401/403 name the key variable; another 4xx
    names the settings behind the request fields that the server's reason names (all that were
    sent when it names none; the URL and model for a 404)."""
    if status in (401, 403):
        state = "is not set" if not os.environ.get(key_env) else "holds a key the server rejected"
        return f"{url} answered HTTP {status}: the environment variable {key_env} {state}. Set {key_env} to a valid API key."
    settings = FIELD_SETTINGS.get(role, FIELD_SETTINGS["policy"])
    sent = [k for k in (body or {}) if k in settings]
    lowered = text.lower()
    named = [k for k in sent if re.search(rf"(?<![a-z_]){re.escape(k)}(?![a-z_])", lowered)]
    if re.search(r"context|too long|maximum.*tokens|tokens.*maximum", lowered):
        named = [k for k in ("messages", "max_tokens") if k in sent] + named
    if status == 404 and not named:
        hint = f"check the URL (it usually ends in /v1) and {settings['model']}"
    else:
        shown = named or [k for k in sent if k not in ("messages", "model")]
        causes = dict.fromkeys(f"{settings[k]} ('{k}')" for k in shown)
        hint = (f"the refused field comes from {', '.join(causes)}" if named else
                f"the request's fields come from {', '.join(causes) or 'the prompt'}")
        hint += "; change that setting, or use a server that accepts the field"
    return f"{url} answered HTTP {status}: {text}. Hint: {hint}."


def sample_seed(seed: int | None, i: int) -> int | None:
    """The seed of sample ``i`` when samples are requested one by one: ``seed`` itself for the
    first, a different 31-bit seed for each other (never the same one twice)."""
    if seed is None or i == 0:
        return seed
    return (int(seed) * 1_000_003 + 7_919 * i) & 0x7FFFFFFF


def without_prefix(completion: Completion, prefix: str, stop: list[str] | None) -> Completion:
    """A reply to a prompt that asked for ``prefix``, as the continuation of the prefix would be:
    what follows the prefix's first occurrence (a model may write a line of prose first) or, for a
    reply that opens another code fence, what follows that fence's line; then cut at the first of
    the original stop strings (the closing fence)."""
    text, want = completion.text, prefix.strip()
    at = text.find(want) if want else -1
    if at >= 0:
        text = text[at + len(want):].lstrip(" ").removeprefix("\n")
    elif want.startswith("```") and text.lstrip().startswith("```"):
        text = text.lstrip().partition("\n")[2]
    cut = find_stop(text, stop)
    if cut >= 0:
        text = text[:cut]
    return dataclasses.replace(completion, text=text)
