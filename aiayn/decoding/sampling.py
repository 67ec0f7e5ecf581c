"""Choosing the next token: the generation settings, logits -> probabilities, and sampling.

gpt-fast style: each piece is a small function (``logits_to_probs``, ``sample``), and
:func:`next_token` composes them with the processors of :mod:`aiayn.decoding.processors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.decoding.processors import (
    apply_repetition_penalty,
    apply_temperature,
    block_repeated_ngrams,
    suppress_tokens,
    top_k_filter,
    top_p_filter,
)
from aiayn.decoding.protocol import DecodeState
from aiayn.tokenization.special import EOS_ID, PAD_ID
from aiayn.validation import is_int, rule

__all__ = ["GenerationConfig", "logits_to_probs", "sample", "next_token"]


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """Settings of greedy decoding and sampling; every field is validated at construction.

    ``max_new_tokens``: tokens each row may generate (EOS included); ``None`` = source length + 50
    for an encoder-decoder (section 6.1), required for a decoder-only model.
    ``min_new_tokens``: EOS is forbidden until a row has generated this many tokens.
    ``greedy``: take the most likely token (temperature, top-k and top-p are then ignored).
    ``temperature``, ``top_k``, ``top_p``: reshape the distribution before sampling.
    ``repetition_penalty``: > 1 makes tokens already in the sequence less likely (CTRL).
    ``no_repeat_ngram_size``: > 0 forbids repeating any n-gram of the sequence (prompt included).
    ``stop_strings``: a row stops once its generated text contains one (needs a detokenizer).
    ``eos_id``: a row stops after emitting it (``None``: never). ``pad_id`` fills finished rows.
    """

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop_strings: tuple[str, ...] = field(default=())
    eos_id: int | None = EOS_ID
    pad_id: int = PAD_ID

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            rule(is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be an integer >= 1 or None")
        rule(is_int(self.min_new_tokens) and self.min_new_tokens >= 0, "min_new_tokens", self.min_new_tokens, "must be an integer >= 0")
        if self.max_new_tokens is not None:
            rule(self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", self.min_new_tokens, f"must be <= max_new_tokens={self.max_new_tokens}")
        rule(self.temperature > 0, "temperature", self.temperature, "must be > 0 (for temperature 0 set greedy=True)")
        if self.top_k is not None:
            rule(is_int(self.top_k) and self.top_k >= 1, "top_k", self.top_k, "must be an integer >= 1 or None")
        if self.top_p is not None:
            rule(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1] or None")
        rule(self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "must be > 0 (1 = no penalty)")
        rule(is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size", self.no_repeat_ngram_size, "must be an integer >= 0 (0 = off)")
        rule(isinstance(self.stop_strings, tuple) and all(isinstance(s, str) and s for s in self.stop_strings),
              "stop_strings", self.stop_strings, "must be a tuple of non-empty strings")
        if self.eos_id is not None:
            rule(is_int(self.eos_id) and self.eos_id >= 0, "eos_id", self.eos_id, "must be an integer >= 0 or None")
        rule(is_int(self.pad_id) and self.pad_id >= 0, "pad_id", self.pad_id, "must be an integer >= 0")


def logits_to_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """``logits (B, V)`` -> probabilities ``(B, V)`` after temperature, top-k and top-p (in that order)."""
    logits = apply_temperature(logits.float(), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits.softmax(dim=-1)


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row from ``probs (B, V)``; the same ``generator`` state gives the same tokens.

    The exponential race (gpt-fast): ``argmax(p / E)`` with ``E ~ Exp(1)`` picks token ``i`` with
    probability ``p_i``. It uses one draw per (row, token) whatever the probabilities, so a row's
    sample never depends on the other rows (a finished row does not shift its neighbours' draws).
    """
    race = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0, generator=generator)
    return (probs.float() / race).argmax(dim=-1)  # (B,)


def next_token(
    logits: Tensor, state: DecodeState, n_generated: Tensor, config: GenerationConfig, generator: torch.Generator | None = None
) -> Tensor:
    """The token ``(B,)`` each row emits next, from ``logits (B, V)``.

    ``state.tokens``/``state.mask`` are the history for the penalties; ``n_generated (B,)`` counts
    each row's tokens so far (for ``min_new_tokens``).
    """
    logits = logits.float()
    if config.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, state.tokens, state.mask, config.repetition_penalty)
    if config.no_repeat_ngram_size:
        logits = block_repeated_ngrams(logits, state.tokens, state.mask, config.no_repeat_ngram_size)
    if config.min_new_tokens and config.eos_id is not None:
        logits = suppress_tokens(logits, [config.eos_id], rows=n_generated < config.min_new_tokens)
    if config.greedy:
        return logits.argmax(dim=-1)
    return sample(logits_to_probs(logits, config.temperature, config.top_k, config.top_p), generator)

