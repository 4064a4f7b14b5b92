"""Models: loading (``default``, a directory, a ``.gguf``, a Hub id) and LLM backends.

- :mod:`codetool.models.loading`: ``resolve_model``, ``load_model``, ``checkpoints_dir``;
- :mod:`codetool.models.setup`: caches the embedded default model (``codetool setup`` runs it);
- :mod:`codetool.models.spec`: ``ModelSpec``, the parsed model spec;
- :mod:`codetool.models.backends`: ``TransformersBackend``, ``OpenAIBackend``, ``VLLMBackend``,
  ``ScriptedBackend`` and ``make_backend`` (a backend for a ``ModelSpec``);
- :mod:`codetool.models.completion`: the interface itself (``Completion``, ``Prompt``, ``LLMBackend``);
- :mod:`codetool.models.remote`: the HTTP client every remote model goes through (``RemoteConfig``:
  sequences in flight, timeouts, retries, several endpoints); :mod:`codetool.models.openai_probe`:
  what an OpenAI-compatible server does with our request fields.

Importing this package does not import torch or transformers.
"""

from codetool.models.completion import Completion, LLMBackend, Prompt
from codetool.models.loading import DEFAULT_MODEL, checkpoints_dir, load_model, resolve_model

__all__ = ["DEFAULT_MODEL", "Completion", "LLMBackend", "Prompt", "checkpoints_dir", "load_model",
           "resolve_model"]
