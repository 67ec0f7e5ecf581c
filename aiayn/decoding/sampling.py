"""Choosing the next token: the generation settings, logits -> probabilities, and sampling.

gpt-fast style: each piece is a small function (``logits_to_probs``, ``sample``), and
:func:`next_token` composes them with the processors of :mod:`aiayn.decoding.processors`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.decoding.processors import (
    add_logit_bias,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    apply_temperature,
    block_repeated_ngrams,
    min_p_filter,
    suppress_tokens,
    top_k_filter,
    top_p_filter,
)
from aiayn.decoding.protocol import DecodeState
from aiayn.inference import gemv
from aiayn.tokenization.special import EOS_ID, PAD_ID
from aiayn.validation import is_int, is_number, rule

__all__ = ["GenerationConfig", "MAX_TEMPERATURE", "argmax_last", "remember_argmax", "logits_to_probs", "sample", "next_token", "next_token_probs", "processed_logits"]

MAX_TEMPERATURE = 100.0  # above it every distribution is uniform to float precision: surely a typo


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
    ``presence_penalty``, ``frequency_penalty``: OpenAI's, in [-2, 2], over the generated tokens.
    ``min_p``: keep the tokens at least ``min_p`` times as likely as the most likely one.
    ``logit_bias``: ``(token id, bias)`` pairs added to the logits first (OpenAI's field).
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_strings: tuple[str, ...] = field(default=())
    eos_id: int | None = EOS_ID
    pad_id: int = PAD_ID

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            rule(is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be an integer >= 1 or None")
        rule(is_int(self.min_new_tokens) and self.min_new_tokens >= 0, "min_new_tokens", self.min_new_tokens, "must be an integer >= 0")
        if self.max_new_tokens is not None:
            rule(self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", self.min_new_tokens, f"must be <= max_new_tokens={self.max_new_tokens}")
        # The one check of the sampling settings: the CLI, aiayn.load(...).generate and the server all build this config.
        rule(is_number(self.temperature) and 0 < self.temperature <= MAX_TEMPERATURE, "temperature", self.temperature,
             f"must be a finite number in (0, {MAX_TEMPERATURE:g}] (for temperature 0 use greedy decoding)")
        if self.top_k is not None:
            rule(is_int(self.top_k) and self.top_k >= 1, "top_k", self.top_k, "must be an integer >= 1 or None")
        if self.top_p is not None:
            rule(is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be a finite number in (0, 1] or None")
        rule(is_number(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "must be > 0 (1 = no penalty)")
        rule(is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size", self.no_repeat_ngram_size, "must be an integer >= 0 (0 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            rule(is_number(value) and -2.0 <= value <= 2.0, name, value, "must be a finite number in [-2, 2] (0 = off)")
        if self.min_p is not None:
            rule(is_number(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "must be in [0, 1] or None")
        rule(isinstance(self.logit_bias, tuple) and all(is_int(t) and t >= 0 and is_number(b) for t, b in self.logit_bias),
             "logit_bias", self.logit_bias, "must be a tuple of (token id >= 0, finite bias) pairs")
        rule(isinstance(self.stop_strings, tuple) and all(isinstance(s, str) and s for s in self.stop_strings),
              "stop_strings", self.stop_strings, "must be a tuple of non-empty strings")
        if self.eos_id is not None:
            rule(is_int(self.eos_id) and self.eos_id >= 0, "eos_id", self.eos_id, "must be an integer >= 0 or None")
        rule(is_int(self.pad_id) and self.pad_id >= 0, "pad_id", self.pad_id, "must be an integer >= 0")

    @property
    def changes_logits(self) -> bool:
        """Whether :func:`processed_logits` changes anything: a logit bias, a penalty, the n-gram block or ``min_new_tokens``."""
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.no_repeat_ngram_size or (self.min_new_tokens and self.eos_id is not None))


def logits_to_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, min_p: float | None = None
) -> Tensor:
    """``logits (B, V)`` -> probabilities ``(B, V)`` after temperature, top-k, top-p and min-p (in that order)."""
    # float64, shifted so that the most likely logit is 0: a tiny temperature sends the others to -inf
    # (not the largest to inf, and inf - inf = NaN), and top_p's comparison of a cumulative sum with p
    # is exact, so the filters always keep the most likely token.
    logits = logits.double()
    peak = logits.amax(dim=-1, keepdim=True)
    logits = apply_temperature(logits - torch.where(peak.isfinite(), peak, 0.0), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return logits.softmax(dim=-1).float()  # float32: only the filters needed float64


# The argmax the C++ decoding step made of the logits it returned (aiayn.decoding.native_step), kept for greedy's pick:
# (the logits, their version counter then, the picks). Only these very logits, unchanged since, take it.
_REMEMBERED: tuple[weakref.ref[Tensor], int, Tensor] | None = None


def remember_argmax(scores: Tensor, best: Tensor) -> None:
    """Keep ``best (B,)``, the argmax of each row of ``scores (B, V)``, for :func:`argmax_last` of these same ``scores``
    (not a copy, not after an in-place change)."""
    global _REMEMBERED
    _REMEMBERED = (weakref.ref(scores), scores._version, best)


def argmax_last(scores: Tensor) -> Tensor:
    """``scores.argmax(dim=-1)``: the index of the largest of ``scores (B, V)`` in each row ``(B,)``, the first on ties
    (NaN counts as largest). On the CPU, through our two-pass kernel where the native library is loaded (after a token's
    weights have streamed through the caches, torch's reduction took 106-182 us of a token on a Zen 4 EPYC, ours 14:
    ``aiayn/inference/argmax.cpp``), else through ``max``, which takes a quarter to half of argmax's time
    over a 50257-word vocabulary (fp32 26 against 73 us, bf16 41 against 184 us, on an AMX Xeon; docs/benchmarks.md)."""
    remembered = _REMEMBERED
    if remembered is not None and remembered[0]() is scores and scores._version == remembered[1]:
        return remembered[2]
    if (scores.dtype in (torch.float32, torch.bfloat16) and scores.dim() == 2 and scores.shape[1] and scores.device.type == "cpu"
            and not torch.compiler.is_compiling() and gemv.loaded()):
        return gemv.argmax_last(scores)
    return scores.max(dim=-1).indices


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row from ``probs (B, V)``; the same ``generator`` state gives the same tokens.

    The exponential race (gpt-fast): ``argmax(p / E)`` with ``E ~ Exp(1)`` picks token ``i`` with
    probability ``p_i``. It uses one draw per (row, token) whatever the probabilities, so a row's
    sample never depends on the other rows (a finished row does not shift its neighbours' draws).
    """
    race = torch.empty_like(probs, dtype=torch.float32).exponential_(1.0, generator=generator)
    race = race.clamp_min(torch.finfo(torch.float32).tiny)  # a draw of 0 would make 0 / 0 = NaN of a removed token
    return argmax_last(probs / race)  # (B,)


