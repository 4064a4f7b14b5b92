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

# Names such as OPENAI_API_KEY, TOOLBENCH_KEY, TMDB_ACCESS_TOKEN, HF_TOKEN, DB_PASSWORD.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_MIN_SECRET_LEN = 6
REDACTED = "[REDACTED]"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a credential."""
    return bool(_SECRET_NAME.search(name))


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of the credential-like variables of ``environ`` (defaults to ``os.environ``),
    longest first so that a secret containing another is replaced whole."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN}
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
    """A logging filter that redacts secrets from every record's final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
