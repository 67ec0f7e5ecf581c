"""Which CPU this is: its name, its family/model/stepping and the flags that pick torch's and llama.cpp's kernels
(AVX2, AVX-512, AVX512-BF16, AMX). A name alone does not tell CPUs apart: a 2-core "AMD EPYC" was an AVX2-only
Zen 3 one day, a Zen 4 or a Zen 5 with native bf16 on others, and a kernel timed on one is not the winner on another."""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FLAGS", "CpuInfo", "cpu_info", "cpu_key", "cpu_summary", "parse_cpuinfo"]

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class CpuInfo:
    """The first processor of ``/proc/cpuinfo`` (every core of the machines here is the same)."""

    name: str
    family: str  # '?' where the system does not say (no /proc/cpuinfo)
    model: str
    stepping: str
    flags: frozenset[str]
    known: bool  # False: no /proc/cpuinfo, so the flags are unknown


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU (read once)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return CpuInfo(platform.processor() or platform.machine(), "?", "?", "?", frozenset(), known=False)


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor of a ``/proc/cpuinfo`` text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    return CpuInfo(fields.get("model name", "unknown CPU"), fields.get("cpu family", "?"), fields.get("model", "?"),
                   fields.get("stepping", "?"), frozenset(fields.get("flags", "").split()), known=True)


def cpu_summary(cpu: CpuInfo | None = None) -> str:
    """'CPU model (family F model M, N cores); avx2 yes, avx512f no, ...': the line every benchmark prints first
    (the model too: family 25 was an AVX2-only Zen 3 one day and a Zen 4 with AVX-512 and AVX512-BF16 another)."""
    cpu = cpu or cpu_info()
    if not cpu.known:
        return f"{cpu.name}, {os.cpu_count()} cores; flags unknown (no /proc/cpuinfo)"
    head = f"{cpu.name} (family {cpu.family} model {cpu.model}, {os.cpu_count()} cores)"
    return head + "; " + ", ".join(f"{f} {'yes' if f in cpu.flags else 'no'}" for f in FLAGS)


def cpu_key(cpu: CpuInfo | None = None) -> str:
    """What a cached timing belongs to: the name, family, model and stepping, and which of :data:`FLAGS` the CPU has
    (e.g. 'AMD EPYC (family 26 model 2 stepping 1; avx2 avx512f avx512_bf16)')."""
    cpu = cpu or cpu_info()
    flags = " ".join(f for f in FLAGS if f in cpu.flags) or "none of " + "/".join(FLAGS)
    return f"{cpu.name} (family {cpu.family} model {cpu.model} stepping {cpu.stepping}; {flags})"
