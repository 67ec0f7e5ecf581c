"""Argument types shared by the commands: checked when the command line is parsed, so a bad value
stops with ``aiayn CMD: error: argument --flag: ...`` before any work, never with a traceback."""

from __future__ import annotations

import argparse
import math

import torch

__all__ = ["finite_float", "device"]


def finite_float(text: str) -> float:
    """A float flag: ``nan``, ``inf`` and ``-inf`` are refused (they parse as floats, but mean nothing here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def device(text: str) -> str:
    """A ``--device``: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, only when this machine has it."""
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda, cuda:0 or mps, got {text!r}") from None
    if parsed.type == "cpu":
        return text
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has no usable CUDA device (torch.cuda.is_available() is False); use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}")
        return text
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine; use --device cpu")
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: unsupported device type {parsed.type!r}; use cpu, cuda or mps")
