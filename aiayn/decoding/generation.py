"""The token-by-token loop of greedy decoding and sampling, batched, as an iterator of steps.

:func:`generate_steps` yields each step's tokens as they come (streaming); :func:`generate`
collects them. Each row stops on its own: after EOS, after a stop string, or at its token limit;
finished rows then emit ``pad_id`` until every row is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.decoding.adapters import as_decoder
from aiayn.decoding.protocol import Decoder
from aiayn.decoding.sampling import GenerationConfig, next_token
from aiayn.decoding.speculative import SpeculativeDecoder

__all__ = ["STOP_EOS", "STOP_LENGTH", "STOP_STRING", "Generation", "GenerationStep", "generate", "generate_steps"]

STOP_EOS, STOP_STRING, STOP_LENGTH = "eos", "stop_string", "max_new_tokens"


@dataclass
class GenerationStep:
    """One step of a batch: ``tokens (B,)`` (``pad_id`` where a row had already finished),
    ``emitted (B,)`` which rows produced ``tokens[b]``, and ``stopped``: row -> why it finished now."""

    tokens: Tensor
    emitted: Tensor
    stopped: dict[int, str]


@dataclass
class Generation:
    """``tokens (B, N)``: generated ids (EOS included), ``pad_id`` after a row's end; ``lengths (B,)``:
    tokens per row; ``stop_reasons``: ``"eos"``, ``"stop_string"`` or ``"max_new_tokens"`` per row."""

    tokens: Tensor
    lengths: Tensor
    stop_reasons: list[str]

    def sequences(self) -> list[list[int]]:
        """Each row's generated ids, without the padding after its end."""
        return [row[:n] for row, n in zip(self.tokens.tolist(), self.lengths.tolist())]


def generate_steps(
    decoder: Decoder | nn.Module,
    ids: Tensor,
    mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
) -> Iterator[GenerationStep]:
    """Decode ``ids (B, L)`` (a source, or a left-padded prompt; ``mask`` bool, ``True`` = real token),
    yielding a :class:`GenerationStep` per step.

    ``decoder``: a :class:`~aiayn.decoding.protocol.Decoder`, or a generative model (wrapped with the
    KV cache). ``generator``: the random source of sampling (fix its seed to reproduce a run).
    ``detokenize``: ids -> text, needed for ``config.stop_strings``. Raises ``ValueError`` for
    stop strings without ``detokenize`` and for inputs the decoder rejects.
    """
    config = config if config is not None else GenerationConfig()
    if config.stop_strings and detokenize is None:
        raise ValueError("config.stop_strings needs detokenize (ids -> text), e.g. detokenize=tokenizer.decode")
    decoder = as_decoder(decoder)
    choose = decoder.choose if isinstance(decoder, SpeculativeDecoder) else next_token  # speculative: its acceptance rule
    state, logits = decoder.start(ids, mask, max_new_tokens=config.max_new_tokens)
    batch = state.batch_size
    device = logits.device
    n_generated = torch.zeros(batch, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    every_row = torch.ones(batch, dtype=torch.bool, device=device)  # what each step emits until a row finishes
    some_finished = False  # whether a row has finished: until then a step masks nothing (a few us a token saved)
    texts = _StopStrings(config.stop_strings, detokenize, batch) if config.stop_strings and detokenize else None  # checked above
    limits = set(state.max_new_tokens.tolist())  # the steps where a row reaches its length limit
    for step in range(1, max(limits) + 1):
        tokens = choose(logits, state, n_generated, config, generator)
        if some_finished:
            emitted = ~finished
            tokens = tokens.masked_fill(finished, config.pad_id)
            n_generated += emitted.long()
        else:
            emitted = every_row
            n_generated += 1
        stopped: dict[int, str] = {}
        # The host reads the device's answer only at a step where a row may stop: every step when
        # EOS or stop strings can end a row, else only at the length limits.
        done = emitted & (tokens == config.eos_id) if config.eos_id is not None else None  # the rows that stop now
        if done is not None:
            stopped.update((b, STOP_EOS) for b in done.nonzero().flatten().tolist())
        if texts is not None:
            done = done if done is not None else torch.zeros_like(finished)
            for b in texts.update(tokens, emitted & ~done):
                stopped[b] = STOP_STRING
                done[b] = True
        if step in limits:
            at_limit = emitted & (n_generated >= state.max_new_tokens)
            at_limit = at_limit if done is None else at_limit & ~done
            stopped.update((b, STOP_LENGTH) for b in at_limit.nonzero().flatten().tolist())
            done = at_limit if done is None else done | at_limit
        if done is not None and stopped:  # every row done now is in stopped
            finished |= done
            some_finished = True
        yield GenerationStep(tokens, emitted, stopped)
        if stopped and bool(finished.all()):
            return
        logits = decoder.step(tokens, state)


def generate(
    decoder: Decoder | nn.Module,
    ids: Tensor,
    mask: Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
    on_step: Callable[[GenerationStep], None] | None = None,
) -> Generation:
    """Run :func:`generate_steps` to the end and collect a :class:`Generation`.

    ``on_step``: called with each step as it comes (the callback form of streaming).
    """
    steps, reasons = [], {}
    for step in generate_steps(decoder, ids, mask, config, generator=generator, detokenize=detokenize):
        if on_step is not None:
            on_step(step)
        steps.append(step)
        reasons.update(step.stopped)
    tokens = torch.stack([s.tokens for s in steps], dim=1)  # (B, N)
    lengths = torch.stack([s.emitted for s in steps], dim=1).sum(dim=1)  # (B,)
    return Generation(tokens, lengths, [reasons[b] for b in range(tokens.shape[0])])


class _StopStrings:
    """Each row's generated text, as a :class:`~aiayn.decoding.streaming.TextStreamer` that looks for the stop strings."""

    def __init__(self, stop_strings: tuple[str, ...], detokenize: Callable[[Sequence[int]], str], batch: int) -> None:
        from aiayn.decoding.streaming import TextStreamer  # streaming imports this module

        self.rows = [TextStreamer(detokenize, stop_strings) for _ in range(batch)]

    def update(self, tokens: Tensor, rows: Tensor) -> list[int]:
        """Add ``tokens[b]`` for ``rows``; return the rows whose text now contains a stop string."""
        hits = []
        for b in rows.nonzero().flatten().tolist():
            self.rows[b].push([int(tokens[b])])
            if self.rows[b].stopped:
                hits.append(b)
        return hits
