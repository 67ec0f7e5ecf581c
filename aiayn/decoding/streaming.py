"""Streaming: tokens as they come (:func:`~aiayn.decoding.generation.generate_steps` is the iterator,
``generate(on_step=...)`` the callback) and text as it comes (:func:`stream_text`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from aiayn.decoding.generation import generate_steps
from aiayn.decoding.protocol import Decoder
from aiayn.decoding.sampling import GenerationConfig

__all__ = ["TextStreamer", "stream_text"]


class TextStreamer:
    """Turn token ids, pushed as they come, into the new text each push adds.

    Decodes everything so far and returns what extends the text already given out, so tokens that
    only make sense together (a UTF-8 character split over byte-level BPE tokens) come out whole:
    text ending in U+FFFD (an incomplete character) is held back until it completes.
    """

    def __init__(self, detokenize: Callable[[Sequence[int]], str]) -> None:
        self.detokenize = detokenize
        self.ids: list[int] = []
        self.text = ""

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.detokenize(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.text):
            return ""
        new, self.text = text[len(self.text):], text
        return new


def stream_text(
    decoder: Decoder | nn.Module,
    ids: Tensor,
    mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    detokenize: Callable[[Sequence[int]], str],
    generator: torch.Generator | None = None,
) -> Iterator[str]:
    """Generate from one prompt or source ``ids (1, L)`` and yield the text as it grows (EOS not shown).

    Raises ``ValueError`` for a batch of more than one row.
    """
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"stream_text decodes one row: ids must have shape (1, L), got {tuple(ids.shape)}")
    streamer = TextStreamer(detokenize)
    for step in generate_steps(decoder, ids, mask, config, generator=generator, detokenize=detokenize):
        if bool(step.emitted[0]):
            piece = streamer.push([int(step.tokens[0])])
            if piece:
                yield piece
