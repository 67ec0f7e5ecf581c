"""Inference-time transforms of a trained model: real half-precision weights and int8 weight-only
quantisation, applied once at load (see :func:`aiayn.pretrained.load_pretrained`)."""

from aiayn.inference.precision import (
    DTYPES,
    PackedLinear,
    cast_model,
    pack_linears,
    parse_dtype,
)
from aiayn.inference.quantization import (
    QUANTIZATIONS,
    Int8Linear,
    check_int8_kernel,
    quantize_int8,
)

__all__ = [
    "DTYPES",
    "QUANTIZATIONS",
    "Int8Linear",
    "PackedLinear",
    "cast_model",
    "check_int8_kernel",
    "pack_linears",
    "parse_dtype",
    "quantize_int8",
]
