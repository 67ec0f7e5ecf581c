"""The small protocol every decoding strategy talks to, whatever the model family.

A :class:`Decoder` turns a batch of inputs into next-token logits, one step at a time:

* ``start(ids, mask, max_new_tokens=)`` does the per-input work once (encode the source, or run
  the prompt through the decoder: the prefill) and returns the state and the logits ``(B, V)``
  for the first new token;
* ``step(tokens, state)`` feeds one chosen token per row ``(B,)`` and returns the logits for the next;
* ``reorder(state, index)`` keeps, repeats or permutes rows (beam search grows B rows into B*K
  beams, then reorders them every step).

Strategies (greedy, sampling, beam search) only see this protocol, so they work unchanged for the
encoder-decoder and the decoder-only families (see :mod:`aiayn.decoding.adapters`) and for fakes in tests.
Masks follow :mod:`aiayn.nn.masks`: bool, ``True`` = real token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from torch import Tensor

from aiayn.nn.cache import KVCache
from aiayn.tokenization.special import PAD_ID

__all__ = ["Decoder", "DecodeState", "left_pad", "right_pad", "SOURCE_EXTRA_TOKENS"]

# Section 6.1: "we set the maximum output length during inference to input length + 50".
SOURCE_EXTRA_TOKENS = 50


@dataclass
class DecodeState:
    """What a decoder carries between steps. Rows are batch rows (or beams).

    ``tokens (B, L)`` / ``mask (B, L)``: the decoder-side sequence so far, its prefix (BOS, or the
    left-padded prompt) and every token fed since; ``mask`` is ``False`` at left padding.
    ``max_new_tokens (B,)``: how many tokens each row may generate.
    ``cache``: the KV cache (``None`` when decoding without one). ``memory (B, S, D)`` and
    ``memory_mask (B, S)``: the encoder output and its padding (encoder-decoder only).
    ``pads (B,)``: left-padding columns per row, so column ``c`` of row ``b`` is position ``c - pads[b]``.
    """

    tokens: Tensor
    mask: Tensor
    max_new_tokens: Tensor
    pads: Tensor
    cache: KVCache | None = None
    memory: Tensor | None = None
    memory_mask: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def append(self, tokens: Tensor) -> None:
        """Record one fed token per row, ``tokens (B,)``."""
        self.tokens = torch.cat([self.tokens, tokens[:, None]], dim=1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)

    def crop(self, length: int) -> None:
        """Keep the first ``length`` columns of the sequence and the cache (speculative decoding's rollback)."""
        self.tokens, self.mask = self.tokens[:, :length], self.mask[:, :length]
        if self.cache is not None:
            self.cache.crop(length)

    def select(self, index: Tensor, *, same_sources: bool = False) -> None:
        """Keep rows ``index`` of every per-row field (the cache included).

        ``same_sources``: the caller promises that each row is replaced by a row of the same source
        (beam search, after the first expansion); what depends on the source only (the encoder
        output, its mask, the cross-attention keys and values) is then the same and is kept as is."""
        self.tokens = self.tokens.index_select(0, index)
        self.mask = self.mask.index_select(0, index)
        self.max_new_tokens = self.max_new_tokens.index_select(0, index)
        self.pads = self.pads.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index, self_only=same_sources)
        if same_sources:
            return
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)


class Decoder(Protocol):
    """Anything that gives next-token logits for a batch, step by step (see the module docstring)."""

    @property
    def vocab_size(self) -> int: ...

    def start(
        self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None
    ) -> tuple[DecodeState, Tensor]:
        """``ids (B, S|P)`` source or prompt -> ``(state, logits (B, V))`` for the first new token."""
        ...

    def step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        """Feed ``tokens (B,)``; return the logits ``(B, V)`` for the next token."""
        ...

    def reorder(self, state: DecodeState, index: Tensor, *, same_sources: bool = False) -> None:
        """Keep rows ``index (B',)`` of ``state``, in that order (repeats allowed); ``same_sources``: see
        :meth:`DecodeState.select`."""
        ...


def left_pad(rows: Sequence[Sequence[int]], pad_id: int = PAD_ID, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Prompts of different lengths -> ``(ids (B, P), mask (B, P))`` padded on the left.

    Left padding puts every row's last prompt token in the last column, so all rows start
    generating at the same step. Raises ``ValueError`` for no rows or an empty row.
    """
    return _pad(rows, pad_id, device, left=True)


def right_pad(rows: Sequence[Sequence[int]], pad_id: int = PAD_ID, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Sources of different lengths -> ``(ids (B, S), mask (B, S))`` padded on the right."""
    return _pad(rows, pad_id, device, left=False)


def _pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None, left: bool) -> tuple[Tensor, Tensor]:
    if len(rows) == 0:
        raise ValueError("rows is empty: nothing to decode")
    for i, row in enumerate(rows):
        if len(row) == 0:
            raise ValueError(f"rows[{i}] is empty: every row needs at least one token")
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, cols] = torch.as_tensor(list(row), dtype=torch.long)
        mask[i, cols] = True
    return ids, mask
