"""What the daemon does with its own memory once start-up is over (``settle``, called by
gpumon.daemon after the first poll).

Start-up (imports, NVML's initialisation, the first reads of every tier) allocates and frees a
lot. What it keeps lives as long as the process; what it freed stays resident in the C heap
unless the allocator is asked to give it back, which glibc does only at the top of its heap.
"""

from __future__ import annotations

import ctypes
import gc


def trim_c_heap() -> bool:
    """Give the C heap's free pages back to the kernel: glibc's ``malloc_trim(0)``, which releases
    whole free pages anywhere in its arenas, not only at the top. False, doing nothing, where the
    C library has no ``malloc_trim`` (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def settle() -> None:
    """After start-up: free start-up's garbage cycles (``gc.collect``: a frozen cycle would never
    be freed), move what start-up built out of the garbage collector's reach (``gc.freeze``: its
    full collections stop rescanning the modules, config, backend and first tier caches), then
    give the C heap's free pages back (``trim_c_heap``)."""
    gc.collect()
    gc.freeze()
    trim_c_heap()
