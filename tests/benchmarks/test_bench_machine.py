"""benchmarks/machine.py: the CPU line every benchmark prints first."""

import os

from bench_scripts import load_benchmark


def test_cpu_summary_names_the_cpu_and_the_flags_that_pick_kernels():
    line = load_benchmark("machine").cpu_summary()
    for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"):
        assert f"{flag} yes" in line or f"{flag} no" in line
    assert f"{os.cpu_count()} cores" in line
