"""Which kernel runs each Linear layer at inference, decided by timing the candidates on this machine.

For one row (batch-1 decoding), MKL's sgemm through ``F.linear`` and oneDNN over a weight packed once
trade places by CPU: oneDNN was 1.8x faster through GPT-2's output projection on an AVX2 AMD EPYC,
MKL 1.36x faster for 768 -> 3072 on an AMX Xeon (issue 27). No rule read off the CPU's name picked
the winner on both, so :func:`choose_kernels` times both for each distinct shape, dtype and thread
count, for one row and for several, keeps the faster, and caches the answer per CPU model, torch version and thread count in
``$XDG_CACHE_HOME/aiayn/kernels.json`` (else ``~/.cache/aiayn/``), so a second load times nothing.

``AIAYN_LINEAR_KERNEL`` overrides: ``measure`` (the default), ``packed`` (oneDNN wherever it can
pack) or ``plain`` (``F.linear`` everywhere).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.untrusted import read_json_file

__all__ = ["CHOICES", "ENV_VAR", "KERNELS", "cache_path", "choose_kernels", "kernel_mode", "machine_key"]

log = logging.getLogger(__name__)

ENV_VAR = "AIAYN_LINEAR_KERNEL"
CHOICES = ("measure", "packed", "plain")
KERNELS = ("packed", "plain", "packed-one-row", "packed-many-rows")
MARGIN = 0.97  # packed must be 3% faster to be kept: it holds a second copy of the weight


def kernel_mode() -> str:
    """``$AIAYN_LINEAR_KERNEL`` (default ``measure``); a ``ValueError`` naming it for another value."""
    mode = os.environ.get(ENV_VAR, "measure").strip().lower() or "measure"
    if mode not in CHOICES:
        raise ValueError(f"${ENV_VAR} must be one of {', '.join(CHOICES)}, got {os.environ[ENV_VAR]!r}")
    return mode


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiayn" / "kernels.json"


def machine_key() -> str:
    """What a timing depends on besides the shape: the CPU model, torch's version and the thread count."""
    return f"{_cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def choose_kernels(weights: list[Tensor], rows: int = 8) -> list[str]:
    """Which kernel runs each ``weight (out, in)`` here, one of :data:`KERNELS`: read from the cache, or timed
    once per distinct shape and dtype and cached (the cache is read once and written once per call).

    Both kernels are timed for one row (one-token decoding) and for ``rows`` rows (a batch, a prompt,
    speculative verification; an encoder's batch x tokens), since the winner can differ between the two
    (MKL fast for one row and many times slower for two, on some CPUs): ``packed`` where oneDNN wins both,
    ``plain`` where F.linear does, else ``packed-one-row`` / ``packed-many-rows`` (oneDNN for that regime
    only; :class:`~aiayn.inference.precision.PackedLinear` picks per call). The shapes timed now are logged
    in one INFO line. Only called for weights oneDNN can pack (see :func:`~aiayn.inference.precision.can_pack`)."""
    mode = kernel_mode()
    if mode != "measure":
        return [mode] * len(weights)
    shapes = [f"{w.shape[1]}->{w.shape[0]} {str(w.dtype).removeprefix('torch.')} 1|{rows} rows" for w in weights]
    path, key = cache_path(), machine_key()
    table = _read(path)
    known = {shape: str(choice) for shape, choice in table.get(key, {}).items() if choice in KERNELS}
    timed: list[str] = []
    for shape, weight in zip(shapes, weights):
        if shape in known:
            continue
        one = _time_both(weight, 1)
        many = _time_both(weight, rows)
        wins = (one[0] < MARGIN * one[1], many[0] < MARGIN * many[1])
        known[shape] = {(True, True): "packed", (True, False): "packed-one-row", (False, True): "packed-many-rows"}.get(wins, "plain")
        timed.append(f"{shape}: oneDNN packed {one[0]:.3f} / {many[0]:.3f} ms, F.linear {one[1]:.3f} / {many[1]:.3f} ms "
                     f"(1 / {rows} rows) -> {known[shape]}")
    if timed:
        log.info("Linear kernels timed on this machine (%s), cached in %s ($%s overrides): %s", key, path, ENV_VAR, "; ".join(timed))
        table = _read(path)  # another process may have written meanwhile
        table[key] = {**table.get(key, {}), **known}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, json.dumps(table, indent=1, sort_keys=True).encode())
        except OSError as err:  # a read-only home: choose again next time
            log.warning("could not cache the kernel choice in %s: %s", path, err)
    return [known[shape] for shape in shapes]


def _read(path: Path) -> dict:
    """The cache, or ``{}`` when absent; a corrupt one (or one over 1 MiB) is ignored with a warning (and rewritten)."""
    if not path.exists():
        return {}
    try:
        table = read_json_file(path, what="kernel-choice cache", max_bytes=1 << 20, expect=dict)
        if not all(isinstance(v, dict) for v in table.values()):
            raise ValueError("not an object of objects")
        return table
    except (OSError, ValueError) as err:
        log.warning("ignoring the corrupt kernel-choice cache %s (%s); it will be rebuilt", path, err)
        return {}


COLD_BYTES = 96 << 20  # more than a server CPU's last-level cache (32 MiB on the EPYC here): each call reads from memory
MAX_COPIES = 64


def _time_both(weight: Tensor, rows: int = 1, rounds: int = 7) -> tuple[float, float]:
    """Milliseconds a call of ``rows`` rows through (packed, plain): the fastest single call of ``rounds``
    interleaved rounds (another process taking the core only ever adds time, so the minimum is the kernel's own).

    Each call reads another copy of the weight, the copies together larger than the last-level cache, as in
    a model whose other layers evict this one between tokens: a weight timed hot in the cache favours the
    kernel that computes faster over the one that streams memory faster (a bf16 768 -> 3072 layer timed hot
    chose F.linear, which then took 209 us a token in decoding against oneDNN's 65 us)."""
    w = weight.detach()
    size = w.numel() * w.element_size()
    copies = max(1, min(MAX_COPIES, -(-COLD_BYTES // size)))
    weights = [w.clone() for _ in range(copies)]
    x = torch.randn(rows, w.shape[1], dtype=w.dtype)
    packed = [torch.ops.mkldnn._reorder_linear_weight(c, None) for c in weights]
    runs = {
        "packed": [lambda p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed],
        "plain": [lambda c=c: F.linear(x, c) for c in weights],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for fns in runs.values():  # warm-up: first-call allocations, oneDNN's primitive cache
            fns[0]()
            fns[-1]()
        for r in range(rounds):
            for name in (("packed", "plain") if r % 2 == 0 else ("plain", "packed")):
                for fn in runs[name]:
                    start = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - start) * 1e3)
    return min(times["packed"]), min(times["plain"])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

