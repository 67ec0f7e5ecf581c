"""Greedy decoding: the most likely token at every step, for any :class:`~aiayn.decoding.protocol.Decoder`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.decoding.adapters import Seq2SeqDecoder
from aiayn.decoding.generation import Generation, generate
from aiayn.decoding.protocol import Decoder
from aiayn.decoding.sampling import GenerationConfig
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tokenization.special import BOS_ID, EOS_ID, PAD_ID

__all__ = ["greedy", "greedy_decode"]


def greedy(
    decoder: Decoder | nn.Module,
    ids: Tensor,
    mask: Tensor | None = None,
    *,
    max_new_tokens: int | None = None,
    min_new_tokens: int = 0,
    eos_id: int | None = EOS_ID,
    pad_id: int = PAD_ID,
) -> Generation:
    """Greedy decoding of a batch: ``ids (B, L)`` source or left-padded prompt, ``mask`` ``True`` = real.

    ``max_new_tokens``: ``None`` = source length + 50 (encoder-decoder only). See :func:`generate`.
    """
    config = GenerationConfig(
        greedy=True, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, eos_id=eos_id, pad_id=pad_id
    )
    return generate(decoder, ids, mask, config)


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len: int,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
) -> Tensor:
    """Translate ``src (B, S)`` greedily, up to ``max_len`` tokens (the copy task's entry point).

    Returns ``(B, L)`` token ids without the leading BOS; a row that emitted EOS is padded with
    ``pad_id`` after it. ``src_mask``: bool ``(B, S)``, ``True`` = real token (default: ``src != pad_id``).
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    decoder = Seq2SeqDecoder(model, bos_id=bos_id)
    return greedy(decoder, src, src_mask, max_new_tokens=max_len, eos_id=eos_id, pad_id=pad_id).tokens
