"""Scaled dot-product attention (paper section 3.2.1) with two backends chosen by name.

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``

* ``"math"``: the formula written out; the only backend that can return the attention weights
  (for learning and visualisation).
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel
  (flash / memory-efficient) when it can.
* ``"auto"`` (the models' default): ``"math"`` when training in half precision on the CPU with at
  most ``AUTO_MATH_MAX_KEYS`` keys, where torch's CPU flash kernel's backward is 2-4x slower than the
  formula (measured in ``docs/benchmarks.md``); for one query at inference on the CPU (a decoding step), or a few
  causal ones (at most :data:`FEW_QUERIES`: speculative decoding's check, which then computes each query as the step at
  its position does), the backend :data:`ONE_QUERY` (one query) or :data:`FEW_QUERY` (a check) holds for its dtype and
  shape, timed at load on this machine
  (:func:`aiayn.inference.kernel_choice.choose_attention`: in bf16 the flash kernel took 4x the formula's time
  at 512 keys on a Zen 5 EPYC), which may also be ``"native"``, our one-query kernel built on this machine
  (:func:`aiayn.inference.gemv.attend_one`); ``"sdpa"`` everywhere else. Training on the CPU without a mask (causal or
  not), that backend is timed once per shape against our training kernel (``aiayn/inference/attention_train.cpp``:
  1.7x the flash kernel's speed in fp32 and 1.4x in bf16 for GPT-2 small's heads on an AMX Xeon), which is taken where faster
  (:func:`aiayn.inference.kernel_choice.choose_training_attention`). A named backend is always obeyed.

Masks follow :mod:`aiayn.nn.masks`: bool, ``True`` = may attend. Fully masked query rows give an
all-zero output and zero gradients in both backends (no NaN, no ``-1e9`` that overflows fp16).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.inference import gemv, kernel_choice
from aiayn.nn.dropout import dropout
from aiayn.nn.dropout import takes_kernel as dropout_takes_kernel
from aiayn.nn.masks import causal_mask, check_attention_mask

BACKENDS: tuple[str, ...] = ("math", "sdpa", "auto")
# What the one-query choice may pick (ONE_QUERY's values): "native" attends one query at inference through
# aiayn.inference.gemv.attend_one and falls back to "sdpa" where that does not apply (see _native_fits).
ONE_QUERY_BACKENDS: tuple[str, ...] = ("sdpa", "math", "native")
AUTO_MATH_MAX_KEYS = 128
# (dtype, heads, head dim) -> the backend of one query at inference on the CPU, filled at load by timing
# (aiayn.inference.kernel_choice.choose_attention); a shape not in it takes "sdpa".
ONE_QUERY: dict[tuple[torch.dtype, int, int], str] = {}
# The most causal queries a row that take a timed choice at inference (a decoding check: the rows the C++ step's
# Linear layers take through our kernel); more (a prompt) take "sdpa".
FEW_QUERIES = gemv.FEW_ROWS
# (dtype, heads, head dim) -> the backend of a few causal queries (a check), timed at load apart from one query (torch's
# kernel can win a step whose cache comes from memory and lose a check, which is arithmetic); a shape not in it takes
# ONE_QUERY's choice.
FEW_QUERY: dict[tuple[torch.dtype, int, int], str] = {}

__all__ = ["scaled_dot_product_attention", "repeat_kv", "resolve_backend", "BACKENDS", "AUTO_MATH_MAX_KEYS", "FEW_QUERIES",
           "ONE_QUERY", "ONE_QUERY_BACKENDS", "FEW_QUERY"]


def repeat_kv(k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Grouped-query attention: ``k, v (B, Hkv, S, D)`` -> ``(B, heads, S, D)``, each key/value head
    serving ``heads / Hkv`` query heads. Raises ``ValueError`` unless ``Hkv`` divides ``heads``."""
    kv_heads = k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads {heads} must be a multiple of key/value heads {kv_heads}")
    if heads == kv_heads:
        return k, v
    return k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)


