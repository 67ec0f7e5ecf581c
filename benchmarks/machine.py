"""The CPU a benchmark ran on, as its first line prints it: the model name and the flags that pick torch's and
llama.cpp's kernels (AVX2, AVX-512, AVX512-BF16, AMX), since a number is only meaningful beside the CPU it came from."""

from __future__ import annotations

import os
import platform
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_summary() -> str:
    """'CPU model (family F, N cores); avx2 yes, avx512f no, ...' from /proc/cpuinfo (the family tells apart CPUs
    that share a model name, as AMD's EPYC generations do)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; flags unknown (no /proc/cpuinfo)"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    head = f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, {os.cpu_count()} cores)"
    return head + "; " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
