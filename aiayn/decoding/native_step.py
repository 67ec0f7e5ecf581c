"""The one-token decoding step in C++: the layers of a decoder-only model for one new token per row, over its KV cache
(static or growing), with no Python between the operators (``aiayn/inference/decode_step.cpp``).

Why: the eager step calls a few dozen modules and operators a layer from Python. With GPT-2 small's weights streaming
through the caches at every token, that Python took 3-5 ms of a 20 ms fp32 token on an AMX Xeon (Inductor's compiled
step: 2 ms), so the default load decoded 16-20% slower than ``--compile`` (``docs/benchmarks.md``). The C++ step
calls the same kernels the model's layers chose at load (each Linear's one-row or several-row kernel, the one-query
attention, the GELU), in the order :meth:`~aiayn.nn.blocks.TransformerLayer.forward` calls them. Where it knows them, the
step also embeds the ids (the token table and learned positions: the ids go in) and applies the output projection
(the logits come out, with their argmax for greedy's pick), since after a token's weights have streamed through the
caches, every Python call around the step runs cold (on a Zen 4 EPYC: the embeddings and their checks 250-420 us, the
argmax's call 70-90 us, of a 5 ms int8 token); sinusoidal positions and an output layer of another kind stay the model's own modules.

It applies to a decoder-only model in eval mode on the CPU whose layers are softmax self-attention with Q/K/V fused
at load (:mod:`aiayn.inference.fusion`, as SwiGLU's gate and up), positions added to the input (learned, sinusoidal or none)
or rotary over whole heads (the step rotates the query and the new key with the angles the model's module computes), with or
without QK norm,
LayerNorm or RMSNorm, and Linear layers of the kinds in :data:`LINEAR_KINDS`; :func:`native_step_blocker` names
what stops any other model, which then takes the eager step. Like a compiled step, it holds the derived weights
(oneDNN's packed copy, int4's layout) as they were when it was built: build a new decoder after changing a loaded
model's weights.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.decoding.sampling import remember_argmax
from aiayn.inference import gemv
from aiayn.models.common import check_token_ids
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.attention import FEW_QUERIES, _native_fits, resolve_backend
from aiayn.nn.blocks import TransformerLayer
from aiayn.nn.cache import KVCache, LayerCache, StaticLayerCache
from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.feedforward import native_gelu_tanh
from aiayn.nn.norm import NativeLayerNorm, NativeRMSNorm, kernel_eps, takes_kernel
from aiayn.nn.positional import LearnedPositions, NoPositions, RotaryPositions

__all__ = ["ACTIVATIONS", "ATTENTION", "LINEAR_KINDS", "NativeStep", "native_step", "native_step_blocker"]

log = logging.getLogger(__name__)

# The numbers decode_step.cpp reads (its enums of the same names).
LINEAR_KINDS = {"plain": 1, "gemv": 2, "packed": 3, "int4": 4, "int8": 5, "few": 6, "int4-widened": 7}
NORMS = {nn.LayerNorm: 0, nn.RMSNorm: 1, NativeLayerNorm: 2, NativeRMSNorm: 3}
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "gelu_tanh-native": 3, "silu": 4, "swiglu": 5, "relu2": 6}
ATTENTION = {"native": 0, "sdpa": 1, "math": 2}
POSITIONS = ("learned", "sinusoidal", "none", "rotary")  # added to the input, or rotating queries and keys (the step rotates)


class _Plan:
    """The flat lists :class:`DecodeStep` is built from, written in the order ``decode_step.cpp``'s ``Reader`` reads them."""

    def __init__(self) -> None:
        self.tensors: list[Tensor | None] = []
        self.ints: list[int] = []
        self.floats: list[float] = []

    def norm(self, norm: Any, dtype: torch.dtype) -> None:
        """An nn.LayerNorm or nn.RMSNorm by torch's kernel, or by ours where its forward takes ours for the model's
        inputs of ``dtype`` (:func:`~aiayn.nn.norm.takes_kernel`)."""
        layer_norm = isinstance(norm, nn.LayerNorm)
        if takes_kernel(norm, dtype):
            kind, eps = NORMS[NativeLayerNorm if layer_norm else NativeRMSNorm], kernel_eps(norm, dtype)
        else:  # torch's: RMSNorm's default eps (None) is resolved by at::rms_norm, told by -1
            kind, eps = NORMS[nn.LayerNorm if layer_norm else nn.RMSNorm], -1.0 if norm.eps is None else norm.eps
        self.ints.append(kind)
        self.floats.append(float(eps))
        self.tensors += [norm.weight, getattr(norm, "bias", None)]

    def linear(self, call: gemv.NativeCall, out: int, bias: Tensor | None) -> None:
        """One Linear layer's record; ``few`` carries the rows it takes and, after it (and after ``int4-widened``'s), the
        record of the call beyond."""
        self.ints += [LINEAR_KINDS[call.kind], call.param, out, *([gemv.FEW_ROWS] if call.kind == "few" else [])]
        self.tensors += [call.weight, call.scale, bias]
        if call.kind in ("few", "int4-widened"):
            assert call.beyond is not None, f"a {call.kind} call names the call beyond it"
            self.linear(call.beyond, out, bias)


