"""Logits processors: small functions ``logits (B, V) -> logits (B, V)`` that decoding strategies compose.

A removed token gets ``-inf``. ``history (B, L)`` is the decoder-side sequence so far (the prompt
or BOS, then the generated tokens) with ``history_mask (B, L)``, ``True`` = real token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "apply_repetition_penalty",
    "block_repeated_ngrams",
    "suppress_tokens",
    "add_logit_bias",
    "apply_presence_frequency_penalties",
    "min_p_filter",
]

NEG_INF = float("-inf")


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """``logits / temperature``: below 1 sharpens the distribution, above 1 flattens it. Raises for ``<= 0``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use greedy decoding for temperature 0), got {temperature}")
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties with the k-th are kept too)."""
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    k = min(k, logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most likely tokens whose
    probabilities sum to at least ``p``; the most likely token is always kept."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
    drop_sorted = before >= p  # the set already reached p without this token
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, NEG_INF)


def apply_repetition_penalty(logits: Tensor, history: Tensor, history_mask: Tensor | None, penalty: float) -> Tensor:
    """CTRL's penalty (Keskar et al., 2019): for each token already in ``history``, divide a positive
    logit by ``penalty`` and multiply a negative one by it, so the token always becomes less likely."""
    if penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
    seen = _seen(history, history_mask, logits.shape[-1])  # (B, V)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def block_repeated_ngrams(logits: Tensor, history: Tensor, history_mask: Tensor | None, n: int) -> Tensor:
    """Forbid every token that would complete an ``n``-gram already present in ``history``."""
    if n < 1:
        raise ValueError(f"no_repeat_ngram_size must be >= 1, got {n}")
    batch, length = history.shape
    if length < n - 1 or length < 1:
        return logits
    if n == 1:
        return logits.masked_fill(_seen(history, history_mask, logits.shape[-1]), NEG_INF)
    mask = history_mask if history_mask is not None else torch.ones_like(history, dtype=torch.bool)
    grams = history.unfold(1, n, 1)  # (B, L-n+1, n): every n-gram so far
    real = mask.unfold(1, n, 1).all(dim=-1)  # (B, L-n+1): n-grams of real tokens only
    tail = history[:, length - (n - 1):]  # (B, n-1): what the next token would extend
    matches = (grams[:, :, :-1] == tail[:, None, :]).all(dim=-1) & real  # (B, L-n+1)
    counts = torch.zeros(logits.shape, dtype=torch.long, device=logits.device)
    counts.scatter_add_(-1, grams[:, :, -1], matches.long())
    return logits.masked_fill(counts > 0, NEG_INF)


def suppress_tokens(logits: Tensor, token_ids: Sequence[int], rows: Tensor | None = None) -> Tensor:
    """Forbid ``token_ids`` in every row, or only where ``rows (B,)`` is ``True`` (e.g. EOS before min length)."""
    if not token_ids:
        return logits
    banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    banned[list(token_ids)] = True
    where = banned[None, :] if rows is None else banned[None, :] & rows[:, None]  # (1|B, V)
    return logits.masked_fill(where, NEG_INF)


def add_logit_bias(logits: Tensor, bias: Sequence[tuple[int, float]]) -> Tensor:
    """OpenAI's ``logit_bias``: add ``bias`` to the logit of each ``(token id, bias)`` pair, in every row
    (-100 bans a token in practice, +100 all but forces it)."""
    if not bias:
        return logits
    ids = torch.tensor([t for t, _ in bias], dtype=torch.long, device=logits.device)
    values = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)
    return logits.index_add(-1, ids, values.expand(logits.shape[0], -1))


def apply_presence_frequency_penalties(logits: Tensor, history: Tensor, n_generated: Tensor, presence: float, frequency: float) -> Tensor:
    """OpenAI's penalties over the generated tokens only (the last ``n_generated (B,)`` columns of
    ``history (B, L)``): ``logit[j] -= frequency * count[j] + presence * (count[j] > 0)``."""
    length = history.shape[1]
    generated = torch.arange(length, device=history.device)[None, :] >= length - n_generated[:, None]  # (B, L)
    counts = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)
    counts.scatter_add_(-1, history, generated.to(logits.dtype))
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Min-p sampling (Nguyen et al., 2024): drop the tokens whose probability is below ``min_p`` times
    the most likely token's; the most likely token is always kept."""
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), NEG_INF)


def _seen(history: Tensor, history_mask: Tensor | None, vocab_size: int) -> Tensor:
    """``(B, V)`` bool: which tokens occur among the real tokens of each row."""
    counts = torch.zeros(history.shape[0], vocab_size, dtype=torch.long, device=history.device)
    weight = history_mask.long() if history_mask is not None else torch.ones_like(history)
    counts.scatter_add_(-1, history, weight)
    return counts > 0
