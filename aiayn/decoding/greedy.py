"""Greedy decoding: the most likely token at every step, for any :class:`~aiayn.decoding.protocol.Decoder`."""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.decoding.generation import Generation, generate
from aiayn.decoding.protocol import Decoder
from aiayn.decoding.sampling import GenerationConfig
from aiayn.tokenization.special import EOS_ID, PAD_ID

__all__ = ["greedy"]


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
