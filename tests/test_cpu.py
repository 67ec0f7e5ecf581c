"""aiayn/cpu.py: the CPU line every benchmark prints first, and the key that cached kernel timings belong to."""

import os

from aiayn.cpu import FLAGS, cpu_key, cpu_summary, parse_cpuinfo
from aiayn.inference.kernel_choice import machine_key

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx avx2 fma

processor\t: 1
cpu family\t: 25
model name\t: AMD EPYC
"""
ZEN5 = ZEN3.replace("cpu family\t: 25\nmodel\t\t: 1", "cpu family\t: 26\nmodel\t\t: 2").replace("avx2 fma", "avx2 fma avx512f avx512_bf16")


def test_cpu_summary_names_the_cpu_and_the_flags_that_pick_kernels():
    line = cpu_summary()
    for flag in FLAGS:
        assert f"{flag} yes" in line or f"{flag} no" in line
    assert f"{os.cpu_count()} cores" in line


def test_two_cpus_that_share_a_name_get_different_keys():
    zen3, zen5 = parse_cpuinfo(ZEN3), parse_cpuinfo(ZEN5)
    assert zen3.name == zen5.name == "AMD EPYC"
    assert cpu_key(zen3) == "AMD EPYC (family 25 model 1 stepping 1; avx2)"
    assert cpu_key(zen5) == "AMD EPYC (family 26 model 2 stepping 1; avx2 avx512f avx512_bf16)"
    assert "family 25 model 1," in cpu_summary(zen3)  # the model too: a family-25 EPYC was also a Zen 4 with AVX-512
    assert "family 26 model 2," in cpu_summary(zen5) and "avx512_bf16 yes" in cpu_summary(zen5) and "amx_tile no" in cpu_summary(zen5)


def test_the_kernel_cache_is_keyed_by_the_whole_cpu_key():
    assert machine_key().startswith(cpu_key() + " | torch ")
