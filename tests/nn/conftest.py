"""Fixtures of the layer tests."""

import pytest


@pytest.fixture
def linear_results():
    """``run(fn, dtype, x, w, b, grad)``: ``fn(x, w, b)`` (``F.linear``'s arguments) with the float64 inputs cast to
    ``dtype``, backward from ``grad``; returns the output and the gradients of x, w (and b), as float64."""

    def run(fn, dtype, x64, w64, b64, grad64):
        x = x64.to(dtype).requires_grad_(True)
        w = w64.to(dtype).requires_grad_(True)
        b = b64.to(dtype).requires_grad_(True) if b64 is not None else None
        y = fn(x, w, b)
        y.backward(grad64.to(dtype))
        return [t.double() for t in (y, x.grad, w.grad, *([b.grad] if b is not None else []))]

    return run
