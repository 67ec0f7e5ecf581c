"""TrainStep's gradient norm and clipping: the norm is the float64 value to fp32 rounding, the gradients are
multiplied only where the coefficient is below 1, and the step is then torch's clip_grad_norm_ followed by the
optimizer's step (bit for bit where nothing is clipped)."""

import pytest
import torch

from aiayn import build_model
from aiayn.data import LMBatch
from aiayn.training.objectives import Objective
from aiayn.training.optim import OptimConfig, build_optimizer
from aiayn.training.step import TrainStep, global_norm


@pytest.mark.parametrize("grad_clip", [1e-3, None, 1e6])  # clipping every step, no clipping, a bound never reached
def test_clipping_equals_clip_grad_norm(grad_clip):
    torch.manual_seed(0)
    models = [build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    config = OptimConfig(name="adamw", lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    optimizers = [build_optimizer(m, config) for m in models]
    step = TrainStep(Objective(models[0], "lm"), models[0], optimizers[0], grad_clip=grad_clip)
    reference = Objective(models[1], "lm")
    data = torch.randint(0, 24, (4, 4, 9), generator=torch.Generator().manual_seed(1))
    for i, batch in enumerate(data):
        micro = [LMBatch(input=batch[:, :-1], target=batch[:, 1:])]
        result = step(micro, i + 1)
        loss = reference(micro[0])
        (loss.sum / loss.count).backward()
        norm = torch.nn.utils.clip_grad_norm_(models[1].parameters(), grad_clip or float("inf"))
        optimizers[1].step()
        optimizers[1].zero_grad(set_to_none=True)
        assert result.grad_norm == pytest.approx(float(norm), rel=1e-5)
        assert grad_clip != 1e-3 or result.grad_norm > 1e-3  # so the first case does clip
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        if grad_clip == 1e-3:  # the coefficients agree to the norms' last bits
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(a, b)


def test_the_global_norm_against_float64():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=g) for n in (3, 4097, 70_001)]
    want = torch.cat([t.double() for t in grads]).norm().item()
    assert float(global_norm(grads)) == pytest.approx(want, rel=1e-5)
    assert float(global_norm([t.bfloat16() for t in grads])) == pytest.approx(
        torch.cat([t.bfloat16().double() for t in grads]).norm().item(), rel=1e-5)
    assert float(global_norm([])) == 0.0
    assert float(global_norm([torch.ones(4, dtype=torch.float64)])) == 2.0  # torch's norm where ours does not apply
