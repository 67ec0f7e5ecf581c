"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs").

Softmax's ``exp(q . k)`` is replaced by a kernel ``phi(q) . phi(k)`` with the feature map
``phi(x) = elu(x) + 1`` (positive, so the normaliser never vanishes). Then

    out_i = phi(q_i) S / phi(q_i) z,   S = sum_j phi(k_j) v_j^T  (D x Dv),   z = sum_j phi(k_j)  (D)

costs ``O(n D Dv)`` instead of ``O(n^2 D)``. Causal: ``S`` and ``z`` become prefix sums over the keys
up to ``i``, computed chunk by chunk (a quadratic product inside each chunk of ``C`` positions, a
running state between chunks). Generation runs it as an RNN: the state ``(S, z)`` per head replaces
the KV cache, so every new token costs constant time and memory (:class:`LinearAttentionState`).

There are no attention weights to return: the ``n x n`` matrix is never formed.
"""

from __future__ import annotations

from itertools import repeat

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from aiayn.nn.attention import repeat_kv

SEGMENT = 256  # positions per recomputed segment when training on long sequences

__all__ = [
    "LinearAttentionState",
    "causal_linear_attention",
    "feature_map",
    "linear_attention",
    "linear_attention_reference",
]


def feature_map(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1``, elementwise and positive."""
    return F.elu(x) + 1.0


def _normalise(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator``, with 0 where no key counted (a fully padded row): no NaN, no eps bias."""
    empty = denominator <= 0
    return numerator / torch.where(empty, torch.ones_like(denominator), denominator)


def _masked_features(k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """``phi(k)`` and ``v`` with padded keys zeroed, so that they add nothing to the sums."""
    phi_k = feature_map(k)
    if key_mask is None:
        return phi_k, v
    keep = key_mask[:, None, :, None].to(k.dtype)  # (B|1, 1, S, 1)
    return phi_k * keep, v * keep


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None = None) -> Tensor:
    """Bidirectional linear attention: ``q (B, H, T, D)``, ``k, v (B, Hkv, S, D|Dv)`` -> ``(B, H, T, Dv)``.

    ``key_mask``: ``(B|1, S)`` bool, ``True`` = real key. Cost ``O((T + S) D Dv)``.
    """
    k, v = repeat_kv(k, v, q.shape[1])
    phi_q = feature_map(q)
    phi_k, v = _masked_features(k, v, key_mask)
    state = phi_k.transpose(-1, -2) @ v  # (B, H, D, Dv): sum_j phi(k_j) v_j^T
    norm = phi_k.sum(dim=2)  # (B, H, D)
    return _normalise(phi_q @ state, (phi_q @ norm[..., None]))


def causal_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None = None, state: tuple[Tensor, Tensor] | None = None,
    chunk: int = 64,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Causal linear attention by chunks: ``q, k, v (B, H|Hkv, T, D)`` -> ``(out (B, H, T, Dv), (S, z))``.

    Query ``i`` sees keys ``0..i`` (and whatever ``state`` already sums: the keys of earlier calls).
    ``state``: ``(S (B, H, D, Dv), z (B, H, D))`` to continue from; the returned one includes these
    ``T`` keys. ``key_mask``: ``(B|1, T)`` bool, ``True`` = real key. Cost ``O(T C D + T D Dv)``.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    k, v = repeat_kv(k, v, q.shape[1])
    batch, heads, length, dim = q.shape
    if state is None:
        state = (q.new_zeros(batch, heads, dim, v.shape[-1]), q.new_zeros(batch, heads, dim))
    if length <= SEGMENT or not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        out, s, z = _causal_chunks(q, k, v, key_mask, state[0], state[1], chunk)
        return out, (s, z)
    # Training on long sequences: segments recomputed in the backward pass (activation
    # checkpointing), the state carried from one to the next, so that only one segment's
    # intermediates exist at a time.
    # split (not slicing) cuts the segments: its backward joins the gradients once, where each slice
    # of the whole sequence would allocate a full-size gradient.
    s, z = state
    outs = []
    masks = repeat(None) if key_mask is None else key_mask.split(SEGMENT, dim=1)
    for q_s, k_s, v_s, mask in zip(q.split(SEGMENT, dim=2), k.split(SEGMENT, dim=2), v.split(SEGMENT, dim=2), masks):
        out, s, z = checkpoint(_causal_chunks, q_s, k_s, v_s, mask, s, z, chunk, use_reentrant=False)
        outs.append(out)
    return torch.cat(outs, dim=2), (s, z)


def _causal_chunks(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, s0: Tensor, z0: Tensor, chunk: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The chunked formula over one stretch of positions, starting from the state ``(s0, z0)``."""
    batch, heads, length, _ = q.shape
    dim_v = v.shape[-1]
    if length == 0:
        return q.new_zeros(batch, heads, 0, dim_v), s0, z0
    phi_q = feature_map(q)
    phi_k, v = _masked_features(k, v, key_mask)
    size = min(chunk, length)
    n_chunks = -(-length // size)
    pad = n_chunks * size - length  # padded positions are zero keys: they add nothing

    def chunks(x: Tensor) -> Tensor:
        return F.pad(x, (0, 0, 0, pad)).view(batch, heads, n_chunks, size, x.shape[-1])  # (B, H, nc, C, E)

    qc, kc, vc = chunks(phi_q), chunks(phi_k), chunks(v)
    kv = kc.transpose(-1, -2) @ vc  # (B, H, nc, D, Dv): each chunk's sum of phi(k) v^T
    ksum = kc.sum(dim=3)  # (B, H, nc, D)
    s_before = s0[:, :, None] + kv.cumsum(dim=2) - kv  # state at each chunk's start (exclusive prefix sum)
    z_before = z0[:, :, None] + ksum.cumsum(dim=2) - ksum
    within = (qc @ kc.transpose(-1, -2)).tril()  # (B, H, nc, C, C): phi(q_i) . phi(k_j) for j <= i in the chunk
    numerator = qc @ s_before + within @ vc  # (B, H, nc, C, Dv)
    denominator = qc @ z_before[..., None] + within.sum(dim=-1, keepdim=True)  # (B, H, nc, C, 1)
    out = _normalise(numerator, denominator).reshape(batch, heads, n_chunks * size, dim_v)[:, :, :length]
    return out, s_before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + ksum[:, :, -1]


def linear_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_mask: Tensor | None = None
) -> Tensor:
    """The naive quadratic formula ``(A v) / (A 1)`` with ``A_ij = phi(q_i) . phi(k_j)``: the tests' reference."""
    k, v = repeat_kv(k, v, q.shape[1])
    scores = feature_map(q) @ feature_map(k).transpose(-1, -2)  # (B, H, T, S)
    if causal:
        q_len, k_len = q.shape[2], k.shape[2]
        scores = scores * torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
    if key_mask is not None:
        scores = scores * key_mask[:, None, None, :]
    return _normalise(scores @ v, scores.sum(dim=-1, keepdim=True))


class LinearAttentionState:
    """The recurrent state of one causal linear-attention layer: ``S (B, H, D, Dv)`` and ``z (B, H, D)``.

    It replaces the KV cache: its size does not depend on how many tokens were seen. ``length``
    counts the positions processed (the position of the next token).
    """

    def __init__(self) -> None:
        self.state: tuple[Tensor, Tensor] | None = None
        self.length = 0

    @property
    def filled(self) -> bool:
        return self.state is not None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self.state is not None:
            self.state = (self.state[0].index_select(0, index), self.state[1].index_select(0, index))
