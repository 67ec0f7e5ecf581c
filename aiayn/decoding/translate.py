"""The one path from sentences to translations: encode, batch by length, beam search, back in input order.

``aiayn translate``, ``aiayn evaluate``, the demo and ``aiayn.load(...).translate`` all go through
:func:`translate_sentences`. The special ids (BOS, EOS, pad) are the tokenizers' own, so a pretrained
model's (Marian starts from its pad) works as ours does.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from tqdm import tqdm

from aiayn.decoding.beam import BeamConfig, Hypothesis, beam_search
from aiayn.decoding.ensemble import ensemble
from aiayn.decoding.protocol import right_pad
from aiayn.decoding.text import beam_config, pad_id, seq2seq_decoder, source_ids
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tokenization.base import Tokenizer

__all__ = ["translate_sentences"]


@torch.no_grad()
def translate_sentences(
    models: Sequence[EncoderDecoder],
    src_tokenizer: Tokenizer,
    sources: Sequence[str],
    beam: BeamConfig,
    *,
    tgt_tokenizer: Tokenizer | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """The ``beam.n_best`` hypotheses of each source, in input order (one model, or an ensemble of several).

    Sources are encoded as in training (text + EOS, or an import's template) and decoded in batches of
    similar length, which wastes less work on padding. An empty (or all-blank) source is not decoded:
    its list is empty. ``tgt_tokenizer`` (default: ``src_tokenizer``, a shared vocabulary) gives the
    decoder's BOS and the beam's EOS and pad. ``progress``: a tqdm bar (stderr) counting sentences.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not models:
        raise ValueError("no model to translate with: the ensemble is empty")
    tgt_tokenizer = src_tokenizer if tgt_tokenizer is None else tgt_tokenizer
    ends = beam_config(tgt_tokenizer)  # the target tokenizer's EOS and pad
    beam = dataclasses.replace(beam, eos_id=ends.eos_id, pad_id=ends.pad_id)
    for model in models:
        model.eval()
    decoder = ensemble([seq2seq_decoder(m, tgt_tokenizer) for m in models])
    out: list[list[Hypothesis]] = [[] for _ in sources]
    encoded = {i: source_ids(src_tokenizer, text) for i, text in enumerate(sources) if text.strip()}
    order = sorted(encoded, key=lambda i: len(encoded[i]))
    device = next(models[0].parameters()).device
    src_pad = pad_id(src_tokenizer)
    with tqdm(total=len(order), desc="translating", unit="sent", disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = right_pad([encoded[i] for i in chunk], src_pad, device=device)
            for i, hypotheses in zip(chunk, beam_search(decoder, ids, mask, beam)):
                out[i] = hypotheses
            bar.update(len(chunk))
    return out
