"""Normalisation layers: LayerNorm (Ba et al., 2016; the paper) and RMSNorm (Zhang & Sennrich, 2019)."""

from __future__ import annotations

from torch import nn

__all__ = ["build_norm", "NORMS"]

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
