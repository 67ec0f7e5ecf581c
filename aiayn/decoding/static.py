"""Decoder-only decoding over a static KV cache, split gpt-fast style into :func:`prefill` and
:func:`decode_one` (one token per row), with an option to ``torch.compile`` the one-token step.

Every step has the same shapes: the cache is preallocated for prompt + new tokens, a step writes
its keys/values at a column held in a tensor, and a boolean mask over all columns hides those not
written yet. So one compiled graph serves every step, and a step reads nothing back to the host.
Runs that do not fit the learned positions (generation past ``max_len``) and ALiBi models take the
general :class:`~aiayn.decoding.adapters.CausalLMDecoder` (its sliding window, its dynamic cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decoding.adapters import (
    CausalLMDecoder,
    _check_max_new,
    _device,
    _inputs,
    _warn_if_training,
)
from aiayn.decoding.protocol import DecodeState
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.cache import StaticKVCache
from aiayn.nn.positional import LearnedPositions, SinusoidalPositions

__all__ = ["StaticCausalLMDecoder", "StaticState", "decode_one", "prefill"]

log = logging.getLogger(__name__)


@dataclass
class StaticState(DecodeState):
    """A :class:`DecodeState` plus ``key_mask (B, S_max)`` (``False`` at left padding) and ``column (1,)``,
    the cache column of the next token (a tensor updated in place, so compiled steps never recompile)."""

    key_mask: Tensor | None = None
    column: Tensor | None = None

    def select(self, index: Tensor, *, same_sources: bool = False) -> None:
        super().select(index, same_sources=same_sources)
        self.key_mask = self.key_mask.index_select(0, index)  # type: ignore[union-attr]


def prefill(model: DecoderOnly, ids: Tensor, cache: StaticKVCache, offset: Tensor, key_mask: Tensor) -> Tensor:
    """Run the prompt ``ids (B, P)`` into columns ``0..P-1`` of ``cache``; return the last logits ``(B, V)``.

    ``offset (B,)``: the position of column 0 in each row (``-pads``); ``key_mask (B, S_max)``: real columns.
    """
    columns = torch.arange(ids.shape[1], device=ids.device)  # (P,)
    cache.set_write_columns(columns)
    visible = key_mask[:, None, :] & (torch.arange(key_mask.shape[1], device=ids.device)[None, :] <= columns[:, None])  # (B, P, S)
    return _forward(model, ids, cache, offset, visible[:, None])  # mask (B, 1, P, S)


def decode_one(model: DecoderOnly, tokens: Tensor, cache: StaticKVCache, column: Tensor, offset: Tensor, key_mask: Tensor) -> Tensor:
    """Feed ``tokens (B, 1)`` at cache column ``column (1,)`` (rows at positions ``offset (B,)``); logits ``(B, V)``.

    The cache's write columns must already be ``column`` (:class:`StaticCausalLMDecoder` sets it once).
    """
    visible = key_mask & (torch.arange(key_mask.shape[1], device=tokens.device) <= column)  # (B, S)
    return _forward(model, tokens, cache, offset, visible[:, None, None, :])  # mask (B, 1, 1, S)


def _forward(model: DecoderOnly, ids: Tensor, cache: StaticKVCache, offset: Tensor, mask: Tensor) -> Tensor:
    x = model.positions.embed(model.embed(ids), offset)  # (B, T, D); no dropout: eval only
    x, _ = model.decoder(x, mask=mask, cache=cache, offset=offset)
    return model.output(x[:, -1])  # (B, V): only the last position is needed


class StaticCausalLMDecoder:
    """The :class:`~aiayn.decoding.protocol.Decoder` of a :class:`DecoderOnly` over a static cache.

    ``compile=True`` compiles :func:`decode_one` with ``torch.compile(fullgraph=True, dynamic=False)``
    (the first steps of a new batch shape pay for compilation). Token ids fed to ``step`` are not
    range-checked: they are the model's own outputs.
    """

    def __init__(self, model: DecoderOnly, *, compile: bool = False) -> None:
        _warn_if_training(model)
        self.model, self.compiled = model, compile
        self._general = CausalLMDecoder(model)
        self._alibi = model.positions.kind == "alibi"
        self._step: Callable[..., Tensor] = decode_one
        if compile:
            if self._alibi:
                raise ValueError("compile=True needs positions learned, sinusoidal, rotary or none (the static "
                                 "cache), got positions='alibi'; decode ALiBi models without compile")
            self._step = torch.compile(decode_one, fullgraph=True, dynamic=False)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @torch.no_grad()
    def start(self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None) -> tuple[DecodeState, Tensor]:
        """Prefill ``ids (B, P)`` (left-padded, ``mask`` ``True`` = real); see :meth:`CausalLMDecoder.start`."""
        model = self.model
        if max_new_tokens is None or self._alibi:
            return self._general.start(ids, mask, max_new_tokens=max_new_tokens)
        _check_max_new(max_new_tokens, None, "")
        ids, mask = _inputs(ids, mask, model.config.pad_id, _device(model), "prompt")
        batch, prompt_len = ids.shape
        total = prompt_len + max_new_tokens
        positions = model.positions
        if isinstance(positions, LearnedPositions) and total > positions.max_len:
            log.debug("static cache: %d columns exceed max_len=%d, using the sliding window", total, positions.max_len)
            return self._general.start(ids, mask, max_new_tokens=max_new_tokens)
        if mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        elif prompt_len > 1 and not bool((mask[:, 1:] >= mask[:, :-1]).all()):
            raise ValueError("prompts must be left-padded (mask False only before a row's first token); use left_pad()")
        if isinstance(positions, SinusoidalPositions):
            positions.embed(positions.table.new_zeros(1, 1, positions.d_model), total - 1)  # grow the table now, not in a graph
        config = model.config
        weight = model.embed.weight
        cache = StaticKVCache(config.n_layers, batch, config.n_kv_heads or config.n_heads, total, config.head_dim,
                              dtype=weight.dtype, device=weight.device)
        key_mask = torch.ones(batch, total, dtype=torch.bool, device=ids.device)
        key_mask[:, :prompt_len] = mask
        pads = (~mask).sum(dim=1)  # (B,)
        state = StaticState(
            tokens=ids, mask=mask, max_new_tokens=torch.full((batch,), max_new_tokens, device=ids.device), pads=pads,
            cache=cache, key_mask=key_mask, column=torch.full((1,), prompt_len, dtype=torch.long, device=ids.device),  # type: ignore[arg-type]
        )
        logits = prefill(model, ids, cache, -pads, key_mask)
        cache.set_write_columns(state.column)  # type: ignore[arg-type]  # the same tensor every step
        return state, logits

    @torch.no_grad()
    def step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        if not isinstance(state, StaticState):
            return self._general.step(tokens, state)
        state.append(tokens)  # the history, for repetition penalties and stop strings
        column = state.column
        if column is None:
            raise ValueError("state has no cache column: start() it with this decoder")
        logits = self._step(self.model, tokens[:, None], state.cache, column, column - state.pads, state.key_mask)
        column.add_(1)  # in place: the cache's write columns follow
        return logits

    def reorder(self, state: DecodeState, index: Tensor, *, same_sources: bool = False) -> None:
        state.select(index, same_sources=same_sources)
