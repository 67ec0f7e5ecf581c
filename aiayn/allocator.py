"""The memory allocator of the ``aiayn`` command: mimalloc where it is installed, else the system's malloc.

Training feeds the model batches of a new shape nearly every step. glibc's malloc keeps the freed blocks of
the old shapes (its mmap threshold grows with the largest block freed, so large tensors come from the heap,
which it rarely gives back), and a run's resident memory climbs far above what its tensors need. mimalloc
reuses and returns them: 150 steps of ``multi30k-de-en`` peaked at 1,720 MB against glibc's 3,205 MB, at 4,713
tokens/s against 4,045, with the same loss to the last bit (``benchmarks/train_memory.py --allocators``; the CPU, the
date and the command in ``docs/benchmarks.md``).

A running process cannot change its allocator, so the command re-executes itself once, with mimalloc in
``LD_PRELOAD``, before it imports torch (PyTorch's own CPU launcher, ``torch.backends.xeon.run_cpu``, preloads
jemalloc or tcmalloc the same way). ``$AIAYN_ALLOCATOR`` chooses: ``auto`` (the default: mimalloc where the
``cmeel-mimalloc`` wheel is installed, on Linux), ``mimalloc`` (an error where it is not) or ``system``. An
allocator the user preloads (any ``*malloc*`` in ``LD_PRELOAD``) is kept. This module imports no torch.

mimalloc returns memory freed for a second (its purge delay) to the system, and memory returned costs a page fault
per 4 KiB when it is taken again: on the Zen 5 VM here a first touch of fresh memory was ten times slower than a
second. A training step longer than that second gave back what the next step would take again, so training
holds freed memory for ten of its steps by default (``train.hold_freed_steps``; :func:`hold_freed_memory`):
``multi30k-de-en`` trained 1.1-1.3x more tokens a second for 2-5% more peak memory (docs/benchmarks.md).

Under glibc's malloc, ``train.malloc_mmap_threshold`` fixes its mmap threshold for a run (:func:`set_mmap_threshold`):
less memory too (2,616 -> 1,531 MB over 60 Multi30k steps), but every large tensor is then a fresh ``mmap`` whose pages
are faulted in, and on an AMX Xeon it halved the steps per second, so no recipe sets it.

``train.onednn_cache_capacity`` bounds the other store that grows with the batch shapes: oneDNN's cache of compiled
primitives (:func:`set_onednn_cache_capacity`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from aiayn.environment import env_choice

__all__ = ["CHOICES", "ENV_VAR", "ONEDNN_CACHE_ENV", "allocator_mode", "describe", "hold_freed_memory", "mimalloc_path",
           "preload_env", "reexec_with_allocator", "set_mmap_threshold", "set_onednn_cache_capacity"]

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3  # glibc's malloc.h

ENV_VAR = "AIAYN_ALLOCATOR"
CHOICES = ("auto", "mimalloc", "system")
_EXECED = "AIAYN_ALLOCATOR_EXECED"  # set in the re-executed process: never a second time, whatever happened
_LIBRARY = Path("cmeel.prefix") / "lib" / "libmimalloc.so"  # where the cmeel-mimalloc wheel puts it


def allocator_mode(env: Mapping[str, str] = os.environ) -> str:
    """``$AIAYN_ALLOCATOR`` (default ``auto``); a ``ValueError`` naming it, the value and the choices otherwise."""
    return env_choice(ENV_VAR, CHOICES, env)


def mimalloc_path() -> Path | None:
    """mimalloc's shared library from the ``cmeel-mimalloc`` wheel on ``sys.path``, or ``None``."""
    for entry in sys.path:
        candidate = Path(entry or ".") / _LIBRARY
        if candidate.is_file():
            return candidate.resolve()
    return None


