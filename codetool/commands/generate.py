"""``codetool generate``: the completions of one prompt with any model, and the decoding speed.

A smoke test of a backend: ``--model`` is parsed once (in ``GenerateConfig.__post_init__``) into a
:class:`~codetool.models.spec.ModelSpec`, :func:`codetool.models.backends.make_backend` builds
the backend, and the completions and the tokens per second are printed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from codetool.config import ConfigError, option
from codetool.models.spec import ModelSpec


@dataclass
class GenerateConfig:
    """Settings of ``codetool generate``."""

    model: str = option("default", "'default', a model directory, .gguf file, Hub id, http(s):// URL "
                        "of an OpenAI-compatible server, or vllm:<model>")
    prompt: str = option("Write a Python function that returns the square of a number.",
                         "the user message to complete")
    system: str = option("", "optional system message")
    n: int = option(1, "completions to sample")
    temperature: float = option(0.0, "sampling temperature (0 = greedy)")
    top_p: float = option(1.0, "nucleus sampling mass")
    max_new_tokens: int = option(128, "most tokens per completion")
    stop: list[str] = option(default_factory=list, help="stop strings (comma-separated)")
    seed: int | None = option(None, "random seed for sampling")
    dtype: str = option("auto", "model dtype (local backends)", choices=["auto", "float32", "bfloat16", "float16"])
    device: str = option("auto", "device (transformers backend): auto, cpu, cuda, cuda:1, ...")
    remote_model: str = option("", "model name sent to an http(s) server (default: the server's first model)")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable holding the API key (http backends)")

    def __post_init__(self):
        if self.n < 1 or self.max_new_tokens < 1:
            raise ConfigError(f"n and max_new_tokens must be >= 1, got n={self.n}, "
                              f"max_new_tokens={self.max_new_tokens}.")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}.")
        self.model_spec = ModelSpec.parse(self.model, remote_model=self.remote_model, api_key_env=self.api_key_env,
                                          dtype=self.dtype, device=self.device)  # parsed once (not a setting)


def generate_command(cfg: GenerateConfig) -> int:
    """``codetool generate``: print the completions of one prompt and the decoding speed."""
    from rich.console import Console

    from codetool.models.backends import make_backend

    start = time.perf_counter()
    backend = make_backend(cfg.model_spec)
    loaded = time.perf_counter()
    messages = ([{"role": "system", "content": cfg.system}] if cfg.system else []) + [
        {"role": "user", "content": cfg.prompt}]
    [completions] = backend.generate([messages], n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p,
                                     max_new_tokens=cfg.max_new_tokens, stop=cfg.stop or None, seed=cfg.seed)
    seconds = time.perf_counter() - loaded
    console = Console()
    for i, c in enumerate(completions):
        console.rule(f"completion {i + 1}/{len(completions)} ({c.completion_tokens} tokens, {c.finish_reason})")
        console.print(c.text, markup=False, highlight=False)
    tokens = sum(c.completion_tokens for c in completions)
    console.rule()
    console.print(f"{backend.name}: loaded in {loaded - start:.1f} s; {tokens} tokens in {seconds:.1f} s = "
                  f"{tokens / max(seconds, 1e-9):.1f} tokens/s (prompt {completions[0].prompt_tokens} tokens)",
                  markup=False, highlight=False)
    return 0
