"""Real half-precision weights: the model is cast once at load, so no step re-casts a weight.

``torch.autocast`` casts every weight at every call; at batch 1 decoding reads each weight once
per token, so a cast per call costs as much as the matmul it feeds. Casting the parameters once
halves the bytes read per token instead. Softmax (:mod:`aiayn.nn.attention`), LayerNorm/RMSNorm
(torch's kernels) and the logits consumers (sampling, beam search, perplexity) accumulate in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DTYPES", "cast_model", "parse_dtype"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(value: str | torch.dtype | None, *, name: str = "dtype") -> torch.dtype | None:
    """``"bfloat16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; ``None`` stays ``None`` (keep the file's).

    Raises ``ValueError`` naming ``name``, the value and the accepted choices.
    """
    if value is None or (isinstance(value, torch.dtype) and value in DTYPES.values()):
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")


def cast_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast every floating parameter and buffer to ``dtype`` in place, once; returns ``model``.

    Integer tensors (token tables, int8 weights) stay as they are, and so do the fp32 scales of
    :class:`~aiayn.inference.quantization.Int8Linear` (they are small and keep the int8 grid exact).
    """
    from aiayn.inference.quantization import Int8Linear

    for module in model.modules():
        if isinstance(module, Int8Linear):
            if module.bias is not None:
                module.bias.data = module.bias.data.to(dtype)
            continue
        for param in module.parameters(recurse=False):  # a tied parameter is one object: cast once
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                setattr(module, name, buffer.to(dtype))
    return model
