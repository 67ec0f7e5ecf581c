"""The one path from sentences to translations: encode, batch by length, beam search, back in input order.

``aiayn translate``, ``aiayn evaluate`` and the demo all go through :func:`translate_sentences`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from tqdm import tqdm

from aiayn.decoding.adapters import Seq2SeqDecoder
from aiayn.decoding.beam import BeamConfig, Hypothesis, beam_search
from aiayn.decoding.ensemble import ensemble
from aiayn.decoding.protocol import right_pad
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
    batch_size: int = 64,
    progress: bool = False,
) -> list[list[Hypothesis]]:
    """The ``beam.n_best`` hypotheses of each source, in input order (one model, or an ensemble of several).

    Sources are encoded with EOS (as in training) and decoded in batches of similar length, which
    wastes less work on padding. An empty (or all-blank) source is not decoded: its list is empty.
    ``progress``: a tqdm bar (stderr) counting sentences.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not models:
        raise ValueError("no model to translate with: the ensemble is empty")
    for model in models:
        model.eval()
    decoder = ensemble([Seq2SeqDecoder(m) for m in models])
    out: list[list[Hypothesis]] = [[] for _ in sources]
    encoded = {i: src_tokenizer.encode(text, add_eos=True) for i, text in enumerate(sources) if text.strip()}
    order = sorted(encoded, key=lambda i: len(encoded[i]))
    device = next(models[0].parameters()).device
    with tqdm(total=len(order), desc="translating", unit="sent", disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            ids, mask = right_pad([encoded[i] for i in chunk], device=device)
            for i, hypotheses in zip(chunk, beam_search(decoder, ids, mask, beam)):
                out[i] = hypotheses
            bar.update(len(chunk))
    return out
