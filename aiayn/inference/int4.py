"""int4 weight-only quantisation of the Linear layers, with a scale and a zero point per group of inputs.

Each weight row is cut into groups of ``group_size`` inputs; a group ``w`` is stored as 4-bit codes
``q = round((w - min) / s)`` in 0..15 with ``s = (max - min) / 15`` (asymmetric: a group's own range,
so outliers cost only their group). The value a code stands for is ``(q - 8) * s + z`` with
``z = min + 8 s``: the convention of torch's CPU kernel ``aten._weight_int4pack_mm_for_cpu``, which
dequantises in registers (fast with bf16 activations: fp32 inputs are computed in bf16, as int8 does), or, where it
builds and was timed faster for one row or a few (batch-1 decoding, a small batch), our own matrix-vector product over
the checkpoint's codes as they are (``gemv_int4.cpp``: the inputs quantised to 8 bits a group, integer sums, as llama.cpp). At
batch 1 an eighth of the fp32 bytes is read per token.

The checkpoint holds the codes two to a byte (``weight``, uint8 ``(N, K/2)``: low nibble = even input)
and ``scales``/``zeros`` fp32 ``(N, K/group_size)``, so a save and a load are bit for bit; the kernel's
own packed layout is derived from them once, at load.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference import gemv
from aiayn.inference.gemv import NativeCall
from aiayn.inference.precision import replace_linears
from aiayn.inference.quantization import PROMPT_KERNELS, avx512_graphs, compute_dtype, widens

__all__ = ["GROUP_SIZES", "KERNEL_N_MULTIPLE", "Int4Linear", "check_int4_kernel", "dequantized_int4_mm", "quantize_int4"]

log = logging.getLogger(__name__)

GROUP_SIZES = (32, 64, 128)
KERNEL_N_MULTIPLE = 16  # torch's CPU kernel packs outputs in blocks of 16: others are padded (GPT-2's 50257 words)


torch.library.define("aiayn::weight_int4_mm", "(Tensor x, Tensor packed, int group_size, Tensor scale_zeros) -> Tensor")


def _weight_int4_mm(x: Tensor, packed: Tensor, group_size: int, scale_zeros: Tensor) -> Tensor:
    """torch's CPU kernel ``_weight_int4pack_mm_for_cpu``; behind the opaque op ``weight_int4_mm`` where a compiled
    graph may not call it directly (:func:`~aiayn.inference.quantization.avx512_graphs`)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group_size, scale_zeros)


torch.library.impl("aiayn::weight_int4_mm", "CPU")(_weight_int4_mm)


@torch.library.register_fake("aiayn::weight_int4_mm")
def _(x: Tensor, packed: Tensor, group_size: int, scale_zeros: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], packed.shape[0])  # the padded outputs, as the kernel returns them


weight_int4_mm = torch.ops.aiayn.weight_int4_mm


