"""The selective SSM: the recurrent (cached) path equals the parallel one; padding neither enters nor decays the state."""

import pytest
import torch

from aiayn.nn.ssm import SelectiveSSM, selective_scan, selective_scan_sequential


def layer(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return SelectiveSSM(8, d_state=4, d_conv=3, expand=2).to(dtype)


def test_recurrent_steps_equal_the_parallel_pass():
    ssm = layer()
    x = torch.randn(2, 9, 8)
    full = ssm(x)
    cache = ssm.new_cache()
    parts = [ssm(x[:, :4], cache=cache)]
    for i in range(4, 9):
        parts.append(ssm(x[:, i : i + 1], cache=cache))
        torch.testing.assert_close(torch.cat(parts, dim=1), full[:, : i + 1], atol=1e-5, rtol=1e-5)
    assert cache.h.shape == (2, 16, 4) and cache.conv.shape == (2, 16, 2) and cache.length == 9


def test_left_padding_changes_nothing():
    ssm = layer()
    x = torch.randn(1, 6, 8)
    alone = ssm(x)
    padded = torch.cat([torch.randn(1, 3, 8), x], dim=1)
    mask = torch.tensor([[False] * 3 + [True] * 6])
    torch.testing.assert_close(ssm(padded, pad_mask=mask)[:, 3:], alone, atol=1e-5, rtol=1e-5)


def test_the_layers_scan_equals_the_recurrence_written_out():
    g = torch.Generator().manual_seed(0)
    u, dt = torch.randn(1, 3, 2, generator=g), torch.rand(1, 3, 2, generator=g)
    a, b, c, d = -torch.rand(2, 2, generator=g), torch.randn(1, 3, 2, generator=g), torch.randn(1, 3, 2, generator=g), torch.randn(2, generator=g)
    y, h = selective_scan_sequential(u, dt, a, b, c, d)  # what SelectiveSSM runs; the doubling scan is tested against it below
    state = torch.zeros(2, 2)
    for t in range(3):
        for e in range(2):
            for n in range(2):
                state[e, n] = torch.exp(dt[0, t, e] * a[e, n]) * state[e, n] + dt[0, t, e] * b[0, t, n] * u[0, t, e]
            expected = (state[e] * c[0, t]).sum() + d[e] * u[0, t, e]
            torch.testing.assert_close(y[0, t, e], expected)
    torch.testing.assert_close(h[0], state)


@pytest.mark.parametrize("length", [1, 2, 7, 16, 33])
def test_doubling_scan_equals_the_loop_forward_and_backward(length):
    g = torch.Generator().manual_seed(length)
    u, dt = torch.randn(2, length, 3, generator=g, dtype=torch.float64), torch.rand(2, length, 3, generator=g, dtype=torch.float64)
    a = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 4
    b, c = torch.randn(2, length, 4, generator=g, dtype=torch.float64), torch.randn(2, length, 4, generator=g, dtype=torch.float64)
    d, h0 = torch.randn(3, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (u, dt, a, b, c, d, h0)]
    fast, fast_h = selective_scan(*inputs)
    slow, slow_h = selective_scan_sequential(*inputs)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(fast_h, slow_h)
    weight = torch.randn_like(fast)
    for x, y in zip(torch.autograd.grad((fast * weight).sum() + fast_h.sum(), inputs), torch.autograd.grad((slow * weight).sum() + slow_h.sum(), inputs)):
        torch.testing.assert_close(x, y)


def test_gradcheck_float64():
    ssm = layer(dtype=torch.float64)
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ssm(x), (x,))
