"""Keep secrets (API keys, tokens) out of prompts, trajectories, datasets, logs and reports.

Secrets enter codetool only through environment variables. ``secret_values`` collects the values
of every variable whose name looks like a credential; ``redact`` replaces them in any text. The
executor never passes the host environment into the sandbox (``sandbox_environment``), and every
writer of records and reports calls ``redact`` on what it writes, so a key planted in the
environment cannot leak even when a tool echoes it back.

Limits: a secret shorter than 6 characters is not redacted (it would mangle ordinary text), and a
secret that a tool transforms (e.g. base64) before echoing is not recognised.
"""

from __future__ import annotations

import logging
import os
import re

from codetool.text import clean_text

# Names such as OPENAI_API_KEY, TOOLBENCH_KEY, TMDB_ACCESS_TOKEN, HF_TOKEN, DB_PASSWORD.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_MIN_SECRET_LEN = 6
REDACTED = "[REDACTED]"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a credential."""
    return bool(_SECRET_NAME.search(name))


# Secrets known by value, whatever their variable's name (``--api_key_env VLLM_BEARER``) or where
# they came from (an Authorization header): filled by ``key_from_env`` and ``register_secret``.
_KEY_NAMES: set[str] = set()
_KEY_VALUES: set[str] = set()


def register_secret(value: str | None) -> None:
    """Redact ``value`` everywhere from now on (e.g. a bearer key read from any variable)."""
    for v in (value, (value or "").strip()):
        if v and len(v) >= _MIN_SECRET_LEN:
            _KEY_VALUES.add(v)


def key_from_env(name: str) -> str | None:
    """The API key in the environment variable ``name`` (stripped), or `None` when it is unset.

    The variable is remembered as a secret whatever its name, so its value is redacted from
    records and logs even when a server echoes it back.

    Raises:
        CodetoolError: the variable is set but empty or only whitespace (a server would otherwise
            start with "auth on" and a key nobody can send).
    """
    from codetool import CodetoolError

    _KEY_NAMES.add(name)
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip():
        raise CodetoolError(f"the environment variable {name} is set but empty or whitespace; "
                            f"set it to the API key, or unset it (unset {name}).")
    register_secret(value)
    return value.strip()


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of the credential-like variables of ``environ`` (defaults to ``os.environ``), plus,
    for ``os.environ``, every key variable and value registered by ``key_from_env`` or
    ``register_secret``; longest first so that a secret containing another is replaced whole."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if (is_secret_name(k) or k in _KEY_NAMES) and len(v) >= _MIN_SECRET_LEN}
    if environ is None:
        values |= _KEY_VALUES
    return sorted(values, key=len, reverse=True)


def redact(text: str, environ: dict[str, str] | None = None) -> str:
    """Return ``text`` with every secret value of the environment replaced by ``[REDACTED]``."""
    if not text:
        return text
    for value in secret_values(environ):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_obj(obj, environ: dict[str, str] | None = None):
    """Recursively redact the strings inside a JSON-like object (dict, list, str, scalars)."""
    secrets = secret_values(environ)
    if not secrets:
        return obj

    def walk(x):
        if isinstance(x, str):
            for value in secrets:
                if value in x:
                    x = x.replace(value, REDACTED)
            return x
        if isinstance(x, dict):
            return {walk(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    return walk(obj)


def sandbox_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for untrusted code: no host variable is inherited."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "HOME": "/tmp",
    }
    if extra:
        env.update({k: v for k, v in extra.items() if not is_secret_name(k)})
    return env


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secrets from every record's final message and replaces lone
    surrogates (which a UTF-8 stream cannot encode)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = clean_text(redact(message))  # lone surrogates would make the handler fail
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
