"""int8 weights and int8 activations (``quantize="int8-dynamic"``): torch's dynamic quantisation of Linear layers.

The weights are :mod:`aiayn.inference.quantization`'s int8 grid (one scale per output row, symmetric), stored and
saved the same way. At each call the input is quantised to 8 bits too (uint8 over the call's own min..max: one
range per call, so per token when one token is decoded; a prompt's or a batch's rows share one, so a row's result
depends on the rows computed with it, as with torch's dynamic quantisation, and speculative decoding, which checks
several tokens in one call, refuses it), the product is summed in int32, and the two scales
bring it back to fp32. The matmul is FBGEMM's (``quantized::linear_dynamic``, the kernel behind
``torch.ao.quantization.quantize_dynamic``). It is llama.cpp's Q8_0 scheme in kind (Q8_0 quantises the activations
to 8 bits too, per block of 32): integer dot products read a quarter of fp32's bytes without widening each weight
to bf16 first, which is what ``_weight_int8pack_mm`` (the weight-only kernel) spends its time on for one row.
Activations lose precision that weight-only int8 keeps: its quality is measured apart (``docs/results.md``).

FBGEMM keeps its own packed copy of each weight (the int8 ``weight`` buffer stays, for checkpoints): twice the
int8 bytes in memory. ``torch.compile`` cannot hold FBGEMM's packed object, so a compiled graph calls it through
the opaque op ``aiayn::int8_dynamic_linear``.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import Tensor

from aiayn.inference.quantization import Int8Linear

__all__ = ["Int8DynamicLinear", "check_int8_dynamic_kernel"]

_ENGINE = "fbgemm"

# Layers by id, so that the opaque op finds the packed weight of the layer that called it.
_LAYERS: weakref.WeakValueDictionary[int, Int8DynamicLinear] = weakref.WeakValueDictionary()

torch.library.define("aiayn::int8_dynamic_linear", "(Tensor x, Tensor weight, int key) -> Tensor")


def _int8_dynamic_linear(x: Tensor, weight: Tensor, key: int) -> Tensor:
    """FBGEMM's dynamic int8 matmul over the packed weight of the layer registered as ``key``, as last packed (an
    eager call or :meth:`Int8DynamicLinear.refresh`, which the compiled decode step calls before it compiles): a
    compiled graph makes 49 of these calls a GPT-2 token, so it checks nothing else."""
    layer = _LAYERS.get(key)
    if layer is None or layer._packed is None:
        raise RuntimeError("aiayn::int8_dynamic_linear: the layer this graph was compiled for is gone or was never packed")
    return torch.ops.quantized.linear_dynamic(x, layer._packed, False)


torch.library.impl("aiayn::int8_dynamic_linear", "CPU")(_int8_dynamic_linear)


@torch.library.register_fake("aiayn::int8_dynamic_linear")
def _(x: Tensor, weight: Tensor, key: int) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)


def check_int8_dynamic_kernel(device: torch.device | str = "cpu") -> None:
    """Raise ``RuntimeError`` naming ``quantize`` unless FBGEMM's dynamic int8 matmul runs here on ``device``."""
    reason = ""
    if torch.device(device).type != "cpu":
        reason = f"it runs on the CPU only, not on device {str(device)!r}"
    elif _ENGINE not in torch.backends.quantized.supported_engines:
        reason = f"this torch {torch.__version__} build has no {_ENGINE} engine (it has {torch.backends.quantized.supported_engines})"
    else:
        try:
            Int8DynamicLinear.from_linear(torch.nn.Linear(16, 4))(torch.ones(1, 16))
        except (RuntimeError, NotImplementedError) as e:
            reason = str(e).splitlines()[0]
    if reason:
        raise RuntimeError(f"quantize='int8-dynamic' needs FBGEMM's dynamic int8 matmul (quantized::linear_dynamic), "
                           f"which cannot run here ({reason}); accepted instead: quantize='int8' (weight-only), or 'none'")


class Int8DynamicLinear(Int8Linear):
    """:class:`~aiayn.inference.quantization.Int8Linear`'s weights and checkpoint keys, computed with int8
    activations quantised per call (see the module docstring); inputs and outputs in the model's dtype."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._packed: object | None = None  # FBGEMM's packed weight and fp32 bias, derived from the buffers
        self._packed_for: tuple = ()
        _LAYERS[id(self)] = self  # the key a compiled graph calls the opaque op with

    def __getstate__(self) -> dict:
        """Copies and pickles leave FBGEMM's packed object out; it is packed again at the next call."""
        state = super().__getstate__()
        state["_packed"], state["_packed_for"] = None, ()
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        _LAYERS[id(self)] = self

    def _source(self) -> tuple:
        """What the packed weight was derived from (read from the module's dicts: a call makes this check)."""
        weight, scale, bias = self._buffers["weight"], self._buffers["scale"], self._parameters.get("bias")
        assert weight is not None and scale is not None
        return (weight.data_ptr(), weight._version, scale._version, None if bias is None else (bias.data_ptr(), bias._version, bias.dtype))

    def refresh(self) -> None:
        """Pack again if the weights changed (storage, version) since they were packed, or were never packed."""
        if self._packed is None or self._source() != self._packed_for:
            self.repack()

    @torch.no_grad()
    def repack(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """Pack the int8 weight, its scales and the bias (fp32) for FBGEMM (after a load, a fusion or a change)."""
        if self.weight.numel() == 0 or self.weight.device.type != "cpu":
            return
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch 2.13 warns that quantised tensors are deprecated; FBGEMM's prepack takes one
            warnings.simplefilter("ignore")
            weight = torch._make_per_channel_quantized_tensor(self.weight, self.scale.double(), zero_points, 0)
        bias = None if self.bias is None else self.bias.detach().float()
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = _ENGINE
            self._packed = torch.ops.quantized.linear_prepack(weight, bias)
        finally:
            torch.backends.quantized.engine = previous
        self._packed_for = self._source()

    def dynamic_forward(self, flat: Tensor) -> Tensor:
        """``(M, K)`` fp32 -> ``(M, N)`` fp32 through FBGEMM, repacked first if the weights changed since."""
        self.refresh()
        return torch.ops.quantized.linear_dynamic(flat, self._packed, False)

    def native_call(self, one_row: bool, dtype: torch.dtype) -> None:
        """None: its activations are quantised too, which the C++ decoding step has no kernel for (it keeps the forward)."""
        return None

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., K) -> (..., N)`` in ``x``'s dtype (FBGEMM computes from and to fp32)."""
        flat = x.reshape(-1, self.in_features).float()
        if torch.compiler.is_compiling():
            out = torch.ops.aiayn.int8_dynamic_linear(flat, self.weight, id(self))
        else:
            out = self.dynamic_forward(flat)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8 weights and activations"