def native_step_blocker(model: nn.Module) -> str | None:
    """What keeps ``model`` from the C++ step (a phrase), or ``None`` when it applies (for any batch size)."""
    if not isinstance(model, DecoderOnly):
        return f"a {type(model).__name__} (decoder-only models only)"
    if model.training:
        return "a model in training mode"
    if model.embed.weight.device.type != "cpu":
        return f"weights on {model.embed.weight.device} (the CPU only)"
    if model.positions.kind not in POSITIONS:
        return f"{model.positions.kind} positions (accepted: {', '.join(POSITIONS)})"
    if isinstance(model.positions, RotaryPositions) and 2 * model.positions.inv_freq.numel() != model.config.head_dim:
        return "rotary positions over part of each head"
    stack = model.decoder
    if stack.norm is not None and type(stack.norm) not in NORMS:
        return f"a final {type(stack.norm).__name__}"
    for index, layer in enumerate(_layers(model)):
        reason = _layer_blocker(layer)
        if reason is not None:
            return f"layer {index}: {reason}"
    reason = gemv.unavailable_reason()  # last: it builds the library on a machine's first call (a model that cannot take it need not)
    return None if reason is None else f"no native library here ({reason})"


def _layers(model: DecoderOnly) -> list[TransformerLayer]:
    return list(model.decoder.layers)  # type: ignore[arg-type]  # a ModuleList of TransformerLayers


def _layer_blocker(layer: TransformerLayer) -> str | None:
    attention = layer.self_attn
    if attention is None:
        return "a state-space mixer"
    if layer.cross_attn is not None:
        return "cross-attention"
    if attention.kernel.name != "softmax":
        return f"{attention.kernel.name} attention"
    if attention.w_qkv is None:
        return "Q, K and V not fused (aiayn.inference.fusion fuses them at load)"
    for norm in (layer.self_attn_norm, layer.ffn_norm):
        if type(norm) not in NORMS:
            return f"a {type(norm).__name__}"
    if layer.ffn.activation not in ACTIVATIONS:
        return f"activation {layer.ffn.activation!r}"
    if layer.ffn.activation == "swiglu" and layer.ffn.w_gate_up is None:
        return "SwiGLU's gate and up projections not fused (aiayn.inference.fusion fuses them at load)"
    return None


