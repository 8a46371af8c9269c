"""engines/host_memory.py: with the raised thresholds, a large tensor freed and allocated again
reuses the process's pages instead of mapping (and faulting in) new ones every time."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from quantstudy.engines.host_memory import keep_freed_memory
raised = keep_freed_memory() if sys.argv[1] == "raised" else None
for _ in range(10):  # 64 MiB, above glibc's largest automatic mmap threshold (32 MiB); the
    x = torch.ones(64 << 18)  # heap grows until freed neighbours merge into a chunk that takes
    del x  # torch's 64-byte-aligned request (five rounds here), then it is reused
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = torch.ones(64 << 18)
    del x
print(raised, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = (64 << 20) // 4096  # pages of one tensor: each fresh mapping faults in every one


def _faults(mode: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    raised, faults = done.stdout.split()
    return raised, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's thresholds: Linux only")
def test_a_freed_large_tensor_is_reused_without_page_faults():
    _, plain = _faults("plain")
    raised, kept = _faults("raised")
    if raised != "True":
        pytest.skip("this libc is not glibc: its allocator has no such thresholds")
    # without the thresholds every one of the ten tensors is a new mapping (about 10 x PAGES
    # faults; huge pages can make that fewer, so the bound is loose); with them, the pages of
    # the first stay mapped and the ten reuse them (a few hundred faults of Python's own)
    assert plain > 4 * PAGES, plain
    assert kept < PAGES // 4, kept
