"""int8 weight-only quantisation of every Linear layer, with one scale per output channel.

Each weight row ``W[n, :]`` is stored as ``round(W[n, :] / s[n])`` in int8 with
``s[n] = max|W[n, :]| / 127`` (symmetric, so zero stays exactly zero). At batch 1 decoding reads
every weight once per token, so a quarter of the fp32 bytes is up to four times fewer bytes per
token. The matmul is torch's own CPU kernel ``torch.ops.aten._weight_int8pack_mm`` (it
dequantises in registers); it runs fast with bf16/fp16 activations only, so an fp32 model's int8
layers compute in bf16 and hand back fp32. Embedding tables stay in floating point (a lookup reads
one row per token), so a tied output projection is quantised on its own copy.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference import gemv
from aiayn.inference.precision import replace_linears

__all__ = ["PROMPT_KERNELS", "QUANTIZATIONS", "Int8Linear", "check_int8_kernel", "dequantized_mm", "parse_quantize", "quantize",
           "quantize_int8", "quantization_record", "widens"]

log = logging.getLogger(__name__)

# int8-dynamic: int8 activations too (aiayn.inference.int8_dynamic); int4 groups 32 inputs a scale; int4-g64 and
# int4-g128 store fewer scales (aiayn.inference.int4)
QUANTIZATIONS: tuple[str, ...] = ("none", "int8", "int8-dynamic", "int4", "int4-g64", "int4-g128")
_KERNEL_K_MULTIPLE = 16  # the CPU kernel reads K in blocks of 16 (other K give wrong results or crash)
# A weight-only int8 or int4 layer's kernel of a prompt's rows -> the rows above which it widens its weight to the
# activations' dtype for one matmul (0: never, torch's kernel), as timed (aiayn.inference.kernel_choice.choose_prompt_kernels):
# faster at 64 rows, above gemv.FEW_ROWS; faster at 128 rows but not 64, above 96; at 256 only, above 192
PROMPT_KERNELS = {"torch": 0, "dequant": gemv.FEW_ROWS, "dequant-mid": 96, "dequant-long": 192}


def widens(prompt: str, flat: Tensor) -> bool:
    """Whether a weight-only layer of prompt kernel ``prompt`` widens its weight for the activations ``flat (M, K)``:
    more rows than its threshold (each gemv.FEW_ROWS or more, so never a call of one row or a few), in bf16
    (the dtype it was timed in; fp16's matmuls on the CPU are another matter), eagerly (a compiled graph calls torch's)."""
    return 0 < PROMPT_KERNELS[prompt] < flat.shape[0] and flat.dtype == torch.bfloat16 and not torch.compiler.is_compiling()


@functools.cache
def avx512_graphs() -> bool:
    """Whether Inductor writes AVX-512 code here (the CPU and ``ATEN_CPU_CAPABILITY`` decide), where compiled decode
    steps were checked with their weights frozen and torch's int4 kernel called in the graph directly. Under its AVX2
    code (``ATEN_CPU_CAPABILITY=avx2`` on a Zen 5 EPYC, 2026-12-04) a step calling the int4 kernel directly gave NaN
    logits from its second token, and a frozen step over weight-only int8 layers gave other tokens than the eager step
    (one thread; the layer alone and the whole forward compiled were right): there int4 goes through an opaque op and
    such a step is not frozen (:func:`aiayn.decoding.adapters.compiled_step`)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return pick_vec_isa().bit_width() >= 512


