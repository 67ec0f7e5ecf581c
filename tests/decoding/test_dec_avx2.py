"""The compiled decode step where Inductor writes AVX2 code (``ATEN_CPU_CAPABILITY=avx2``, as on an AVX2-only CPU),
run on whatever CPU the suite has: int4 through its opaque op, weight-only int8 not frozen
(``aiayn.inference.quantization.avx512_graphs``). Before that rule the first gave NaN logits and the second other
tokens than the eager step."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"), reason="needs an x86 CPU with AVX2")
def test_compiled_quantised_steps_under_inductors_avx2_code():
    tests = ["tests/decoding/test_dec_static.py::test_compiled_decoding_through_other_kernels_gives_the_eager_logits",
             "tests/conformance/test_conformance.py::test_cell[lm-rotary-compile]"]
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout  # int4, int8-dynamic, native; the cell
