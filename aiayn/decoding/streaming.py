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

    ``stop_strings``: once the text contains one, :attr:`stopped` is set and the text ends just
    before it (OpenAI's ``stop``); until then the last ``len(longest) - 1`` characters are held
    back, since they could still begin a stop string. :meth:`finish` gives out what is held back.
    """

    def __init__(self, detokenize: Callable[[Sequence[int]], str], stop_strings: Sequence[str] = ()) -> None:
        self.detokenize = detokenize
        self.stop_strings = tuple(stop_strings)
        self.hold = max((len(s) - 1 for s in self.stop_strings), default=0)
        self.ids: list[int] = []
        self.text = ""  # the text given out so far
        self.stop_at: int | None = None  # where the first stop string begins in the decoded text
        self._searched = 0  # characters already searched for a stop string

    @property
    def stopped(self) -> bool:
        return self.stop_at is not None

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.detokenize(self.ids)
        if self.stop_strings and self.stop_at is None:
            start = max(0, self._searched - self.hold)  # a stop string may straddle the old and new text
            hits = [i for i in (text.find(s, start) for s in self.stop_strings) if i >= 0]
            self.stop_at = min(hits) if hits else None
            self._searched = len(text)
        return self._give(text, final=self.stop_at is not None)

    def finish(self) -> str:
        """The text still held back, once no more ids come (the row ended)."""
        return self._give(self.detokenize(self.ids), final=True)

    def _give(self, text: str, final: bool) -> str:
        if self.stop_at is not None:
            text = text[: self.stop_at]
        elif not final:
            if self.hold:
                text = text[: max(len(self.text), len(text) - self.hold)]
            if text.endswith("\ufffd"):
                return ""
        if not text.startswith(self.text):
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
