"""Real half-precision weights: the model is cast once at load, so no step re-casts a weight.

``torch.autocast`` casts every weight at every call; at batch 1 decoding reads each weight once
per token, so a cast per call costs as much as the matmul it feeds. Casting the parameters once
halves the bytes read per token instead. On the CPU a half-precision ``F.linear`` of one row
re-lays its weight out at every call (oneDNN), which costs more than the fp32 matmul; so
:func:`pack_linears` keeps each half-precision weight also in oneDNN's blocked layout, packed once
(the layout ``torch.compile``'s freezing uses). Softmax (:mod:`aiayn.nn.attention`), LayerNorm/RMSNorm
(torch's kernels) and the logits consumers (sampling, beam search, perplexity) accumulate in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DTYPES", "PackedLinear", "cast_model", "native_bf16", "pack_linears", "parse_dtype"]

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


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices natively (AMX or AVX512-BF16 on the CPU; Ampere+ on CUDA)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


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


def _can_pack(weight: Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float16 and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


class PackedLinear(nn.Module):
    """An ``nn.Linear`` (same ``weight``/``bias`` parameters, same checkpoint keys) whose half-precision
    weight is also held packed for oneDNN; repacked if the weight changes in place."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: a tied weight stays tied
        self.bias = linear.bias
        self._pack()

    def _pack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self._packed_version = self.weight._version

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling() or torch.is_grad_enabled() or x.dtype != self.weight.dtype or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # training, compiling, or moved: the plain path
        if self.weight._version != self._packed_version:
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"


def pack_linears(model: nn.Module) -> int:
    """Replace every CPU ``nn.Linear`` with a bf16/fp16 weight by a :class:`PackedLinear`, in place, where
    torch's oneDNN supports that dtype here; returns how many were replaced (0 for fp32 weights)."""
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and _can_pack(m.weight)]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedLinear(linear))
    return len(targets)
