"""Normalisation layers: LayerNorm (Ba et al., 2016; the paper) and RMSNorm (Zhang & Sennrich, 2019).

Models are built with torch's modules. At load for inference, :func:`use_native_norms` gives them our kernel's
forward (:class:`NativeLayerNorm`, :class:`NativeRMSNorm`: the same parameters and keys) where it was timed faster
here; the C++ decoding step calls the same kernel for them, so its logits stay the eager ones bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.inference import gemv, kernel_choice

__all__ = ["build_norm", "NORMS", "NativeLayerNorm", "NativeRMSNorm", "kernel_eps", "takes_kernel", "use_native_norms"]

NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")


def build_norm(kind: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``layernorm``: ``(x - mean) / sqrt(var + eps) * gain + bias``; ``rmsnorm``: ``x / sqrt(mean(x^2) + eps) * gain``.

    Both are torch's own fused modules; ``bias=False`` drops LayerNorm's additive term (nanoGPT's option).
    """
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")


def takes_kernel(norm: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``norm``'s forward computes inputs of ``dtype`` by our kernel when it runs eagerly, with no gradient wanted,
    in a process that loaded the library (:func:`_native`): a Native norm over one dimension, fp32 or bf16 inputs of
    its weight's dtype. The C++ decoding step asks the same (aiayn.decoding.native_step)."""
    weight = getattr(norm, "weight", None)
    return (isinstance(norm, (NativeLayerNorm, NativeRMSNorm)) and len(norm.normalized_shape) == 1
            and dtype in gemv.DTYPES and (weight is None or weight.dtype == dtype))


def kernel_eps(norm: nn.LayerNorm | nn.RMSNorm, dtype: torch.dtype) -> float:
    """The eps ``norm`` adds for inputs of ``dtype``: RMSNorm's default (``None``) is the dtype's machine epsilon, as torch
    takes it."""
    return torch.finfo(dtype).eps if norm.eps is None else norm.eps


def _native(norm: nn.LayerNorm | nn.RMSNorm, x: Tensor) -> bool:
    """Whether this call takes our kernel: :func:`takes_kernel` for ``x``'s dtype, eagerly, with no gradient wanted (the
    kernel has none: training keeps torch's), in a process that loaded the library (a model unpickled elsewhere keeps
    torch's until something loads it; the C++ step needs it loaded)."""
    return (x.device.type == "cpu" and takes_kernel(norm, x.dtype)
            and not (torch.is_grad_enabled() and (x.requires_grad or (norm.weight is not None and norm.weight.requires_grad)))
            and not torch.compiler.is_compiling() and gemv.loaded())


class NativeLayerNorm(nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` computed by ``aiayn_native::norm`` where :func:`_native` allows, else by torch."""

    def forward(self, x: Tensor) -> Tensor:
        if not _native(self, x):
            return super().forward(x)
        return gemv.norm(x, self.weight, self.bias, self.eps, False)


class NativeRMSNorm(nn.RMSNorm):
    """:class:`torch.nn.RMSNorm` computed by ``aiayn_native::norm`` where :func:`_native` allows, else by torch."""

    def forward(self, x: Tensor) -> Tensor:
        if not _native(self, x):
            return super().forward(x)
        return gemv.norm(x, self.weight, None, kernel_eps(self, x.dtype), True)


_NATIVE = {nn.LayerNorm: NativeLayerNorm, nn.RMSNorm: NativeRMSNorm}


def use_native_norms(model: nn.Module) -> int:
    """Give ``model``'s LayerNorm and RMSNorm modules over one dimension our kernel's forward, in place (their class
    changes, their parameters and keys stay), where :func:`~aiayn.inference.kernel_choice.choose_norm` timed it faster
    here for their dtype (``$AIAYN_NORM_KERNEL``: ``measure``, ``torch`` or ``native``); returns how many changed. The
    CPU only."""
    changed = 0
    for module in model.modules():
        native = _NATIVE.get(type(module))
        if native is None or len(module.normalized_shape) != 1:  # type: ignore[arg-type]
            continue
        weight = getattr(module, "weight", None)
        dtype = weight.dtype if weight is not None else torch.float32
        if (weight is not None and weight.device.type != "cpu") or dtype not in gemv.DTYPES:
            continue
        if kernel_choice.choose_norm(dtype) == "native":
            module.__class__ = native
            changed += 1
    return changed
