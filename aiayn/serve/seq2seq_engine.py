"""Translation requests that wait together are decoded together.

The worker takes every waiting job (up to ``max_batch`` sentences at a time), groups the sentences by
their decoding settings, and runs one batched search per group: beam search (section 6.1), or for
``beam_size == 1`` greedy decoding, whose tokens stream as they come. Beam search is batched per
source, so a sentence's result does not depend on the others in its batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiayn.decoding.beam import beam_search
from aiayn.decoding.generation import STOP_EOS, generate_steps
from aiayn.decoding.protocol import right_pad
from aiayn.decoding.streaming import TextStreamer
from aiayn.decoding.text import beam_config, generation_config, pad_id, seq2seq_decoder
from aiayn.serve.errors import ModelFailure
from aiayn.serve.jobs import DONE, TOKEN, Job, Worker
from aiayn.serve.loading import ServedModel
from aiayn.serve.metrics import ServerMetrics

__all__ = ["Seq2SeqEngine", "Translation"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translation:
    """A validated translation request: source ids per text (as training encodes them: text + EOS, or an import's template) and settings."""

    sources: list[list[int]]
    beam_size: int = 4
    max_tokens: int | None = None
    length_penalty: float = 0.6

    @property
    def key(self) -> tuple[int, int | None, float]:
        return self.beam_size, self.max_tokens, self.length_penalty


_Row = tuple[Job, int, list[int]]  # (job, index in the job, source ids)


class Seq2SeqEngine(Worker):
    """The batching worker of an encoder-decoder :class:`ServedModel`."""

    name = "seq2seq-engine"

    def __init__(self, served: ServedModel, metrics: ServerMetrics, *, max_batch: int = 8, max_queue: int = 64) -> None:
        super().__init__(metrics, max_batch=max_batch, max_queue=max_queue)
        self.served = served
        self.decoder = seq2seq_decoder(served.model, served.tgt_tokenizer)  # type: ignore[arg-type]  # its BOS: the tokenizer's
        self.device = next(served.model.parameters()).device

    def _work(self) -> None:
        groups: dict[tuple[int, int | None, float], list[_Row]] = {}
        for job in self.take(self.max_batch, block=True):
            request: Translation = job.payload
            groups.setdefault(request.key, []).extend((job, i, src) for i, src in enumerate(request.sources))
        for rows in groups.values():
            for start in range(0, len(rows), self.max_batch):
                self._run_isolated(rows[start : start + self.max_batch])

    def _run_isolated(self, rows: list[_Row]) -> None:
        """Decode ``rows``; if that raises, decode each job alone so only the failing ones get a 500."""
        rows = [r for r in rows if not r[0].dead]
        if not rows:
            return
        try:
            self._run(rows)
            return
        except Exception as e:  # noqa: BLE001
            log.warning("a translation batch failed (%s: %s)", type(e).__name__, e)
            jobs = list(dict.fromkeys(r[0] for r in rows))
            if len(jobs) == 1:
                jobs[0].fail(ModelFailure(e))
                return
        for job in jobs:
            mine = [r for r in rows if r[0] is job]
            if job.first_token_at is not None:  # it already streamed part of a result: no clean retry
                job.fail(ModelFailure(RuntimeError("the batch it shared failed")))
                continue
            try:
                self._run(mine)
            except Exception as e:  # noqa: BLE001
                job.fail(ModelFailure(e))

    def _run(self, rows: list[_Row]) -> None:
        request: Translation = rows[0][0].payload
        ids, mask = right_pad([src for _, _, src in rows], pad_id(self.served.src_tokenizer), device=self.device)
        self.metrics.tokens.labels("prompt").inc(int(mask.sum()))
        self.metrics.running.set(len(rows))
        tokenizer = self.served.tgt_tokenizer
        decode = tokenizer.decode
        if request.beam_size == 1:
            config = generation_config(tokenizer, greedy=True, max_new_tokens=request.max_tokens)
            streamers = [TextStreamer(decode) for _ in rows]
            reasons: dict[int, str] = {}
            for step in generate_steps(self.decoder, ids, mask, config):
                for b in step.emitted.nonzero().flatten().tolist():
                    token = int(step.tokens[b])
                    if token != config.eos_id:
                        self._send(rows[b], streamers[b].push([token]))
                reasons.update(step.stopped)
            results = [(s.ids, reasons.get(b) == STOP_EOS) for b, s in enumerate(streamers)]
        else:
            config_b = beam_config(tokenizer, beam_size=request.beam_size, length_penalty=request.length_penalty, max_new_tokens=request.max_tokens)
            hyps = beam_search(self.decoder, ids, mask, config_b)
            results = []
            for h, row in zip(hyps, rows):
                tokens = h[0].tokens if h else []
                ended = bool(tokens) and tokens[-1] == config_b.eos_id
                results.append((tokens[:-1] if ended else tokens, ended))
                self._send(row, decode(results[-1][0]))
        self.metrics.running.set(0)
        for (job, index, src), (out, ended) in zip(rows, results):
            n = len(out) + int(ended)
            self.metrics.tokens.labels("completion").inc(n)
            job.emit(DONE, index, {"finish_reason": "stop" if ended else "length", "text": decode(out),
                                   "prompt_tokens": len(src), "completion_tokens": n, "tokens": out})

    def _send(self, row: _Row, piece: str) -> None:
        job = row[0]
        if job.first_token_at is None:
            job.first_token_at = time.perf_counter()
            self.metrics.time_to_first_token.observe(job.first_token_at - job.arrived)
        if piece and job.stream:
            job.emit(TOKEN, row[1], piece)
