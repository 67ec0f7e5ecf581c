"""The batches the training engine and the models consume.

Shapes: B batch, S source length, T target (or sequence) length. Masks follow
:mod:`aiayn.nn.masks`: bool, ``True`` = real token (may attend), ``False`` = padding.
Padding ids are ``PAD_ID``; MLM labels are ``IGNORE_INDEX`` (-100) where nothing is predicted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["IGNORE_INDEX", "TranslationBatch", "LMBatch", "MLMBatch", "ClassificationBatch"]

IGNORE_INDEX = -100  # the default ignore_index of torch.nn.functional.cross_entropy

_B = TypeVar("_B")


class _TensorBatch:
    """``.to(device)`` and ``.pin_memory()`` over every tensor field."""

    def to(self: _B, device: torch.device | str, non_blocking: bool = False) -> _B:
        return dataclasses.replace(
            self,  # type: ignore[type-var]
            **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in dataclasses.fields(self)},  # type: ignore[arg-type]
        )

    def pin_memory(self: _B) -> _B:
        # DataLoader(pin_memory=True) calls this on custom batch types.
        return dataclasses.replace(
            self,  # type: ignore[type-var]
            **{f.name: getattr(self, f.name).pin_memory() for f in dataclasses.fields(self)},  # type: ignore[arg-type]
        )

    @property
    def batch_size(self) -> int:
        return getattr(self, dataclasses.fields(self)[0].name).shape[0]  # type: ignore[arg-type]


def _check(name: str, t: object, dtype: torch.dtype, shape: tuple[int, ...] | None, dim: int) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.dim() != dim or (shape is not None and tuple(t.shape) != shape):
        want = shape if shape is not None else f"{dim} dims"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")


@dataclass(frozen=True)
class TranslationBatch(_TensorBatch):
    """``src (B, S)``; ``tgt_in (B, T)`` = BOS + y; ``tgt_out (B, T)`` = y + EOS; masks True = real."""

    src: Tensor  # (B, S) long
    tgt_in: Tensor  # (B, T) long
    tgt_out: Tensor  # (B, T) long
    src_mask: Tensor  # (B, S) bool
    tgt_mask: Tensor  # (B, T) bool

    def __post_init__(self) -> None:
        _check("src", self.src, torch.long, None, 2)
        _check("tgt_in", self.tgt_in, torch.long, None, 2)
        _check("tgt_out", self.tgt_out, torch.long, tuple(self.tgt_in.shape), 2)
        _check("src_mask", self.src_mask, torch.bool, tuple(self.src.shape), 2)
        _check("tgt_mask", self.tgt_mask, torch.bool, tuple(self.tgt_in.shape), 2)
        if self.src.shape[0] != self.tgt_in.shape[0]:
            raise ValueError(f"src has batch size {self.src.shape[0]} but tgt_in has {self.tgt_in.shape[0]}")

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_mask.sum())

    @property
    def n_tgt_tokens(self) -> int:
        """Real target positions, i.e. the tokens the loss is computed on."""
        return int(self.tgt_mask.sum())

    @property
    def n_tokens(self) -> int:
        return self.n_tgt_tokens


@dataclass(frozen=True)
class LMBatch(_TensorBatch):
    """``input (B, T)`` and ``target (B, T)`` = input shifted left by one; no padding."""

    input: Tensor  # (B, T) long
    target: Tensor  # (B, T) long

    def __post_init__(self) -> None:
        _check("input", self.input, torch.long, None, 2)
        _check("target", self.target, torch.long, tuple(self.input.shape), 2)

    @property
    def n_tokens(self) -> int:
        return self.target.numel()


@dataclass(frozen=True)
class MLMBatch(_TensorBatch):
    """``[CLS] text [SEP]`` padded; ``labels`` = original id where predicted, ``IGNORE_INDEX`` elsewhere."""

    input: Tensor  # (B, T) long
    labels: Tensor  # (B, T) long
    pad_mask: Tensor  # (B, T) bool
    segment_ids: Tensor  # (B, T) long

    def __post_init__(self) -> None:
        _check("input", self.input, torch.long, None, 2)
        shape = tuple(self.input.shape)
        _check("labels", self.labels, torch.long, shape, 2)
        _check("pad_mask", self.pad_mask, torch.bool, shape, 2)
        _check("segment_ids", self.segment_ids, torch.long, shape, 2)

    @property
    def n_tokens(self) -> int:
        """Predicted positions (labels != IGNORE_INDEX)."""
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def n_real_tokens(self) -> int:
        return int(self.pad_mask.sum())


@dataclass(frozen=True)
class ClassificationBatch(_TensorBatch):
    """``input (B, T)`` = [CLS] text [SEP] padded; ``labels (B,)``; ``pad_mask (B, T)`` True = real."""

    input: Tensor  # (B, T) long
    labels: Tensor  # (B,) long
    pad_mask: Tensor  # (B, T) bool

    def __post_init__(self) -> None:
        _check("input", self.input, torch.long, None, 2)
        _check("labels", self.labels, torch.long, (self.input.shape[0],), 1)
        _check("pad_mask", self.pad_mask, torch.bool, tuple(self.input.shape), 2)

    @property
    def n_tokens(self) -> int:
        return int(self.pad_mask.sum())
