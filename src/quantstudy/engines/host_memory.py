"""Keep freed host memory in the process: the CPU passes' large tensors stop costing page faults.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh `mmap` and
hands it back with `munmap` when freed. An EfficientNet-Lite0 activation at the quality batch of
64 is 51 MiB, so on the CPU every layer of every batch mapped new pages and the kernel zeroed them
on first touch: a forward pass spent more time in the kernel than in the convolutions (the
measurement: docs/results.md, "Host memory on the CPU"). Allocation does not touch any value, so
every number of a study is unchanged.

The cost: memory a pass frees stays with the process (up to `TRIM_BYTES` at the top of the heap)
instead of going back to the system between batches, so a process's resident size stays near its
peak. PyTorch's CPU performance guide recommends jemalloc or tcmalloc for the same reason; this
needs no preload and no extra dependency.
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