# Opaque ops defined with torch.library.define/impl rather than @custom_op: a call costs ~7 us, not ~25 us, and a
# compiled GPT-2 step makes 49 of them.
torch.library.define("aiayn::weight_int8_mm", "(Tensor x, Tensor weight, Tensor scale) -> Tensor")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The activations' dtype of torch's weight-only int8 and int4 kernels for inputs of ``dtype``: half precision as it
    is, anything else in bf16 (their fp32 paths are slow or absent)."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def _weight_int8_mm(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """torch's CPU kernel ``_weight_int8pack_mm`` behind an opaque op: ``torch.compile`` calls it as it
    is (and Inductor's own lowering failed in torch 2.13 on a CPU without AMX, with
    "LoweringException: AssertionError: Pointwise", when its input came from a fused cast)."""
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), weight, scale)


torch.library.impl("aiayn::weight_int8_mm", "CPU")(_weight_int8_mm)  # registers it (the decorator returns None)


@torch.library.register_fake("aiayn::weight_int8_mm")
def _(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


weight_int8_mm = torch.ops.aiayn.weight_int8_mm


def dequantized_mm(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """``x (M, K)`` (bf16 or fp16) times an int8 ``weight (N, K)`` widened to ``x``'s dtype (exactly: ``|w| <= 127``),
    each output column times ``scale (N,)`` (``x``'s dtype): ``_weight_int8pack_mm``'s product as one oneDNN matmul.
    Why: for a prompt's rows, where bf16 matmuls are native (AVX512-BF16, AMX), that kernel takes 2-2.6x this one's time
    at GPT-2's shapes (64 and 512 rows, a Zen 4 EPYC, 2026-12-07); the widened weight (2 bytes a weight) lives for the
    call. The C++ decoding step computes the same ops (``decode_step.cpp``), so the same bits."""
    return torch.mm(x, weight.to(x.dtype).t()).mul_(scale)


def parse_quantize(value: str | None, *, name: str = "quantize") -> str | None:
    """``"int8"`` / ``"int4"`` / ``"int4-g64"`` / ``"int4-g128"`` as given; ``None`` or ``"none"`` -> ``None``.
    Raises ``ValueError`` naming the choices."""
    if value is None or value == "none":
        return None
    if value in QUANTIZATIONS:
        return value
    raise ValueError(f"{name} must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")


def _int4_group(method: str) -> int:
    return int(method.removeprefix("int4").removeprefix("-g") or 32)


def quantize(model: nn.Module, method: str) -> nn.Module:
    """Quantise ``model``'s Linear layers in place by ``method`` (one of :data:`QUANTIZATIONS` but ``none``)."""
    if method in ("int8", "int8-dynamic"):
        return quantize_int8(model, dynamic=method == "int8-dynamic")
    from aiayn.inference.int4 import quantize_int4

    return quantize_int4(model, _int4_group(parse_quantize(method) or "int4"))


def quantization_record(model: nn.Module) -> dict | None:
    """What a saved model directory records of its quantisation (``quantization.json``), or ``None`` for none."""
    from aiayn.inference.int4 import Int4Linear

    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if int4:
        return {"method": "int4" if int4[0].group_size == 32 else f"int4-g{int4[0].group_size}",
                "scheme": f"weight-only, asymmetric, an fp32 scale and zero point per group of {int4[0].group_size} inputs"}
    from aiayn.inference.int8_dynamic import Int8DynamicLinear

    if any(isinstance(m, Int8DynamicLinear) for m in model.modules()):
        return {"method": "int8-dynamic", "scheme": "symmetric int8 weights, one fp32 scale per output channel; activations "
                "quantised to 8 bits at each call (FBGEMM's dynamic quantisation)"}
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        return {"method": "int8", "scheme": "weight-only, symmetric, one fp32 scale per output channel"}
    return None


def check_int8_kernel(device: torch.device | str = "cpu") -> None:
    """Raise ``RuntimeError`` unless this torch build runs ``_weight_int8pack_mm`` on ``device``."""
    op = _kernel()
    reason = "" if op is not None else "the operator does not exist in this build"
    if op is not None:
        try:
            x = torch.ones(1, _KERNEL_K_MULTIPLE, dtype=torch.bfloat16, device=device)
            w = torch.ones(1, _KERNEL_K_MULTIPLE, dtype=torch.int8, device=device)
            op(x, w, torch.ones(1, dtype=torch.bfloat16, device=device))
        except (RuntimeError, NotImplementedError) as e:
            reason = str(e).splitlines()[0]
    if reason:
        raise RuntimeError(
            f"quantize='int8' needs torch.ops.aten._weight_int8pack_mm on device {str(device)!r}, which torch "
            f"{torch.__version__} cannot run here ({reason}); accepted: quantize one of {', '.join(QUANTIZATIONS)} "
            "on a build that has the kernel, or 'none'"
        )


def _kernel() -> Callable[..., Tensor] | None:
    """torch's int8 weight-only matmul, or ``None`` when this build lacks it."""
    return getattr(torch.ops.aten, "_weight_int8pack_mm", None)


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as int8 ``(N, K)`` times fp32 per-row ``scale (N,)``."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, device: torch.device | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight: Tensor
        self.scale: Tensor
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False) if bias else None
        # The scales in the dtype the kernel computes in, derived from `scale` (never saved), so that no call
        # casts them: re-derived in eager calls when `scale` changes; a compiled graph reads it as it is.
        self.kernel_scale: Tensor
        self.register_buffer("kernel_scale", torch.ones(out_features, dtype=torch.bfloat16, device=device), persistent=False)
        self._kernel_key: tuple = ()
        # The kernel of one-row calls (batch-1 decoding) and of calls of a few rows (up to gemv.FEW_ROWS: a small
        # batch, speculative checks): "torch" (_weight_int8pack_mm, bf16 activations) or "native" / "native-prefetch"
        # (our matrix-vector product over the int8 rows, fp32 sums: aiayn.inference.gemv), set by the timed kernel
        # choice (aiayn.inference.precision.choose_quantized_kernels). More rows (a prompt): one of PROMPT_KERNELS
        # (dequantized_mm above its rows) where that was timed faster (aiayn.inference.kernel_choice.choose_prompt_kernels).
        self.one = self.many = self.prompt = "torch"
        self.register_load_state_dict_post_hook(lambda module, keys: module.repack())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantise ``linear``'s weight row by row (from its own precision, computed in fp32)."""
        weight = linear.weight.detach().float()  # (N, K)
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0  # (N,)
        q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device=weight.device)
        module.weight.copy_(q)
        module.scale.copy_(scale)
        if linear.bias is not None and module.bias is not None:
            module.bias.data = linear.bias.detach().clone()
        module.repack()
        return module

    def _key(self, dtype: torch.dtype) -> tuple:
        return (dtype, self.scale.data_ptr(), self.scale._version)

    @torch.no_grad()
    def repack(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """Derive :attr:`kernel_scale`, the scales in ``dtype``, from ``scale`` (after a load, a fusion or a change)."""
        self.kernel_scale = self.scale.to(dtype)
        self._kernel_key = self._key(dtype)

    def ready(self, dtype: torch.dtype) -> None:
        """Repack for ``dtype`` unless :attr:`kernel_scale` is already derived from ``scale`` as it is."""
        if self._key(dtype) != self._kernel_key:
            self.repack(dtype)

    def native_call(self, one_row: bool, dtype: torch.dtype) -> gemv.NativeCall | None:
        """How :meth:`forward` computes a call of one row (``one_row``) or several with ``dtype`` activations, for the C++
        decoding step (``few``: our kernel up to :data:`~aiayn.inference.gemv.FEW_ROWS` rows, torch's for more);
        ``None`` where it dequantises per call (``in_features`` not a multiple of the kernel's)."""
        if one_row and self.one in gemv.KERNELS and dtype in gemv.DTYPES:
            return gemv.NativeCall("gemv", gemv.KERNELS[self.one], self.weight, self.scale)
        if self.in_features % _KERNEL_K_MULTIPLE:
            return None
        self.ready(compute_dtype(dtype))
        # param: the rows above which the step takes dequantized_mm (a prompt, as forward takes it), 0 for never
        torchs = gemv.NativeCall("int8", PROMPT_KERNELS[self.prompt], self.weight, self.kernel_scale)
        if not one_row and self.many in gemv.KERNELS and dtype in gemv.DTYPES:
            return gemv.NativeCall("few", gemv.KERNELS[self.many], self.weight, self.scale, torchs)
        return torchs

    def dequantized(self) -> Tensor:
        """The fp32 weight ``(N, K)`` this layer computes with (for tests and error measurements)."""
        return self.weight.float() * self.scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., K) -> (..., N)`` in ``x``'s dtype; fp32 inputs are computed with bf16 activations (but one row through
        the native kernel, or a few where it was timed faster: fp32), and the bias is added in its own dtype (the model's) as the output widens back to it
        (one op, no cast of the bias)."""
        kernel = gemv.quantized_kernel(x, self.in_features, self.one, self.many)
        if kernel in gemv.KERNELS and x.dtype in gemv.DTYPES and gemv.may_run():
            return gemv.gemv_int8(x, self.weight, self.scale, self.bias, gemv.KERNELS[kernel])
        compute = compute_dtype(x.dtype)
        flat = x.reshape(-1, self.in_features).to(compute)  # (M, K): the kernel takes 2-D inputs
        if not torch.compiler.is_compiling():
            self.ready(compute)
        scale = self.kernel_scale if self.kernel_scale.dtype == compute else self.kernel_scale.to(compute)
        if widens(self.prompt, flat):  # a prompt's rows
            out = dequantized_mm(flat, self.weight, scale)
        elif self.in_features % _KERNEL_K_MULTIPLE == 0:
            if torch.compiler.is_compiling():
                out = weight_int8_mm(flat, self.weight, scale)
            else:  # eager: the op's body without the dispatcher (a few us a call, 73 calls a GPT-2 step)
                out = _weight_int8_mm(flat, self.weight, scale)
        else:  # correct but slow: dequantise per call (the kernel requires K % 16 == 0)
            out = F.linear(flat, self.weight.to(compute) * scale[:, None])
        if self.bias is not None:
            out = out + self.bias  # bf16 + fp32 is computed in fp32: the add widens the output
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def quantize_int8(model: nn.Module, *, dynamic: bool = False) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by an :class:`Int8Linear` (``dynamic``: an
    :class:`~aiayn.inference.int8_dynamic.Int8DynamicLinear`, int8 activations too), in place; returns ``model``.

    Raises ``ValueError`` when the model has no Linear layer (nothing to quantise) and
    ``RuntimeError`` when this torch build lacks the kernel.
    """
    method = "int8-dynamic" if dynamic else "int8"
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not targets:
        raise ValueError(
            f"quantize={method!r}: {type(model).__name__} has no nn.Linear layer to quantise "
            f"(accepted: a model with Linear layers, or quantize one of {', '.join(QUANTIZATIONS)} = 'none')"
        )
    if dynamic:
        from aiayn.inference.int8_dynamic import Int8DynamicLinear, check_int8_dynamic_kernel

        check_int8_dynamic_kernel(targets[0][1].weight.device)
        return replace_linears(model, targets, lambda name, linear: Int8DynamicLinear.from_linear(linear))
    check_int8_kernel(targets[0][1].weight.device)
    slow = sorted({m.in_features for _, m in targets if m.in_features % _KERNEL_K_MULTIPLE})
    if slow:
        log.warning("int8: in_features %s are not multiples of %d: those layers dequantise per call (slow)", slow, _KERNEL_K_MULTIPLE)
    return replace_linears(model, targets, lambda name, linear: Int8Linear.from_linear(linear))
