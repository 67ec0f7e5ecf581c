"""models.meta: the meta build has exactly the real model's keys, shapes and dtypes, allocates nothing, and does not
import torch._dynamo (a second of every load)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn import build_model
from aiayn.models.meta import meta_state_dict

# The model variants whose __init__ computes tables or initial values (positions, the SSM), each on a tiny preset.
VARIANTS = {
    "tiny-encoder-decoder": {},
    "tiny-decoder-only": {},
    "tiny-encoder-only": {},
    "rotary": {"positions": "rotary"},
    "sinusoidal": {"positions": "sinusoidal"},
    "alibi": {"positions": "alibi"},
    "ssm": {"mixer": "ssm"},
    "linear": {"attention": "linear"},
    "local": {"attention": "local", "window": 8},
}


def _model(name):
    preset = name if name.startswith("tiny-") else "tiny-decoder-only"
    return build_model(preset, vocab_size=50, **VARIANTS[name])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_meta_build_matches_the_real_one(name):
    model = _model(name)
    real = model.state_dict()
    meta = meta_state_dict(model.config)
    assert list(meta) == list(real)
    assert all(meta[k].is_meta and meta[k].shape == real[k].shape and meta[k].dtype == real[k].dtype for k in real)


def test_the_meta_build_does_not_import_dynamo():
    """Meta versions of arange, exp and the like are Python decompositions that import torch._dynamo and sympy: about
    a second of every load of a sinusoidal, rotary or SSM checkpoint (docs/benchmarks.md, "Start-up")."""
    program = """
import sys
sys.path.insert(0, "tests/models")
from test_meta import VARIANTS, _model
from aiayn.models.meta import meta_state_dict
for name in VARIANTS:
    meta_state_dict(_model(name).config)
print("torch._dynamo" in sys.modules, "sympy" in sys.modules)
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "False"]


def test_normal_init_outside_the_meta_build_is_untouched():
    meta_state_dict(build_model("tiny-decoder-only", vocab_size=50).config)
    x = torch.zeros(1000)
    torch.nn.init.normal_(x)
    assert x.std() > 0.5
    assert torch.arange(3).device.type == "cpu" and torch.zeros(2).device.type == "cpu"
