"""Give freed host memory back to the operating system between large CPU computations.

PyTorch on CPU allocates its tensors with the C library's ``malloc``. Decoding grows every layer's
KV cache by one token per step (a new, slightly larger tensor each time), so glibc's heap fills
with freed blocks that no later request fits, and the process keeps them: its resident memory
grows far past what its live tensors need. ``malloc_trim`` returns those free pages; it is cheap
next to a ``generate`` call, and is called after each local ``generate`` call and between
pipeline stages. Elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from typing import Any

logger = logging.getLogger(__name__)

_trim: Any = None  # the C function, once looked up; False where there is none


def release_host_memory(collect: bool = False) -> bool:
    """Return free heap pages to the OS (glibc ``malloc_trim(0)``).

    Args:
        collect (`bool`, *optional*, defaults to `False`): run Python's garbage collector first
            (between stages, where models and trainers were just dropped).

    Returns:
        `bool`: whether memory could be handed back (``False`` without glibc).
    """
    global _trim
    if collect:
        gc.collect()
    if _trim is None:
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            logger.debug("no malloc_trim in this C library: freed memory stays with the process")
            _trim = False
    return bool(_trim and _trim(0))
