"""glibc malloc's mmap threshold, fixed for a run (``train.malloc_mmap_threshold``): freed blocks above it go
back to the OS at once, where glibc's default threshold grows with each large block freed and then serves
later blocks of other sizes from a heap that keeps every freed one. Batches of varying shapes fill that
heap: ``benchmarks/train_memory.py`` measured the peak RSS of 60 Multi30k steps at 2,616 MB with glibc's
defaults and 1,531 MB with a fixed threshold of 64 KiB (docs/benchmarks.md). The setting is the one
``MALLOC_MMAP_THRESHOLD_`` makes at start-up, made from the config, so a recipe can carry it. It costs speed: every
large tensor is then a fresh ``mmap`` whose pages are faulted in, and on an AMX Xeon it halved the Multi30k steps per
second; padding batch lengths (``data.pad_to_multiple``) bounds the heap without that cost.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["set_mmap_threshold"]

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def set_mmap_threshold(threshold: int) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, threshold)``; False (logged) where the C library is not glibc."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, threshold):
        log.warning("train.malloc_mmap_threshold=%d: this C library has no glibc mallopt; the setting is ignored", threshold)
        return False
    return True
