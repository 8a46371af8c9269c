"""Keep freed host memory in the process: the CPU passes' large tensors stop costing page faults.

glibc maps every allocation above its mmap threshold (at most 32 MiB by default) afresh and
unmaps it when freed; a Lite0 activation at batch 64 is 51 MiB, so every CPU layer faulted in
zeroed pages and a pass spent more time in the kernel than in its convolutions (docs/results.md,
"Host memory on the CPU"). No value changes. The cost: a process stays near its peak resident
size. jemalloc or tcmalloc would do the same, with a preload and a dependency.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 1 << 30  # allocations below this come from the heap, not from a fresh mmap
OLD_GLIBC_BYTES = 32 << 20  # where a glibc caps it at half its 64 MiB heap (2.36 here takes 1 GiB)
TRIM_BYTES = 1 << 30  # free memory at the heap's top above this goes back to the system


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; False where libc is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # musl and others: their allocators have no such thresholds to raise
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    raised = mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) or mallopt(M_MMAP_THRESHOLD, OLD_GLIBC_BYTES)
    return bool(raised) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
