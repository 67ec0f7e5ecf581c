"""aiayn/allocator.py: the aiayn command re-executes itself once with mimalloc preloaded where it is
installed, keeps what the user preloads, and names $AIAYN_ALLOCATOR when its value is wrong; under glibc's
malloc, train.malloc_mmap_threshold returns a freed large block to the OS (with glibc's default, the second
one stays in the heap), and a bad value is refused naming the key; training's hold on freed memory is set in
mimalloc, and a delay the user set is kept; train.onednn_cache_capacity, set after torch loads, is the capacity oneDNN
uses (none: a second identical matmul makes its primitive again), a capacity the user set is kept, and a bad one is
refused naming the key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn import allocator
from aiayn.training.config import LoopSection

LIB = Path("/opt/lib/libmimalloc.so")


def test_auto_preloads_mimalloc_once_before_what_the_user_preloads():
    env = allocator.preload_env({"LD_PRELOAD": "/x/libfoo.so", "HOME": "/h"}, platform="linux", library=LIB)
    assert env is not None and env["LD_PRELOAD"] == f"{LIB} /x/libfoo.so" and env["HOME"] == "/h"
    assert allocator.preload_env(env, platform="linux", library=LIB) is None  # the re-executed process: never again


@pytest.mark.parametrize("env", [
    {"AIAYN_ALLOCATOR": "system"},
    {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},  # the user's own allocator is kept
    {"AIAYN_ALLOCATOR_EXECED": "1"},
])
def test_nothing_to_do(env):
    assert allocator.preload_env(env, platform="linux", library=LIB) is None


def test_auto_without_mimalloc_or_off_linux_runs_as_it_is_and_mimalloc_says_why():
    assert allocator.preload_env({}, platform="darwin", library=LIB) is None
    spaced = Path("/my venv/lib/libmimalloc.so")  # LD_PRELOAD splits paths at spaces and colons
    assert allocator.preload_env({}, platform="linux", library=spaced) is None
    with pytest.raises(RuntimeError, match="without spaces or colons"):
        allocator.preload_env({"AIAYN_ALLOCATOR": "mimalloc"}, platform="linux", library=spaced)
    with pytest.raises(RuntimeError, match=r"AIAYN_ALLOCATOR=mimalloc.*Linux only"):
        allocator.preload_env({"AIAYN_ALLOCATOR": "mimalloc"}, platform="win32", library=LIB)


def test_a_bad_value_is_named():
    with pytest.raises(ValueError, match=r"\$AIAYN_ALLOCATOR must be one of auto, mimalloc, system, got 'jemalloc'"):
        allocator.preload_env({"AIAYN_ALLOCATOR": "jemalloc"}, platform="linux", library=LIB)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "AIAYN_ALLOCATOR", "AIAYN_ALLOCATOR_EXECED")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}, timeout=120)


REEXEC = "from aiayn.allocator import reexec_with_allocator, describe; reexec_with_allocator(); print(describe())"
HOLD = """
import ctypes
from aiayn.allocator import _mimalloc_loaded, hold_freed_memory, reexec_with_allocator
reexec_with_allocator()
delay = hold_freed_memory(12.5)
loaded = _mimalloc_loaded()
print(delay, ctypes.CDLL(loaded).mi_option_get(15) if loaded else "-")  # 15: mi_option_purge_delay
"""
MMAP = "from aiayn.allocator import reexec_with_allocator, set_mmap_threshold; reexec_with_allocator(); print(set_mmap_threshold(65536))"


@pytest.mark.skipif(sys.platform != "linux" or allocator.mimalloc_path() is None, reason="mimalloc (cmeel-mimalloc) not installed here")
def test_the_process_runs_again_with_mimalloc_loaded_and_system_keeps_glibc():
    assert _run(REEXEC).stdout.startswith("mimalloc (")  # read from /proc/self/maps: really loaded
    assert _run(REEXEC, AIAYN_ALLOCATOR="system").stdout.startswith("the system's malloc")
    assert _run(MMAP).stdout.strip() == "False"  # glibc's mallopt means nothing under mimalloc: said, not done
    assert _run(HOLD).stdout.split() == ["12500", "12500"]  # the delay set, and mimalloc's own reading of it
    assert _run(HOLD, MIMALLOC_PURGE_DELAY="50").stdout.split() == ["None", "50"]  # the user's delay is kept
    assert _run(HOLD, AIAYN_ALLOCATOR="system").stdout.split() == ["None", "-"]  # glibc: nothing to set
    done = subprocess.run([sys.executable, "-m", "aiayn", "--version"], capture_output=True, text=True,
                          env={**os.environ, "AIAYN_ALLOCATOR": "jemalloc"})
    assert done.returncode == 2 and "$AIAYN_ALLOCATOR must be one of" in done.stderr


# A process without torch (fast to start): malloc and free 8 MiB twice, print the resident growth in MiB.
PROGRAM = """
import ctypes, resource, sys
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
if sys.argv[1] == "fixed":
    from aiayn.allocator import set_mmap_threshold  # imports no torch
    assert set_mmap_threshold(65536)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
base = rss()
for _ in range(2):
    block = libc.malloc(8 << 20); ctypes.memset(block, 1, 8 << 20); libc.free(block)
print((rss() - base) / 2**20)
"""


def _kept_mib(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # glibc's malloc
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True, env=env)
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


# The same bf16 matmul twice, oneDNN's log on: does the second find the first's primitive in the cache?
CACHE_PROGRAM = """
import os, sys
import torch
from aiayn.allocator import set_onednn_cache_capacity
if sys.argv[1] != "default":
    assert set_onednn_cache_capacity(int(sys.argv[1]))
os.environ["ONEDNN_VERBOSE"] = "2"  # read at oneDNN's first primitive too
x, linear = torch.randn(8, 64, dtype=torch.bfloat16), torch.nn.Linear(64, 64).to(torch.bfloat16)
linear(x)
linear(x)
"""


def _cache_lookups(capacity: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("PRIMITIVE_CACHE_CAPACITY") and k != "ONEDNN_VERBOSE"}
    out = subprocess.run([sys.executable, "-c", CACHE_PROGRAM, capacity], capture_output=True, text=True, check=True, env=env)
    return [word for line in out.stdout.splitlines() for word in line.split(",") if word.startswith("create:cache_")]


def test_the_onednn_cache_capacity_set_after_torch_loads_is_the_one_onednn_uses():
    default = _cache_lookups("default")
    if not default:
        pytest.skip("this CPU runs bf16 matmuls outside oneDNN (no oneDNN primitive logged)")
    assert default == ["create:cache_miss", "create:cache_hit"]
    assert _cache_lookups("0") == ["create:cache_miss", "create:cache_miss"]  # no cache: made again


def test_an_onednn_cache_capacity_the_user_set_is_kept():
    env = {"DNNL_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert not allocator.set_onednn_cache_capacity(128, env) and env == {"DNNL_PRIMITIVE_CACHE_CAPACITY": "64"}
    env = {}
    assert allocator.set_onednn_cache_capacity(128, env) and env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128"}


@pytest.mark.parametrize("bad", [-1, 2**21, 1.5, "128"])
def test_a_bad_onednn_cache_capacity_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"train\.onednn_cache_capacity=.* must be an int in \[0, 1048576\]"):
        LoopSection(onednn_cache_capacity=bad)
