"""Greedy decoding for the encoder-decoder family, with the decoder's KV cache."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tokenization.special import BOS_ID, EOS_ID, PAD_ID

__all__ = ["greedy_decode"]


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
    """Translate ``src (B, S)`` by taking the most likely token at each step, up to ``max_len`` tokens.

    Returns ``(B, L)`` token ids without the leading BOS; a row that emitted EOS is padded with
    ``pad_id`` after it. ``src_mask``: bool ``(B, S)``, ``True`` = real token (default: ``src != pad_id``).
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if src_mask is None and model.config.pad_id is not None:
        src_mask = src != model.config.pad_id
    memory = model.encode(src, src_mask)  # (B, S, D), computed once
    cache = model.new_cache()
    token = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    steps = []
    for _ in range(max_len):
        logits = model.decode(token, memory, src_mask=src_mask, cache=cache)  # (B, 1, V)
        next_token = logits[:, -1].argmax(dim=-1)  # (B,)
        next_token = next_token.masked_fill(finished, pad_id)
        steps.append(next_token)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
        token = next_token[:, None]
    return torch.stack(steps, dim=1)