class NativeStep:
    """The C++ step of one model: :meth:`logits` of ``T`` new tokens per row over its KV cache, and called as the decoder
    calls its one-token step and its prompt, ``(model, tokens (B, T), cache, key_mask, offset) -> the last position's
    logits (B, V)`` (the output projection of that position only). Its plans are built at
    the first call of each batch kind (one row of one token, or more: the layers' kernels differ); a batch kind with a
    Linear layer it does not know, a model switched to training mode, and a cache of another kind take the model's
    forward."""

    def __init__(self, model: DecoderOnly) -> None:
        self._model = model
        # one row of one token? -> (torch.classes.aiayn_native.DecodeStep, whether it embeds, whether it projects)
        self._plans: dict[bool, tuple[Any, bool, bool] | None] = {}

    def __call__(self, model: DecoderOnly, tokens: Tensor, cache: KVCache | None, key_mask: Tensor | None, offset: Tensor | int) -> Tensor:
        logits, best = self._run(model, tokens, cache, key_mask, offset, 1)  # the last position's: all a step uses
        last = logits[:, -1]
        if best is not None:  # the step's own argmax of these logits: greedy's pick without another pass (sampling.py)
            remember_argmax(last, best)
        return last

    def logits(self, model: DecoderOnly, tokens: Tensor, cache: KVCache | None, key_mask: Tensor | None, offset: Tensor | int) -> Tensor:
        """``tokens (B, T)`` at positions ``offset`` (an int, or ``(B,)``) after the cached ones -> logits ``(B, T, V)``,
        as ``model(tokens, key_mask, cache=cache, offset=offset)`` gives them."""
        return self._run(model, tokens, cache, key_mask, offset, 0)[0]

    def _run(self, model: DecoderOnly, tokens: Tensor, cache: KVCache | None, key_mask: Tensor | None,
             offset: Tensor | int, logits_to_keep: int) -> tuple[Tensor, Tensor | None]:
        """:meth:`logits` (of the last ``logits_to_keep`` positions where it is more than 0, as the model's
        ``logits_to_keep`` cuts them), and each row's argmax where the step made it (one position a row, fp32 or bf16
        logits), else ``None``."""
        chosen = self._plan(model, tokens, cache)
        if chosen is None or cache is None:
            return model(tokens, key_mask, cache=cache, offset=offset, logits_to_keep=logits_to_keep), None
        plan, embeds, projects = chosen
        caches = cache.self_attn
        positions = model.positions
        length = tokens.shape[1]
        if embeds and tokens.dtype == torch.long and tokens.dim() == 2:
            # the step embeds, checking the ids: one call from here to the logits
            inputs, at = tokens.contiguous(), offset if isinstance(offset, Tensor) else torch.tensor([offset])
        else:
            check_token_ids(tokens, model.config.vocab_size, "ids")
            inputs, at = positions.embed(model.embed(tokens), offset), None  # (B, T, D): the model's own embeddings
        cos, sin = positions.angles(offset, length, tokens.device) if isinstance(positions, RotaryPositions) else (None, None)
        tensors = [t for c in caches for t in (c.k, c.v)]
        keep = logits_to_keep if projects else 0  # else the hidden states of every position, cut below
        if type(caches[0]) is StaticLayerCache:
            out, best = plan.run(inputs, at, tensors, [c.next_column for c in caches], key_mask, cos, sin, keep)
        else:  # the growing cache: each layer's keys and values with the new positions appended, as LayerCache.update does
            out, best, tensors = plan.run_growing(inputs, at, tensors, key_mask, cos, sin, keep)
            for c, k, v in zip(caches, tensors[0::2], tensors[1::2]):
                c.k, c.v, c.length = k, v, c.length + length
        return (out, best) if projects else (model.output(out[:, -logits_to_keep:] if logits_to_keep else out), None)

    def _plan(self, model: DecoderOnly, tokens: Tensor, cache: KVCache | None) -> tuple[Any, bool, bool] | None:
        """The plan for this call, or ``None`` where the forward must run."""
        if model.training or model is not self._model or cache is None:
            return None
        caches = cache.self_attn
        static = all(type(c) is StaticLayerCache and c.k is not None for c in caches)
        if not static and not all(type(c) is LayerCache and c.k is not None for c in caches):
            return None
        one = tokens.numel() == 1
        if one not in self._plans:
            try:
                plan = build_plan(model, one)
                self._plans[one] = (plan, plan.embeds(), plan.projects())
            except ValueError as err:  # a Linear kind it does not know: this batch kind keeps the forward
                log.debug("the one-token step runs eagerly at %s: %s", "one row" if one else "several rows", err)
                self._plans[one] = None
        return self._plans[one]


def native_step(model: nn.Module) -> NativeStep | None:
    """The C++ step for ``model``, or ``None`` (logged, with the reason) where it does not apply."""
    reason = native_step_blocker(model)
    if reason is not None:
        log.debug("the one-token step runs eagerly: %s", reason)
        return None
    return NativeStep(model)  # type: ignore[arg-type]  # checked: a DecoderOnly