def dequantized_int4_mm(x: Tensor, codes: Tensor, scale_least: Tensor) -> Tensor:
    """``x (M, K)`` (bf16 or fp16) times the weight the 4-bit ``codes (N, K/2)`` stand for, each widened to ``x``'s dtype
    as ``q * s + lo`` with its group's scale and least value (``scale_least (N, 2, G)``), by one oneDNN matmul. Why:
    for a long prompt, where bf16 matmuls are native, torch's int4 kernel took twice this at 512 rows of GPT-2's shapes,
    but less at 64 (a Zen 4 EPYC, 2026-12-07): timed per shape (``Int4Linear.prompt``). The C++ decoding step
    computes the same ops (``decode_step.cpp``), so the same bits."""
    n, groups, k = codes.shape[0], scale_least.shape[2], 2 * codes.shape[1]
    scale = scale_least.to(x.dtype)
    w = torch.stack([codes & 15, codes >> 4], dim=-1).view(n, groups, k // groups).to(x.dtype)
    w = w.mul_(scale[:, 0].unsqueeze(-1)).add_(scale[:, 1].unsqueeze(-1)).view(n, k)
    return torch.mm(x, w.t())


def check_int4_kernel(device: torch.device | str = "cpu") -> None:
    """Raise ``RuntimeError`` naming ``quantize`` unless this torch build runs the int4 CPU kernel on ``device``."""
    reason = ""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") or torch.device(device).type != "cpu":
        reason = f"torch {torch.__version__} has no aten._weight_int4pack_mm_for_cpu for device {str(device)!r}"
    else:
        try:
            layer = Int4Linear.from_linear(nn.Linear(32, 10, bias=False), 32)
            layer(torch.ones(1, 32))
        except (RuntimeError, NotImplementedError) as e:
            reason = str(e).splitlines()[0]
    if reason:
        raise RuntimeError(f"quantize='int4' needs torch's int4 CPU kernel, which cannot run here ({reason}); "
                           "accepted instead: quantize='int8', or 'none'")


class Int4Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` as 4-bit codes in groups of ``group_size`` inputs (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, group_size: int, *, bias: bool, device: torch.device | None = None) -> None:
        super().__init__()
        if group_size not in GROUP_SIZES or in_features % group_size:
            raise ValueError(f"Int4Linear: group_size must be one of {GROUP_SIZES} and divide in_features={in_features}, got {group_size}")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        groups = in_features // group_size
        self.weight: Tensor
        self.scales: Tensor
        self.zeros: Tensor
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.ones(out_features, groups, device=device))
        self.register_buffer("zeros", torch.zeros(out_features, groups, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False) if bias else None
        # The kernel's own layout, derived from the buffers above (never saved): repacked in eager calls when
        # they change; a compiled graph reads them as they are (pack with an eager call or a load first).
        self.packed: Tensor
        self.scale_zeros: Tensor
        self.register_buffer("packed", torch.zeros(0, dtype=torch.uint8, device=device), persistent=False)
        self.register_buffer("scale_zeros", torch.zeros(0, device=device), persistent=False)
        # Our kernel's scales and least values (z - 8 s: a weight is q s + lo), bf16 (N, 2, G), derived with the above.
        self.scale_least: Tensor
        self.register_buffer("scale_least", torch.zeros(0, dtype=torch.bfloat16, device=device), persistent=False)
        # The kernel of one-row calls and of calls of a few rows (up to gemv.FEW_ROWS): "torch" or "native" /
        # "native-prefetch" (ours), set by the timed kernel choice (aiayn.inference.precision.choose_quantized_kernels);
        # more rows (a prompt): one of quantization.PROMPT_KERNELS (dequantized_int4_mm above its rows), timed too.
        self.one = self.many = self.prompt = "torch"
        self._packed_key: tuple = ()
        self._packed_from: Tensor | None = None  # the codes the layout was derived from (see _key)
        self._in_graph = False  # whether a compiled graph calls the kernel directly (set by repack)
        self.register_load_state_dict_post_hook(lambda module, keys: module.repack())

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4Linear:
        """Quantise ``linear``'s weight group by group (computed in fp32)."""
        w = linear.weight.detach().float()
        n, k = w.shape
        groups = w.reshape(n, k // group_size, group_size)  # (N, G, g)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, G)
        scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8).reshape(n, k)
        module = cls(k, n, group_size, bias=linear.bias is not None, device=w.device)
        module.weight.copy_(codes[:, 0::2] | (codes[:, 1::2] << 4))
        module.scales.copy_(scales)
        module.zeros.copy_(low + 8 * scales)
        if linear.bias is not None and module.bias is not None:
            module.bias.data = linear.bias.detach().clone()
        module.repack()
        return module

    def codes(self) -> Tensor:
        """The 4-bit codes ``(N, K)`` in 0..15."""
        return torch.stack([self.weight & 15, self.weight >> 4], dim=-1).reshape(self.out_features, self.in_features)

    def dequantized(self) -> Tensor:
        """The fp32 weight ``(N, K)`` this layer computes with (for tests and error measurements)."""
        g = self.group_size
        codes = self.codes().float().reshape(self.out_features, -1, g)
        return ((codes - 8) * self.scales[..., None] + self.zeros[..., None]).reshape(self.out_features, self.in_features)

    def _key(self, dtype: torch.dtype) -> tuple:
        """What the kernel's layout was derived from: the dtype, the codes' buffer (the object, held in ``_packed_from``,
        so that its id is not reused: its memory may move, as to huge pages) and the versions of the buffers."""
        return (dtype, id(self.weight), self.weight._version, self.scales._version, self.zeros._version)

    @torch.no_grad()
    def repack(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """Derive the kernel's packed weight and ``(G, N', 2)`` scales-and-zeros (in ``dtype``) from the buffers."""
        pad = -self.out_features % KERNEL_N_MULTIPLE  # rows of code 8, scale 0, zero 0: outputs of 0, sliced off
        codes = F.pad(self.codes().to(torch.int32), (0, 0, 0, pad), value=8)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        scale_zeros = F.pad(torch.stack([self.scales, self.zeros], dim=-1), (0, 0, 0, 0, 0, pad))  # (N', G, 2)
        self.scale_zeros = scale_zeros.transpose(0, 1).contiguous().to(dtype)
        self.scale_least = torch.stack([self.scales, self.zeros - 8 * self.scales], dim=1).to(torch.bfloat16)
        self._packed_key = self._key(dtype)
        self._packed_from = self.weight
        self._in_graph = avx512_graphs()  # read here, eagerly: Dynamo cannot trace Inductor's ISA check

    def ready(self, dtype: torch.dtype) -> None:
        """Repack for ``dtype`` unless the kernel's layout is already derived from the buffers as they are."""
        if self._key(dtype) != self._packed_key:
            self.repack(dtype)

    def native_call(self, one_row: bool, dtype: torch.dtype) -> NativeCall:
        """How :meth:`forward` computes a call (of one row or several alike) with ``dtype`` activations, for the C++ decoding
        step: ours where it was timed faster (``few``: up to :data:`~aiayn.inference.gemv.FEW_ROWS` rows), else torch's
        kernel over the layout derived for the compute dtype."""
        self.ready(compute_dtype(dtype))
        torchs = NativeCall("int4", self.group_size, self.packed, self.scale_zeros)
        if PROMPT_KERNELS[self.prompt]:  # a prompt's rows through the widened codes, fewer through torch's kernel
            torchs = NativeCall("int4-widened", PROMPT_KERNELS[self.prompt], self.weight, self.scale_least, torchs)
        kernel = self.one if one_row else self.many
        if kernel in gemv.KERNELS and dtype in gemv.DTYPES:
            call = NativeCall("gemv", gemv.KERNELS[kernel], self.weight, self.scale_least)
            return call if one_row else NativeCall("few", gemv.KERNELS[kernel], self.weight, self.scale_least, torchs)
        return torchs

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., K) -> (..., N)`` in ``x``'s dtype; one row or a few through our kernel where it was timed faster;
        otherwise fp32 inputs are computed with bf16 activations (torch's kernel's fp32 path is a scalar loop: 28.9 ms
        against 0.105 ms for one row through 768 -> 3072 here)."""
        kernel = gemv.quantized_kernel(x, self.in_features, self.one, self.many)
        if kernel in gemv.KERNELS and x.dtype in gemv.DTYPES and gemv.may_run():
            if not torch.compiler.is_compiling():
                self.ready(compute_dtype(x.dtype))
            return gemv.gemv_int4(x, self.weight, self.scale_least, self.bias, gemv.KERNELS[kernel])
        compute = compute_dtype(x.dtype)
        flat = x.reshape(-1, self.in_features).to(compute)
        if not torch.compiler.is_compiling():
            self.ready(compute)
        scale_zeros = self.scale_zeros if self.scale_zeros.dtype == compute else self.scale_zeros.to(compute)
        if widens(self.prompt, flat):  # a prompt's rows
            out = dequantized_int4_mm(flat, self.weight, self.scale_least)
        elif torch.compiler.is_compiling() and not self._in_graph:
            out = weight_int4_mm(flat, self.packed, self.group_size, scale_zeros)
        else:
            out = _weight_int4_mm(flat, self.packed, self.group_size, scale_zeros)
        if out.shape[-1] != self.out_features:
            out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias  # in the bias's dtype (the model's): bf16 + fp32 is computed in fp32, no cast of the bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int4 group {self.group_size}"


def quantize_int4(model: nn.Module, group_size: int = 32) -> nn.Module:
    """Replace every ``nn.Linear`` whose inputs divide into groups of ``group_size`` by an :class:`Int4Linear`,
    in place; the others stay in floating point (a warning names them). Returns ``model``.

    Raises ``ValueError`` for a group size not in :data:`GROUP_SIZES` or a model with no layer to quantise,
    and ``RuntimeError`` when this torch build lacks the kernel.
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(f"quantize='int4': group size must be one of {GROUP_SIZES}, got {group_size!r}")
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    targets = [(name, m) for name, m in linears if m.in_features % group_size == 0]
    if not targets:
        raise ValueError(f"quantize='int4': {type(model).__name__} has no nn.Linear layer whose in_features divide into "
                         f"groups of {group_size} (accepted: a smaller group, quantize='int8', or 'none')")
    check_int4_kernel(targets[0][1].weight.device)
    kept = sorted({m.in_features for _, m in linears if m.in_features % group_size})
    if kept:
        log.warning("int4: layers with in_features %s stay in floating point (not multiples of the group size %d)", kept, group_size)
    return replace_linears(model, targets, lambda name, linear: Int4Linear.from_linear(linear, group_size))