def next_token(
    logits: Tensor, state: DecodeState, n_generated: Tensor, config: GenerationConfig, generator: torch.Generator | None = None
) -> Tensor:
    """The token ``(B,)`` each row emits next, from ``logits (B, V)``.

    ``state.tokens``/``state.mask`` are the history for the penalties; ``n_generated (B,)`` counts
    each row's tokens so far (for ``min_new_tokens``).
    """
    logits = processed_logits(logits, state, n_generated, config)
    if config.greedy:
        return argmax_last(logits)
    return sample(logits_to_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p), generator)


def next_token_probs(logits: Tensor, state: DecodeState, n_generated: Tensor, config: GenerationConfig) -> Tensor:
    """The distribution ``(B, V)`` that :func:`next_token` samples from (speculative decoding's target ``p``)."""
    logits = processed_logits(logits, state, n_generated, config)
    return logits_to_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p)


def processed_logits(logits: Tensor, state: DecodeState, n_generated: Tensor, config: GenerationConfig) -> Tensor:
    """``logits (B, V)`` after the logit bias, the penalties, the n-gram block and ``min_new_tokens``, in fp32; as they are
    where none applies (greedy's argmax and :func:`logits_to_probs` take bf16 as they are: a bf16 model's step then copies
    no 50k logits to fp32, and its own argmax of them is kept for greedy's pick, :func:`remember_argmax`)."""
    if not config.changes_logits:
        return logits
    logits = add_logit_bias(logits.float(), config.logit_bias)
    if config.presence_penalty or config.frequency_penalty:
        logits = apply_presence_frequency_penalties(logits, state.tokens, n_generated, config.presence_penalty, config.frequency_penalty)
    if config.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, state.tokens, state.mask, config.repetition_penalty)
    if config.no_repeat_ngram_size:
        logits = block_repeated_ngrams(logits, state.tokens, state.mask, config.no_repeat_ngram_size)
    if config.min_new_tokens and config.eos_id is not None:
        logits = suppress_tokens(logits, [config.eos_id], rows=n_generated < config.min_new_tokens)
    return logits

