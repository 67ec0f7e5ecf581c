"""``torch.compile`` traces each family as one graph (no graph breaks) and matches eager mode.

``fullgraph=True`` makes any graph break an error; the ``aot_eager`` backend traces forward and
backward like Inductor does but runs the ops eagerly, so the test needs no C++ compiler and stays
fast. Padding is included so the fully-masked-row path of attention is traced too.
"""

import pytest
import torch

from aiayn import build_model


def _inputs(family: str) -> tuple:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(7, 64, (2, 7), generator=g)
    pad = torch.ones(2, 7, dtype=torch.bool)  # True = a real token
    pad[1, 4:] = False  # the second sequence is padded after 4 tokens
    if family == "encoder-decoder":
        return ids, torch.randint(7, 64, (2, 5), generator=g), pad
    return (ids, pad)


@pytest.mark.parametrize("preset", ["tiny-encoder-decoder", "tiny-decoder-only", "tiny-encoder-only"])
@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
def test_compiled_model_matches_eager(preset, positions):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(preset, positions=positions).eval()
    family = model.config.family
    args = _inputs(family)
    if family == "encoder-decoder":
        src, tgt, pad = args
        eager = model(src, tgt, src_mask=pad)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(src, tgt, src_mask=pad)
    else:
        ids, pad = args
        eager = model(ids, pad)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(ids, pad)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)


def test_compiled_backward_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only")
    ids, pad = _inputs("decoder-only")
    model(ids, pad).square().mean().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.compile(model, backend="aot_eager", fullgraph=True)(ids, pad).square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager[name], atol=1e-5, rtol=1e-4, msg=name)
