"""Keep freed memory in the process on CPU, so that planning does not page-fault every step.

A planning step on the CPU allocates and frees tensors of 3-20 MB many times (the candidates'
activations, attention scores, MLP hidden layers). glibc serves allocations above its mmap
threshold (128 kB at start, adapting up to 32 MB) with fresh mmap pages and returns freed heap
tops to the kernel, so each step touches new pages: page faults and zeroing by the kernel took
about a third of a Go2 MPPI iteration (docs/planner.md, "Where a plan's time goes"). Raising the
mmap threshold to its maximum and not trimming the heap lets the allocator reuse the same memory
from step to step; the process keeps its peak heap (for the official Go2 setting, a few hundred
MB) instead of returning it.

Linux / glibc only; elsewhere `retain_freed_memory` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit (HEAP_MAX / 2)
TRIM_THRESHOLD = 1 << 30  # never trim the heap's top below 1 GiB of free memory
TOP_PAD = 64 * 1024 * 1024  # grow the heap in 64 MB steps

_applied: bool | None = None


def retain_freed_memory() -> bool:
    """Set glibc's malloc to reuse freed memory (once per process); True if it is in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    _applied = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (_M_TOP_PAD, TOP_PAD),
        )
    )
    return _applied
