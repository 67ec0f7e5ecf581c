"""train.malloc_mmap_threshold: with glibc's threshold fixed, a freed large block goes back to the OS (with
glibc's default, the second one stays in the heap); a bad value is refused naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.training.config import LoopSection

ALLOCATOR = Path(__file__).resolve().parents[2] / "aiayn" / "training" / "allocator.py"
# A process without torch (fast to start): malloc and free 8 MiB twice, print the resident growth in MiB.
PROGRAM = f"""
import ctypes, importlib.util, resource, sys
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
if sys.argv[1] == "fixed":
    spec = importlib.util.spec_from_file_location("allocator", {str(ALLOCATOR)!r})
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    assert module.set_mmap_threshold(65536)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
base = rss()
for _ in range(2):
    block = libc.malloc(8 << 20); ctypes.memset(block, 1, 8 << 20); libc.free(block)
print((rss() - base) / 2**20)
"""


def _kept_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or "glibc" not in " ".join(__import__("platform").libc_ver()),
                    reason="glibc's malloc")
def test_a_fixed_threshold_returns_freed_large_blocks_to_the_os():
    assert _kept_mib("default") >= 7.0  # glibc raised its threshold after the first free: the second block stayed
    assert _kept_mib("fixed") < 1.0


@pytest.mark.parametrize("bad", [0, -1, 2**26, 1.5])
def test_a_bad_threshold_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=rf"train\.malloc_mmap_threshold={bad!r} must be an int in \[1, 33554432\]"):
        LoopSection(malloc_mmap_threshold=bad)
