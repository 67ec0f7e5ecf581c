"""One row through a Linear layer, its output features cut into slices that torch's threads compute at once.

For one row (batch-1 decoding) a Linear layer is a matrix-vector product: it reads the whole weight for two
flops a weight, so its speed is the memory bandwidth its threads draw. ``torch.baddbmm`` over the weight seen as
``parts`` slices of its rows (a view, no copy) hands each slice to one of torch's threads (with 2 threads, GPT-2-small's
fp32 decoding went from 14.2 to 18.3 tokens/s on the 2-core AVX2 EPYC: ``docs/benchmarks.md``). Whether it wins is
timed per shape on each machine, beside the others (:mod:`aiayn.inference.kernel_choice`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["split_parts", "split_linear"]


def split_parts() -> int:
    """The slices a weight is cut into: two for each of torch's threads, so that a thread that finishes
    early takes another."""
    return 2 * torch.get_num_threads()


def split_linear(x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> Tensor:
    """``F.linear(x, weight, bias)`` for one row ``x (..., in)``, the ``out`` features computed in ``parts`` slices
    at once; the rows left over when ``parts`` does not divide ``out`` (a 50257-word output) go through ``F.linear``."""
    n, k = weight.shape
    row, size = x.reshape(1, k), n // parts
    cut = parts * size
    slices = weight[:cut].view(parts, size, k).transpose(1, 2)  # (parts, in, size): slice p is rows p*size.. of the weight
    rows = row.expand(parts, 1, k)
    y = torch.bmm(rows, slices) if bias is None else torch.baddbmm(bias[:cut].view(parts, 1, size), rows, slices)
    y = y.view(1, cut)
    if cut < n:
        y = torch.cat([y, torch.nn.functional.linear(row, weight[cut:], None if bias is None else bias[cut:])], dim=1)
    return y.view(*x.shape[:-1], n)
