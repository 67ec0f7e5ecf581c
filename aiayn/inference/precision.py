"""Real half-precision weights: the model is cast once at load, so no step re-casts a weight.

``torch.autocast`` casts every weight at every call; at batch 1 decoding reads each weight once
per token, so a cast per call costs as much as the matmul it feeds. Casting the parameters once
halves the bytes read per token instead. On the CPU a half-precision ``F.linear`` of one row
re-lays its weight out at every call (oneDNN), which costs more than the fp32 matmul; so
:func:`pack_linears` keeps each weight also in oneDNN's blocked layout, packed once (the layout
``torch.compile``'s freezing uses). fp32 weights may be packed too: for a few rows oneDNN's kernel is
up to 2-3x faster than MKL's sgemm on some CPUs and slower on others, so each shape takes the kernel timed
faster on this machine (:mod:`aiayn.inference.kernel_choice`). Softmax (:mod:`aiayn.nn.attention`), LayerNorm/RMSNorm
(torch's kernels) and the logits consumers (sampling, beam search, perplexity) accumulate in fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference import gemv
from aiayn.inference.split_linear import split_linear, split_parts
from aiayn.nn.cache import KV_AUTO

__all__ = ["DTYPES", "DTYPE_ALIASES", "DTYPE_CHOICES", "PackedLinear", "cast_model", "dtype_name", "native_bf16",
           "pack_linears", "parse_dtype"]

# The one precision vocabulary: torch's names, and the short ones (training's habit) as aliases.
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_CHOICES: tuple[str, ...] = (*DTYPES, *DTYPE_ALIASES)  # what every --dtype flag and config accepts


def dtype_name(value: str | torch.dtype, *, name: str = "dtype") -> str:
    """The one spelling of a precision: ``"bf16"``, ``"bfloat16"`` or ``torch.bfloat16`` -> ``"bfloat16"``.

    Raises ``ValueError`` naming ``name``, the value and the accepted choices.
    """
    if isinstance(value, torch.dtype):
        key = next((k for k, dtype in DTYPES.items() if dtype == value), None)
    else:
        key = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else None
    if key is not None and key in DTYPES:
        return key
    raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r} ({', '.join(DTYPE_ALIASES)} are their aliases)")


def parse_dtype(value: str | torch.dtype | None, *, name: str = "dtype") -> torch.dtype | None:
    """``"bfloat16"`` / ``"bf16"`` / ``torch.bfloat16`` -> ``torch.bfloat16``; ``None`` stays ``None`` (keep the
    file's). Raises ``ValueError`` as :func:`dtype_name`."""
    return None if value is None else DTYPES[dtype_name(value, name=name)]


def parse_kv_dtype(value: str | torch.dtype | None, *, name: str = "kv_dtype") -> torch.dtype | str | None:
    """A KV cache's dtype as :class:`~aiayn.decoding.adapters.CausalLMDecoder` takes it: ``"auto"`` stays ``"auto"``
    (the decoder chooses for its model), anything else as :func:`parse_dtype` reads it."""
    return KV_AUTO if value == KV_AUTO else parse_dtype(value, name=name)


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
    :class:`~aiayn.inference.quantization.Int8Linear` and :class:`~aiayn.inference.int4.Int4Linear` (they are small
    and keep the grid exact).
    """
    from aiayn.inference.int4 import Int4Linear
    from aiayn.inference.quantization import Int8Linear

    for module in model.modules():
        if isinstance(module, (Int8Linear, Int4Linear)):
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


def can_pack(weight: Tensor) -> bool:
    """Whether torch's oneDNN can pack ``weight`` here (on the CPU, in its dtype)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if weight.dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return weight.dtype == torch.float32


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` (same ``weight``/``bias`` parameters, same checkpoint keys) whose inference calls take the
    kernels timed fastest here: ``one`` for one-row calls, ``many`` for several rows, each ``"packed"`` (the weight
    also held packed for oneDNN; repacked if the weight changes), ``"plain"`` (``F.linear``), ``"native"`` /
    ``"native-prefetch"`` (our matrix-vector product, :mod:`aiayn.inference.gemv`, without and with prefetching; fp32
    and bf16; for several rows up to :data:`~aiayn.inference.gemv.FEW_ROWS`, oneDNN's packed kernel for more) or, for
    one row, ``"split"`` (:func:`~aiayn.inference.split_linear.split_linear`). Training (grad enabled) and other
    devices run the plain ``F.linear``.

    Why in fp32 too: on CPUs where MKL's sgemm is slow for a few rows (AMD EPYC here: 1.8x slower for one row
    through the 50257-word output projection, 2.6x for eight), oneDNN's packed kernel reads the weight at
    memory speed; ``docs/benchmarks.md`` has the measurement. The cost is a second copy of each weight packed.
    """

    KINDS = {"one": ("plain", "packed", "split", *gemv.KERNELS), "many": ("plain", "packed", *gemv.KERNELS)}

    def __init__(self, linear: nn.Linear, *, one: str = "packed", many: str = "packed") -> None:
        nn.Module.__init__(self)
        for name, kernel in (("one", one), ("many", many)):
            if kernel not in self.KINDS[name]:
                raise ValueError(f"PackedLinear: {name} must be one of {', '.join(self.KINDS[name])}, got {kernel!r}")
        for kernel in {one, many} & set(gemv.KERNELS):
            _check_native(linear.weight, kernel)
        self.one, self.many = one, many  # the kernels of one-row calls and of several-row calls
        self.parts = split_parts()  # the slices of a split call: set by the threads at load
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: a tied weight stays tied
        self.bias = linear.bias
        self._packed: Tensor | None = None
        self._packed_for: tuple = ()
        if "packed" in (one, many) or many in gemv.KERNELS:  # native several rows: packed beyond FEW_ROWS
            self.refresh()

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed tensor out (oneDNN's opaque tensors have no storage to copy);
        the copy packs its own at its first call."""
        state = self.__dict__.copy()
        state["_packed"], state["_packed_for"] = None, ()
        return state

    def refresh(self) -> None:
        """Pack the weight again if it changed (storage, version or dtype) since it was packed, or was never packed."""
        w = self.weight
        if (w.data_ptr(), w._version, w.dtype) != self._packed_for:
            # None when oneDNN cannot pack its (new) dtype here, e.g. a loaded model cast to bf16 on AVX2
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None) if can_pack(w) else None
            self._packed_for = (w.data_ptr(), w._version, w.dtype)

    def packed_forward(self, x: Tensor) -> Tensor:
        """The oneDNN call over the packed weight, repacked first if the weight changed since."""
        self.refresh()
        return self._packed_call(x)

    def _packed_call(self, x: Tensor) -> Tensor:
        if self._packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def native_call(self, one_row: bool, dtype: torch.dtype) -> gemv.NativeCall | None:
        """How :meth:`forward` computes an inference call of one row (``one_row``) or several in ``dtype``, for the C++
        decoding step; ``None`` for the split kernel (the step keeps the forward)."""
        kernel = self.one if one_row else self.many
        if kernel in gemv.KERNELS and self.weight.dtype == dtype and self.weight.is_contiguous():
            if one_row:
                return gemv.NativeCall("gemv", gemv.KERNELS[kernel], self.weight, None)
            return gemv.NativeCall("few", gemv.KERNELS[kernel], self.weight, None, self._packed_or_plain())
        if kernel in gemv.KERNELS:  # another dtype or layout: the forward's F.linear
            return gemv.NativeCall("plain", 0, self.weight, None)
        if kernel == "packed":
            return self._packed_or_plain()
        return gemv.NativeCall("plain", 0, self.weight, None) if kernel == "plain" else None

    def _packed_or_plain(self) -> gemv.NativeCall:
        """The C++ step's call through oneDNN's packed weight (that of ``packed`` calls, and of more rows than our kernel
        takes), as :meth:`forward` calls it; the plain one where the weight does not pack."""
        self.refresh()
        return gemv.NativeCall("packed", 0, self._packed, None) if self._packed is not None else gemv.NativeCall("plain", 0, self.weight, None)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight  # read once: a module's parameters are looked up by nn.Module.__getattr__
        if torch.is_grad_enabled() or x.dtype != weight.dtype or not (x.is_cpu and weight.is_cpu):
            return F.linear(x, weight, self.bias)  # training, or moved: the plain path
        kernel = self.one if x.numel() == x.shape[-1] else self.many
        if kernel in gemv.KERNELS and gemv.may_run() and gemv.few_rows(x, self.in_features):  # first: decoding's
            return gemv.gemv_linear(x, weight, self.bias, gemv.KERNELS[kernel])
        if kernel == "plain":
            return F.linear(x, weight, self.bias)
        if kernel == "split":
            return split_linear(x, weight, self.bias, self.parts)
        if torch.compiler.is_compiling():
            # A graph holds oneDNN's packed tensor only as a constant (Inductor's freezing, as the compiled decode step
            # runs: aiayn.decoding.adapters.compiled_step), packed when the step was built; otherwise the plain matmul.
            import torch._inductor.config as inductor_config  # here: at module level it would import Dynamo (70 MB) into every run

            return self._packed_call(x) if inductor_config.freezing else F.linear(x, self.weight, self.bias)
        return self.packed_forward(x)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"one row: {self.one}, several rows: {self.many}")


def _check_native(weight: Tensor, one: str) -> None:
    """A ``ValueError`` unless our matrix-vector kernel can take ``weight`` here (fp32 or bf16, and built on this machine)."""
    if weight.dtype not in gemv.DTYPES:
        raise ValueError(f"PackedLinear: one={one!r} takes float32 or bfloat16 weights, got {weight.dtype} (use packed, plain or split)")
    reason = gemv.unavailable_reason()
    if reason is not None:
        raise ValueError(f"PackedLinear: one={one!r} cannot run here: {reason} (use packed, plain or split)")


def pack_linears(model: nn.Module, rows: int | None = None) -> int:
    """Replace CPU ``nn.Linear`` layers by :class:`PackedLinear`, in place, where torch's oneDNN supports their
    dtype here and a kernel other than ``F.linear`` is the faster one for their shape on this machine, for one row
    or for several (timed once per shape and cached: :func:`~aiayn.inference.kernel_choice.choose_kernels`);
    returns how many were replaced. Weight-only int8 and int4 layers get their one-row kernel the same way
    (:func:`choose_quantized_kernels`).

    ``rows``: the rows of a several-row call, timed beside one row; by default 8 for models that decode (a
    batch, a prompt) and 64 for encoder-only models (a batch of sentences at once)."""
    from aiayn.inference.kernel_choice import choose_kernels

    if rows is None:
        rows = 64 if getattr(getattr(model, "config", None), "family", None) == "encoder-only" else 8
    candidates = [(n, m) for n, m in model.named_modules()
                  if isinstance(m, nn.Linear) and not isinstance(m, PackedLinear) and can_pack(m.weight)]
    kernels = dict(zip((n for n, _ in candidates), choose_kernels([m.weight for _, m in candidates], rows)))
    targets = [(n, m) for n, m in candidates if kernels[n] != "plain/plain"]

    def chosen(name: str, linear: nn.Linear) -> PackedLinear:
        one, many = kernels[name].split("/")
        return PackedLinear(linear, one=one, many=many)

    replace_linears(model, targets, chosen)
    choose_quantized_kernels(model)
    return len(targets)


def choose_quantized_kernels(model: nn.Module) -> None:
    """Set each weight-only int8 and int4 layer's kernels (``one`` for one row, ``many`` for a few: torch's
    ``_weight_int8pack_mm`` or ``_weight_int4pack_mm_for_cpu``, or our native matrix-vector product, without or with
    prefetching; ``prompt`` for more), timed once per shape and cached as the Linear kernels are."""
    from aiayn.inference.int4 import Int4Linear
    from aiayn.inference.kernel_choice import choose_int4_kernels, choose_int8_kernels, choose_prompt_kernels
    from aiayn.inference.quantization import Int8Linear

    int8 = [m for m in model.modules() if type(m) is Int8Linear and m.weight.device.type == "cpu"]
    int4 = [m for m in model.modules() if type(m) is Int4Linear and m.weight.device.type == "cpu"]
    choices = [*choose_int8_kernels([m.weight for m in int8]),
               *choose_int4_kernels([m.weight for m in int4], [m.group_size for m in int4])]
    layers: list[Int8Linear | Int4Linear] = [*int8, *int4]
    for layer, choice in zip(layers, choices):
        layer.one, layer.many = choice.split("/")
    for layer, prompt in zip(layers, choose_prompt_kernels([m.weight for m in layers], [getattr(m, "group_size", 0) for m in layers])):
        layer.prompt = prompt


def replace_linears(model: nn.Module, targets: list[tuple[str, nn.Linear]], make: Callable[[str, nn.Linear], nn.Module]) -> nn.Module:
    """Put ``make(name, linear)`` in place of each named Linear layer of ``model``, in place; returns ``model``
    (packing here, int8 and int4 quantisation)."""
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(name, linear))
    return model