def resolve_backend(backend: str, q: Tensor, k_len: int, causal: bool = False) -> str:
    """The kernel ``backend`` names; ``"auto"`` picks by device, dtype, training and length (see above)."""
    if backend != "auto":
        return backend
    training = torch.is_grad_enabled() and q.requires_grad
    if q.device.type == "cpu" and not training and _few_queries(q.shape[2], causal):  # a decoding step, or its check
        shape = (q.dtype, q.shape[1], q.shape[3])
        one = ONE_QUERY.get(shape, "sdpa")
        return one if q.shape[2] == 1 else FEW_QUERY.get(shape, one)
    half_on_cpu = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
    return "math" if half_on_cpu and training and k_len <= AUTO_MATH_MAX_KEYS else "sdpa"


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "sdpa",
    return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attend queries ``q (B, H, T, D)`` over keys ``k (B, Hkv, S, D)`` and values ``v (B, Hkv, S, Dv)``.

    ``mask``: bool, ``True`` = may attend, broadcastable to ``(B, H, T, S)``.
    ``bias``: float, added to the scores (relative positions such as ALiBi), broadcastable likewise.
    ``causal``: also forbid attending to the future, aligned to the lower right (a query shorter
    than the keys is the last ``T`` positions, as with a KV cache).
    ``Hkv`` may divide ``H`` (grouped-query attention); keys and values are then shared by groups.
    Returns ``(output (B, H, T, Dv), weights (B, H, T, S) or None)``; weights only from ``"math"``.
    Raises ``ValueError`` for an unknown backend or mismatched shapes, ``TypeError`` for a non-bool mask.
    """
    if backend not in BACKENDS and backend not in ONE_QUERY_BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if return_weights and backend not in ("math", "auto"):
        raise ValueError(f"return_weights=True needs backend='math', got backend={backend!r}")
    batch, heads, q_len, _ = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    if k.shape[:3] != v.shape[:3] or k.shape[0] != batch or heads % kv_heads != 0:
        raise ValueError(
            f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(expected q (B, H, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) with H % Hkv == 0)"
        )
    if mask is not None:
        check_attention_mask(mask, batch, heads, q_len, k_len)
    if causal and k_len < q_len:
        raise ValueError(f"causal attention needs at least as many keys as queries, got T={q_len}, S={k_len}")
    asked = backend
    backend = "math" if return_weights else resolve_backend(backend, q, k_len, causal)
    if asked == "auto" and backend == "sdpa" and dropout_p > 0.0 and dropout_takes_kernel(q, dropout_p):
        # torch's CPU kernel computes a call with dropout by the formula too (bmm, softmax, its one-thread bernoulli_):
        # the formula here, with our dropout (aiayn.nn.dropout)
        backend = "math"
    if (asked == "auto" and not return_weights and backend in ("sdpa", "math")
            and _native_training_fits(q, k, v, mask, bias, dropout_p, causal)):
        # training without a mask on the CPU: the rule's kernel or ours, whichever was timed faster at this shape
        chosen = kernel_choice.choose_training_attention(q.dtype, tuple(q.shape), causal, backend)
        if chosen in ("native", "native-tiles"):
            return NativeAttention.apply(q, k, v, causal and q_len > 1, 1.0 / math.sqrt(q.shape[-1]), chosen == "native-tiles"), None
    if backend == "native":
        if _native_fits(q, k, v, mask, bias, dropout_p, causal):
            return gemv.attend_one(q, k, v, mask, causal), None
        backend = "sdpa"
    if q.numel() == 0 or k_len == 0:  # nothing to attend from, or to: a defined all-zero result
        out = q.new_zeros(batch, heads, q_len, v.shape[-1])
        return out, (q.new_zeros(batch, heads, q_len, k_len) if return_weights else None)
    k, v = repeat_kv(k, v, heads)
    causal = causal and q_len > 1  # lower-right aligned: one query is the last position and sees every key

    # Fold the causal constraint into the mask only when a mask is needed anyway; the plain causal
    # case with T == S goes to the fused kernel through is_causal.
    fused_causal = causal and mask is None and bias is None and q_len == k_len and backend == "sdpa"
    if causal and not fused_causal:
        future = causal_mask(q_len, k_len, device=q.device)
        mask = future if mask is None else mask & future

    empty_rows = None
    if mask is not None:
        # A row with nothing to attend to would be softmax over all -inf = NaN. Let such rows attend
        # everywhere (any finite result) and zero them afterwards, which also zeroes their gradients.
        has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
        # Checking first skips the fix-up in the usual case, but reading the answer stops the
        # program until the device has computed it (and breaks a torch.compile graph): on devices
        # other than the CPU, and when compiling, the fix-up is applied always.
        if not _check_on_host(q) or not bool(has_key.all()):
            empty_rows = ~has_key
            mask = mask | empty_rows

    if backend == "math":
        out, weights = _math_attention(q, k, v, mask, bias, dropout_p, return_weights)
    else:
        attn_mask = mask
        if bias is not None:
            attn_mask = bias.to(q.dtype)
            if mask is not None:
                attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=fused_causal
        )
        weights = None

    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
        if weights is not None:
            weights = weights.masked_fill(empty_rows, 0.0)
    return out, weights


def _few_queries(queries: int, causal: bool) -> bool:
    """One query, or a few causal ones (at most :data:`FEW_QUERIES`, at least as many keys): what the one-query choice
    and our kernel take."""
    return queries == 1 or (causal and 1 < queries <= FEW_QUERIES)


def _native_fits(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
                 causal: bool = False) -> bool:
    """Whether the queries can go through :func:`aiayn.inference.gemv.attend_one` (chosen only where the kernel loaded):
    the CPU, one query or a few causal ones (:func:`_few_queries`, no more than the keys), no gradient asked for, fp32
    or bf16, values as wide as keys, no bias or dropout, a mask over keys only (``(B|1, 1, 1, S)``), the last dimension
    contiguous, keys to attend to, and, in a graph being compiled, a machine whose graphs call our kernels
    (:func:`aiayn.inference.gemv.may_run`)."""
    return (
        q.device.type == "cpu" and _few_queries(q.shape[2], causal) and q.shape[2] <= k.shape[2] and k.shape[2] > 0
        and q.numel() > 0 and bias is None and dropout_p == 0.0
        and q.dtype in gemv.DTYPES and k.dtype == q.dtype and v.dtype == q.dtype and v.shape == k.shape
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and (mask is None or (mask.dim() == 4 and mask.shape[0] in (1, q.shape[0]) and mask.shape[1:] == (1, 1, k.shape[2])))
        and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and gemv.may_run()
    )


TRAINING_MAX_KEYS = 4096  # our training kernel keeps a head's scores (queries x keys fp32, twice) in each thread's buffers


def _native_training_fits(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
                          causal: bool) -> bool:
    """Whether a training call can go through our kernel (:class:`NativeAttention`, where it loaded): the CPU, a gradient
    asked for, fp32 or bf16, one key/value head per query head, no mask, bias or dropout, a causal call with as many keys
    as queries, a head dimension of a multiple of 16 (the vectors' width), at most :data:`TRAINING_MAX_KEYS` keys, the
    last dimension contiguous, eagerly."""
    return (
        q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        and q.dtype in gemv.DTYPES and k.dtype == q.dtype and v.dtype == q.dtype and k.shape == v.shape
        and k.shape[:2] == q.shape[:2] and k.shape[3] == q.shape[3] and q.shape[3] % 16 == 0 and q.numel() > 0
        and 0 < k.shape[2] <= TRAINING_MAX_KEYS and (not causal or k.shape[2] == q.shape[2])
        and mask is None and bias is None and dropout_p == 0.0
        and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and not torch.compiler.is_compiling()
    )


class NativeAttention(torch.autograd.Function):
    """``apply(q, k, v (B, H, T|S, D), causal, scale, tiles=False)`` -> ``softmax(scale q k^T) v`` by our kernel, forward
    and backward (``aiayn_native::attention_forward`` saves each row's log-sum-exp; the backward recomputes the scores
    from it). ``tiles``: each product by oneDNN's small-matrix kernel (``attention_tiles.cpp``; bf16 only where
    :func:`~aiayn.inference.gemv.tiles_available`), else by our register-blocked loops in fp32 arithmetic."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, tiles: bool = False) -> Tensor:
        out, lse = torch.ops.aiayn_native.attention_forward(q, k, v, causal, scale, tiles)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.tiles = causal, scale, tiles
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.aiayn_native.attention_backward(grad, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.tiles)
        return dq, dk, dv, None, None, None


def _check_on_host(q: Tensor) -> bool:
    """Whether to look at the mask before fixing up fully masked rows (cheap only on the CPU, eagerly)."""
    return q.device.type == "cpu" and not torch.compiler.is_compiling()


def _math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    dropout_p: float,
    return_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, with the softmax in float32 for half-precision inputs."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    half = q.dtype in (torch.float16, torch.bfloat16)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32 if half else None).to(q.dtype)
    if dropout_p > 0.0:
        weights_used = dropout(weights, dropout_p)
    else:
        weights_used = weights
    out = weights_used @ v  # (B, H, T, Dv)
    return out, (weights if return_weights else None)
