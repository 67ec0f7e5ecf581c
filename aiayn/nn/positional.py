"""Position information, as modules with one interface (paper section 3.5 and its successors).

Self-attention alone is permutation-equivariant; each module here breaks that symmetry in one of
three places, and implements only its own hook (the others are identities):

* ``embed(x, offset)``: added to the token embeddings (sinusoidal, learned);
* ``rotate(q, k, offset)``: applied to queries and keys inside self-attention (rotary, RoPE);
* ``bias(q_len, k_len, offset)``: added to the attention scores (relative: ALiBi).

``offset`` is the position of the first element of ``x`` / ``q``: an ``int`` (the length of a KV
cache) or a ``(B,)`` tensor when rows start at different positions (left-padded prompts).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "PositionalEncoding",
    "NoPositions",
    "SinusoidalPositions",
    "LearnedPositions",
    "RotaryPositions",
    "ALiBiPositions",
    "POSITION_KINDS",
    "sinusoid_table",
    "position_ids",
]

POSITION_KINDS: tuple[str, ...] = ("sinusoidal", "learned", "rotary", "alibi", "none")


def position_ids(offset: int | Tensor, length: int, device: torch.device) -> Tensor:
    """Positions ``offset .. offset + length - 1`` as ``(1, length)`` or ``(B, length)`` (per-row offsets)."""
    steps = torch.arange(length, device=device)
    if isinstance(offset, Tensor):
        return offset.to(device)[:, None] + steps[None, :]  # (B, T)
    return (steps + offset)[None, :]  # (1, T)


def sinusoid_table(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The paper's table: PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(same).

    Sines at even and cosines at odd feature indices, interleaved, exactly as in section 3.5.
    Computed in float64 and returned as float32 ``(length, d_model)``.
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = pos / base ** (two_i / d_model)  # (L, ceil(d/2))
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Base class: every hook is an identity; a subclass overrides the one it uses."""

    kind = "none"

    def embed(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """``x (B, T, D)`` plus absolute positions, if this kind adds any."""
        return x

    def rotate(self, q: Tensor, k: Tensor, offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """Rotate ``q (B, H, T, Dh)`` and ``k (B, Hkv, T, Dh)`` by their positions, if this kind does."""
        return q, k

    def bias(self, q_len: int, k_len: int, offset: int | Tensor = 0, device: torch.device | None = None) -> Tensor | None:
        """Additive score bias ``(1|B, H, T, S)`` for queries at ``offset..`` over keys at ``0..S-1``."""
        return None


class NoPositions(PositionalEncoding):
    """No position information at all (for ablations and the permutation test)."""


class SinusoidalPositions(PositionalEncoding):
    """The paper's fixed sinusoids (section 3.5); grows its table on demand, so any length works."""

    kind = "sinusoidal"
    table: Tensor  # a buffer (L, D)

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        self.d_model = d_model
        # Not persistent: a pure function of the shape, so it stays out of checkpoints.
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def embed(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        end = 0 if torch.compiler.is_compiling() else _last_position(offset, x.shape[1]) + 1  # compiled: grown before
        if end > self.table.shape[0]:
            self.table = sinusoid_table(max(end, 2 * self.table.shape[0]), self.d_model).to(x.device)
        return x + _lookup(self.table, offset, x.shape[1]).to(x.dtype)


class LearnedPositions(PositionalEncoding):
    """A trained embedding per position (BERT, GPT-2); positions past ``max_len`` are an error."""

    kind = "learned"

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def embed(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        # A compiled graph cannot read the range back; the static decoder checks it before compiling.
        end = 0 if torch.compiler.is_compiling() else _last_position(offset, x.shape[1]) + 1
        if end > self.max_len:
            raise ValueError(
                f"sequence of length {end} is longer than the learned positions' max_len={self.max_len}"
            )
        return x + _lookup(self.weight, offset, x.shape[1]).to(x.dtype)


def _last_position(offset: int | Tensor, length: int) -> int:
    """The largest position a block of ``length`` starting at ``offset`` reaches (a host value)."""
    if isinstance(offset, Tensor):
        start = int(offset.max()) if offset.numel() else 0
    else:
        start = offset
    return start + length - 1


def _lookup(table: Tensor, offset: int | Tensor, length: int) -> Tensor:
    """Rows ``offset .. offset + length - 1`` of ``table`` as ``(1|B, T, D)``; negative positions read row 0."""
    if isinstance(offset, int):
        return table[offset : offset + length][None]
    return table[position_ids(offset, length, table.device).clamp_min(0)]


class RotaryPositions(PositionalEncoding):
    """RoPE (Su et al., 2021): rotate each pair of features of q and k by an angle pos * theta_i.

    The dot product of a rotated query and key then depends only on their distance. Pairs are the
    two halves of the head dimension (the GPT-NeoX / LLaMA layout).
    """

    inv_freq: Tensor  # a buffer (Dh/2,)

    kind = "rotary"

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head size, got head_dim={head_dim}")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        # cos and sin (1, 1, L, Dh) of positions 0 .. L - 1, grown on demand, and what they were computed from; not a buffer
        # (not saved, nothing to load): a decoding step then reads its angles instead of computing them (its ten
        # operators took 25 us of a small model's 0.35 ms token on a Zen 4 EPYC, 2026-12-07)
        self._table: tuple[Tensor, Tensor] | None = None
        self._table_of: tuple[object, ...] = ()

    def rotate(self, q: Tensor, k: Tensor, offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        cos, sin = self.angles(offset, q.shape[2], q.device)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def angles(self, offset: int | Tensor, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of each feature's angle at positions ``offset .. offset + length - 1``, fp32 ``(1|B, 1, T, Dh)``
        (the C++ decoding step rotates with them too: aiayn.decoding.native_step). Read from the table where its range
        can be read on the host (not in a compiled graph, not from an accelerator's offsets: that read would wait for
        the device), else computed; negative positions (left padding, masked) read position 0."""
        if torch.compiler.is_compiling() or (isinstance(offset, Tensor) and offset.device.type != "cpu"):
            return self._angles(position_ids(offset, length, device))
        if isinstance(offset, Tensor) and offset.numel() == 1:
            offset = int(offset)
        cos, sin = self._table_for(_last_position(offset, length) + 1, device)
        if isinstance(offset, int) and offset >= 0:
            return cos.narrow(2, offset, length), sin.narrow(2, offset, length)
        rows = position_ids(offset, length, device).clamp_min(0)  # (1|B, T)
        return cos[0, 0, rows][:, None], sin[0, 0, rows][:, None]

    def _angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` ``(1|B, 1, T, Dh)`` of ``positions (1|B, T)``, by the formula (the table holds its values)."""
        angle = positions.float()[..., None] * self.inv_freq  # (1|B, T, Dh/2)
        cos = torch.cat([angle.cos(), angle.cos()], dim=-1)[:, None]  # (1|B, 1, T, Dh)
        sin = torch.cat([angle.sin(), angle.sin()], dim=-1)[:, None]
        return cos, sin

    def _table_for(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The table ``(1, 1, L, Dh)`` of at least ``length`` positions on ``device`` (twice that, at least 256, when it
        grows), rebuilt when ``inv_freq`` changed (moved, cast or loaded)."""
        inv_freq = self.inv_freq
        of = (device, inv_freq.dtype, inv_freq.data_ptr(), inv_freq._version)
        if self._table is None or self._table_of != of or self._table[0].shape[2] < length:
            with torch.no_grad():
                self._table = self._angles(torch.arange(max(2 * length, 256), device=device)[None])
            self._table_of = of
        return self._table


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class ALiBiPositions(PositionalEncoding):
    """ALiBi (Press et al., 2022): score bias ``-slope_h * |i - j|``, one fixed slope per head.

    Our choice of relative position: no parameters, extrapolates past the training length, and
    works unchanged for bidirectional (encoder) and causal (decoder) attention.
    """

    slopes: Tensor  # a buffer (H,)

    kind = "alibi"

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def bias(self, q_len: int, k_len: int, offset: int | Tensor = 0, device: torch.device | None = None) -> Tensor:
        # Only distances matter, and the queries are the last q_len of the k_len keys (a KV cache), so the
        # bias needs no offset: per-row offsets (left padding) shift queries and keys alike.
        device = device if device is not None else self.slopes.device
        q_pos = torch.arange(k_len - q_len, k_len, device=device)  # (T,)
        k_pos = torch.arange(k_len, device=device)  # (S,)
        distance = (q_pos[:, None] - k_pos[None, :]).abs().float()  # (T, S)
        return -self.slopes.to(device)[None, :, None, None] * distance  # (1, H, T, S)


def alibi_slopes(n_heads: int) -> Tensor:
    """The geometric slopes of the ALiBi paper: 2^(-8/n), 2^(-16/n), ... (interleaved if n is not a power of 2)."""
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)