def build_plan(model: DecoderOnly, one_row: bool) -> Any:
    """``torch.classes.aiayn_native.DecodeStep`` for ``model``'s layers at one row of one token a call (``one_row``) or more."""
    stack, layers = model.decoder, _layers(model)
    first: Any = layers[0].self_attn
    dtype = model.embed.weight.dtype
    plan = _Plan()
    plan.ints += [first.n_heads, first.n_kv_heads, first.head_dim, int(layers[0].pre_norm), int(stack.norm is not None),
                  int(model.positions.kind == "rotary"), int(first.qk_norm), len(layers), FEW_QUERIES]
    for layer in layers:
        attention: Any = layer.self_attn
        ffn = layer.ffn
        plan.norm(layer.self_attn_norm, dtype)
        plan.norm(layer.ffn_norm, dtype)
        if attention.qk_norm:
            plan.norm(attention.q_norm, dtype)
            plan.norm(attention.k_norm, dtype)
        _linear(plan, attention.w_qkv, one_row, dtype)
        _linear(plan, attention.w_o, one_row, dtype)
        _linear(plan, ffn.w_gate_up if ffn.activation == "swiglu" else ffn.w_1, one_row, dtype)
        _linear(plan, ffn.w_2, one_row, dtype)
        plan.ints += [ACTIVATIONS[_activation(ffn.activation, dtype)], ATTENTION[_attention(attention, dtype, 1)],
                      ATTENTION[_attention(attention, dtype, 2)]]  # one query a row; several
    if stack.norm is not None:
        plan.norm(stack.norm, dtype)
    _output(plan, model.output, one_row, dtype)
    _embeddings(plan, model)
    return torch.classes.aiayn_native.DecodeStep(plan.tensors, plan.ints, plan.floats)


def _output(plan: _Plan, output: nn.Module, one_row: bool, dtype: torch.dtype) -> None:
    """The output projection in the plan where the C++ step knows its kind (the logits then come from the step, with no
    Python after the last layer), else a 0: the model's own module projects. Written twice, as the plan's batch kind
    calls it and as one row calls it: a prompt of one row projects its last position only, one row, and the module
    would take its one-row kernel there."""
    projection = _Plan()
    try:
        _linear(projection, output, one_row, dtype)
        _linear(projection, output, True, dtype)
    except ValueError as err:
        log.debug("the output projection stays the model's module: %s", err)
        plan.ints.append(0)
        return
    plan.ints.append(1)
    plan.ints += projection.ints
    plan.tensors += projection.tensors


def _embeddings(plan: _Plan, model: DecoderOnly) -> None:
    """The token table and its scale, and the learned position table, in the plan where the model embeds so (then the
    step takes token ids, and a token's Python before the layers is one call), else a 0: the model's modules embed.
    Sinusoidal positions stay in Python (their table grows on demand)."""
    embed, positions = model.embed, model.positions
    if type(embed) is not TokenEmbedding or type(positions) not in (LearnedPositions, NoPositions, RotaryPositions):
        plan.ints.append(0)
        return
    plan.ints.append(1)
    table: Tensor | None = positions.weight if isinstance(positions, LearnedPositions) else None  # rotary: added to q, k
    plan.tensors += [embed.weight, table]
    plan.floats.append(float(embed.scale))


def _activation(name: str, dtype: torch.dtype) -> str:
    """The activation as the eager FFN computes it (GPT-2's GELU: the kernel timed faster here)."""
    return "gelu_tanh-native" if name == "gelu_tanh" and native_gelu_tanh(dtype, torch.device("cpu")) else name


def _attention(attention: Any, dtype: torch.dtype, queries: int) -> str:
    """The backend of ``queries`` queries a row, asked of the library's own rules with stand-in tensors of the layer's
    shapes: :func:`~aiayn.nn.attention.resolve_backend`, and where that says ``native``, whether our kernel takes them
    (else torch's, as :func:`~aiayn.nn.attention.scaled_dot_product_attention` falls back)."""
    q = torch.empty(1, attention.n_heads, queries, attention.head_dim, dtype=dtype)
    k = torch.empty(1, attention.n_kv_heads, queries, attention.head_dim, dtype=dtype)
    backend = resolve_backend(attention.backend, q, queries, causal=True)
    return "sdpa" if backend == "native" and not _native_fits(q, k, k, None, None, 0.0, causal=True) else backend


def _linear(plan: _Plan, module: Any, one_row: bool, dtype: torch.dtype) -> None:
    """Write how ``module`` computes a call of one row (``one_row``) or several: its own ``native_call`` (each of our
    Linear classes writes it beside its ``forward``), or ``at::linear`` for a plain ``nn.Linear``.

    Raises ``ValueError`` for a layer the C++ step cannot take (the decoder then keeps the eager step)."""
    call = module.native_call(one_row, dtype) if hasattr(module, "native_call") else None
    if call is None and type(module) is nn.Linear:
        call = gemv.NativeCall("plain", 0, module.weight, None)
    if call is None:
        raise ValueError(f"the C++ step does not know how a {type(module).__name__} computes ({module.extra_repr()})")
    plan.linear(call, module.out_features, module.bias)
