"""Keep freed memory in the process's heap (glibc malloc), so a training step does not re-fault it.

Every step allocates and frees the same multi-megabyte activations. glibc's defaults serve a block
above its (adaptive, 128 KB-32 MB) mmap threshold with a fresh mmap and give the heap's free top
back to the kernel, so the next step touches new pages again: 716 minor page faults per training
forward + backward at the default scale, and with two threads they contend in the kernel. Raising
the mmap and trim thresholds keeps the memory mapped: the RSS stays at its high-water mark (it
reaches it every step anyway). Allocation only; no value computed anywhere changes.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc <malloc.h>
_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20))


def keep_freed_memory() -> bool:
    """Apply the settings above (Linux with glibc); False, changing nothing, anywhere else."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt to call
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in _SETTINGS)
