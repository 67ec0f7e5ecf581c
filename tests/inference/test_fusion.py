"""Fused projections at inference (aiayn.inference.fusion): Q/K/V and SwiGLU's gate/up as one layer each
give the unfused logits, keep the checkpoint keys, and survive save and load; int8 and int4 layers fuse too."""

import pytest
import torch
from torch import nn

from aiayn import build_model
from aiayn.inference.fusion import fuse_projections
from aiayn.inference.quantization import quantize
from aiayn.pretrained import load_pretrained, save_pretrained


def model_of(kind, **overrides):
    torch.manual_seed(0)
    return build_model(kind, dropout=0.0, **overrides).eval()


def inputs(kind):
    ids = torch.randint(3, 64, (2, 9))
    return (ids, ids[:, :6]) if kind == "tiny-encoder-decoder" else (ids,)


CASES = [
    ("tiny-decoder-only", {"activation": "swiglu", "n_kv_heads": 1}),  # GQA: q wider than k and v
    ("tiny-encoder-decoder", {}),  # cross-attention stays three layers (K, V read the encoder output)
    ("tiny-encoder-only", {}),
]


@pytest.mark.parametrize(("kind", "overrides"), CASES)
def test_fused_projections_give_the_unfused_logits_and_keys(kind, overrides):
    model = model_of(kind, **overrides)
    args = inputs(kind)
    with torch.no_grad():
        reference = model(*args)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fused = fuse_projections(model)
    assert fused == sum(1 for m in model.modules() if getattr(m, "w_qkv", None) is not None or getattr(m, "w_gate_up", None) is not None)
    assert fused >= 2 and not any(getattr(m, "w_q", None) is not None and getattr(m, "w_qkv", "x") is not None for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(*args), reference, rtol=1e-5, atol=1e-5)
    after = model.state_dict()
    assert list(after) == list(state)  # the same keys, in the same order
    for key in state:
        assert torch.equal(after[key], state[key]), key
    if overrides.get("activation") == "swiglu":
        assert all(m.w_gate_up is not None for m in model.modules() if hasattr(m, "w_gate_up"))


def test_a_fused_model_saves_loads_and_takes_an_unfused_state_dict(tmp_path):
    model = model_of("tiny-decoder-only", activation="swiglu")
    unfused_state = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = load_pretrained(save_pretrained(tmp_path / "m", model), pack=False).model  # loading fuses
    assert any(getattr(m, "w_qkv", None) is not None for m in loaded.modules())
    ids = torch.randint(3, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=1e-5, atol=1e-5)
    save_pretrained(tmp_path / "again", loaded)  # a fused model writes the unfused keys
    again = load_pretrained(tmp_path / "again", pack=False).model
    fresh = model_of("tiny-decoder-only", activation="swiglu")
    fuse_projections(fresh)
    fresh.load_state_dict(unfused_state)  # an unfused state dict loads into a fused model
    with torch.no_grad():
        torch.testing.assert_close(again(ids), model(ids), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fresh(ids), model(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["int8", "int8-dynamic", "int4"])
def test_quantised_layers_fuse_to_what_they_computed_apart(method):
    if method == "int4" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("no int4 CPU kernel in this torch")
    model = quantize(model_of("tiny-decoder-only", d_model=64, n_heads=4, d_ff=128), method)
    ids = torch.randint(3, 64, (2, 9))
    with torch.no_grad():
        reference = model(ids)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert fuse_projections(model) >= 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules() if m is not None and hasattr(m, "w_qkv"))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference, rtol=1e-4, atol=1e-4)  # per-row scales: stacking rows is exact
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)