def preload_env(env: Mapping[str, str], *, platform: str = sys.platform, library: Path | None = None) -> dict[str, str] | None:
    """The environment to re-execute with (``env`` with mimalloc first in ``LD_PRELOAD``), or ``None`` when the
    process should run as it is: ``system``, not Linux, already re-executed, an allocator already preloaded,
    or (``auto``) mimalloc not installed. ``mimalloc`` where it cannot be had raises ``RuntimeError``."""
    mode = allocator_mode(env)
    if mode == "system" or env.get(_EXECED) or "malloc" in env.get("LD_PRELOAD", ""):
        return None
    library = library or mimalloc_path()
    usable = library is not None and not any(c in str(library) for c in " :")  # LD_PRELOAD splits at both
    if platform != "linux" or not usable:
        if mode == "mimalloc":
            where = ("on Linux only" if platform != "linux" else
                     f"from a path without spaces or colons, not {str(library)!r}" if library is not None else
                     "from the cmeel-mimalloc wheel (pip install cmeel-mimalloc)")
            raise RuntimeError(f"${ENV_VAR}=mimalloc: mimalloc is preloaded {where}; set ${ENV_VAR}=auto or system")
        return None
    preload = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, _EXECED: "1"}


def reexec_with_allocator() -> None:
    """Replace this process by itself with mimalloc preloaded, when :func:`preload_env` says so (it does not
    return then); else return at once. Call it before importing torch: everything imported is loaded again."""
    env = preload_env(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _mimalloc_loaded() -> str | None:
    """The path of the mimalloc library mapped into this process, or ``None``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return next((line.split()[-1] for line in maps.splitlines() if "libmimalloc" in line), None)


def describe() -> str:
    """The allocator this process runs, for logs: mimalloc (and from where) or the system's malloc."""
    loaded = _mimalloc_loaded()
    if loaded:
        return f"mimalloc ({loaded}; ${ENV_VAR}=system for the system's malloc)"
    return "the system's malloc" + ("" if mimalloc_path() else " (pip install cmeel-mimalloc for mimalloc: less memory in training)")


_PURGE_DELAY = 15  # mi_option_purge_delay in mimalloc 3's mi_option_t (mimalloc.h)
PURGE_ENV = "MIMALLOC_PURGE_DELAY"


def hold_freed_memory(seconds: float) -> int | None:
    """Have mimalloc keep freed memory ``seconds`` (at least its default second) before it returns it to the
    system; the delay set, in milliseconds, or ``None`` where this process runs no mimalloc 3 or
    ``$MIMALLOC_PURGE_DELAY`` chose the delay already (the user's setting is kept)."""
    loaded = _mimalloc_loaded()
    if not loaded or PURGE_ENV in os.environ:
        return None
    try:
        library = ctypes.CDLL(loaded)  # the copy already mapped: the same allocator
        version = library.mi_version()  # 30403 for 3.4.3 (mimalloc 2 wrote 212 for 2.1.2)
        if (version // 10000 if version >= 10000 else version // 100) != 3:  # the option's number is mimalloc 3's
            return None
        delay = max(1000, round(seconds * 1000))
        library.mi_option_set(_PURGE_DELAY, ctypes.c_long(delay))
        return delay
    except (OSError, AttributeError):
        return None


def set_mmap_threshold(threshold: int) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, threshold)`` for glibc's malloc (``train.malloc_mmap_threshold``); False, with a
    warning, where the process runs another allocator (mimalloc) or the C library is not glibc."""
    if _mimalloc_loaded():
        log.warning("train.malloc_mmap_threshold=%d: this process allocates with mimalloc, not glibc's malloc, so the "
                    "setting is ignored (%s=system to use glibc's with it)", threshold, ENV_VAR)
        return False
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


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"  # oneDNN's own variable (DNNL_PRIMITIVE_CACHE_CAPACITY is its old name)


def set_onednn_cache_capacity(capacity: int, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Have oneDNN keep at most ``capacity`` compiled primitives (``train.onednn_cache_capacity``); False where the
    user set the variable already (theirs is kept, and logged). oneDNN keeps one set of primitives per matmul shape, up to 1,024
    by default, and each holds its JIT code and buffers: with batches of many shapes they are much of what a run's
    memory grows by. oneDNN reads the variable once, at its first primitive, so call this before any bf16 matmul."""
    for name in (ONEDNN_CACHE_ENV, "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        if name in env:
            log.info("train.onednn_cache_capacity=%d: $%s=%s is kept", capacity, name, env[name])
            return False
    env[ONEDNN_CACHE_ENV] = str(capacity)
    return True
