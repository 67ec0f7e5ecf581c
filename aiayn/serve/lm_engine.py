"""Continuous batching for decoder-only models (Orca/vLLM style, on the library's own decode step).

Every step, the worker (1) drops rows whose client went away or whose request failed, (2) admits
waiting prompts while the batch has room: each is prefilled alone and joins the running batch
(:func:`~aiayn.serve.batch_state.join`), (3) runs one decode step for the whole batch, and (4) lets
finished rows leave. Each row chooses its tokens with :func:`~aiayn.decoding.sampling.next_token`
and its own :class:`~aiayn.decoding.sampling.GenerationConfig` and ``torch.Generator`` (seeded by
its request), so its tokens never depend on which other rows share the batch and equal
``aiayn.load(...).generate``'s; its text (stop strings, streaming) comes from a
:class:`~aiayn.decoding.streaming.TextStreamer`.

A step that raises is undone and retried row by row: the rows that fail alone get a 500, the others
go on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.protocol import DecodeState
from aiayn.decoding.sampling import GenerationConfig, next_token
from aiayn.decoding.speculative import DEFAULT_DRAFT_TOKENS, DEFAULT_NGRAM, SpeculativeDecoder
from aiayn.decoding.streaming import TextStreamer
from aiayn.serve import batch_state
from aiayn.serve.errors import APIError, ModelFailure
from aiayn.serve.jobs import DONE, TOKEN, Job, Worker
from aiayn.serve.loading import ServedModel
from aiayn.serve.logprobs import TokenLogprobs, prompt_logprobs
from aiayn.serve.metrics import ServerMetrics

__all__ = ["Completion", "LMEngine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """A validated completion request: token ids per prompt, the decoding settings (``config``: its
    ``max_new_tokens`` is ``max_tokens``, ``None`` when ``max_tokens`` is 0), ``best_of`` samples per
    prompt (sample ``j`` seeded with ``seed + j``), ``logprobs`` alternatives per token (``None``: none),
    and ``echo`` (score the prompt's tokens too)."""

    prompts: list[list[int]]
    config: GenerationConfig
    max_tokens: int
    seed: int = 0
    n: int = 1
    best_of: int = 1
    logprobs: int | None = None
    echo: bool = False

    @property
    def n_rows(self) -> int:
        return len(self.prompts) * self.best_of

    @property
    def scored(self) -> bool:
        """Whether each generated token's log-probability is needed (asked for, or to rank ``best_of`` samples)."""
        return self.logprobs is not None or self.best_of > self.n


@dataclass(eq=False)
class _Row:
    """One sample of one prompt of a job, waiting or in the running batch."""

    job: Job
    index: int  # prompt * best_of + sample
    prompt: list[int]
    generator: torch.Generator
    streamer: TextStreamer
    ids: list[int] = field(default_factory=list)  # the generated tokens (EOS included)
    scores: TokenLogprobs = field(default_factory=TokenLogprobs)
    echoed: TokenLogprobs | None = None  # the prompt's tokens with their log-probabilities (echo)
    echo_text: str = ""
    sent: int = 0  # generated tokens whose log-probabilities were already streamed
    next: int = 0  # the token to feed at the next step


class LMEngine(Worker):
    """The continuous-batching worker of a decoder-only :class:`ServedModel` (at most ``max_batch`` rows).

    ``speculative="prompt-lookup"`` (``aiayn serve --speculative``) decodes one sequence at a time with
    prompt-lookup drafts (``draft_tokens``, ``ngram``): a speculative step accepts a different number of
    tokens per row, which rows of one batch cannot share. Its drafts are point masses, so :meth:`_choose`'s
    plain sampling from the model's distribution is the acceptance rule, and the tokens are unchanged. ``kv_dtype``
    (``aiayn serve --kv-cache-dtype``): the dtype the rows' KV caches keep (:class:`~aiayn.decoding.adapters.CausalLMDecoder`).
    """

    name = "lm-engine"

    def __init__(
        self, served: ServedModel, metrics: ServerMetrics, *, max_batch: int = 8, max_queue: int = 64,
        speculative: str | None = None, draft_tokens: int = DEFAULT_DRAFT_TOKENS, ngram: int = DEFAULT_NGRAM,
        kv_dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__(metrics, max_batch=max_batch, max_queue=max_queue)
        self.served = served
        self.decoder: CausalLMDecoder | SpeculativeDecoder = CausalLMDecoder(served.model, kv_dtype=kv_dtype)  # type: ignore[arg-type]
        if speculative is not None:
            if speculative != "prompt-lookup":
                raise ValueError(f"speculative={speculative!r}: the server drafts by prompt lookup only ('prompt-lookup'); "
                                 "a draft model's sampled drafts need an acceptance rule the batched sampler does not run")
            self.decoder = SpeculativeDecoder(self.decoder, mode=speculative, draft_tokens=draft_tokens, ngram=ngram)
            self.max_batch = 1
        self.device = next(served.model.parameters()).device
        self.pad_id = served.config.pad_id if served.config.pad_id is not None else 0
        self.writable = served.tgt_tokenizer.vocab_size
        self.window = served.window  # past it, a window slides
        if not batch_state.joinable(served.model.new_cache()):  # type: ignore[operator]
            log.warning("this model's decode caches cannot be joined into a batch: serving one sequence at a time (--max-batch 1)")
            self.max_batch = 1
        self.waiting: deque[_Row] = deque()
        self.rows: list[_Row] = []
        self.state: DecodeState | None = None

    def _work(self) -> None:
        self._drop_dead()
        room = self.max_batch - len(self.rows) - len(self.waiting)
        if room > 0:
            for job in self.take(room, block=not self.rows and not self.waiting):
                request: Completion = job.payload
                for p, prompt in enumerate(request.prompts):
                    for j in range(request.best_of):
                        generator = torch.Generator(device=self.device).manual_seed(request.seed + j)
                        streamer = TextStreamer(self.served.tgt_tokenizer.decode, request.config.stop_strings)
                        self.waiting.append(_Row(job, p * request.best_of + j, prompt, generator, streamer))
        while self.waiting and len(self.rows) < self.max_batch:
            self._admit(self.waiting.popleft())
        if self.rows:
            self._step()
        self.metrics.running.set(len(self.rows))

    # -- joining: prefill alone, choose the first token, join the batch ---------------------------
    def _admit(self, row: _Row) -> None:
        if row.job.dead:
            return
        request: Completion = row.job.payload
        ids = torch.tensor([row.prompt], device=self.device)
        try:
            if request.echo:
                row.echoed = prompt_logprobs(self.served.model, ids, self.writable, request.logprobs)
                row.echo_text = self.served.tgt_tokenizer.decode(row.prompt)
                if row.job.stream:  # the prompt is the stream's first piece
                    row.job.emit(TOKEN, row.index, row.echo_text, row.echoed, 0)
            if request.max_tokens == 0:
                self.metrics.tokens.labels("prompt").inc(len(row.prompt))
                self._finish(row, "length")
                return
            state, logits = self.decoder.start(ids, torch.ones_like(ids, dtype=torch.bool), max_new_tokens=request.max_tokens)
        except Exception as e:  # noqa: BLE001 (any failure of the model is this request's 500)
            log.warning("prefill failed: %s: %s", type(e).__name__, e)
            row.job.fail(ModelFailure(e))
            return
        self.metrics.tokens.labels("prompt").inc(len(row.prompt))
        if self._emit(row, self._choose(logits[0], state.tokens, state.mask, row)):
            return
        self.rows.append(row)
        self.state = state if self.state is None else batch_state.join(self.state, state, self.pad_id)

    # -- one decode step for the whole batch ------------------------------------------------------
    def _step(self) -> None:
        tokens = torch.tensor([row.next for row in self.rows], device=self.device)
        logits = self._logits(tokens)
        if logits is None:
            return
        assert self.state is not None
        history, mask = self.state.tokens, self.state.mask
        keep = [i for i, row in enumerate(self.rows) if not self._emit(row, self._choose(logits[i], history[i], mask[i], row))]
        self._keep(keep)

    def _logits(self, tokens: Tensor) -> Tensor | None:
        """The next-token logits ``(B, V)``; on a failure, find the rows that fail alone and fail them."""
        assert self.state is not None
        saved = batch_state.snapshot(self.state)
        try:
            return self.decoder.step(tokens, self.state)
        except Exception as e:  # noqa: BLE001
            batch_state.restore(self.state, saved)
            log.warning("a batched step failed (%s: %s); retrying row by row", type(e).__name__, e)
            culprits = self._culprits(tokens) if len(self.rows) > 1 else [(0, e)]
            for i, error in culprits or [(i, e) for i in range(len(self.rows))]:
                self.rows[i].job.fail(ModelFailure(error))
        keep = [i for i, row in enumerate(self.rows) if not row.job.dead]
        self._keep(keep)
        if not keep:
            return None
        tokens = tokens[torch.tensor(keep, device=self.device)]
        saved = batch_state.snapshot(self.state)
        try:
            return self.decoder.step(tokens, self.state)
        except Exception as e:  # noqa: BLE001 (fails again without the culprits: give up on the batch)
            batch_state.restore(self.state, saved)
            for row in self.rows:
                row.job.fail(ModelFailure(e))
            self._keep([])
            return None

    def _culprits(self, tokens: Tensor) -> list[tuple[int, Exception]]:
        assert self.state is not None
        culprits = []
        for i in range(len(self.rows)):
            alone = batch_state.subset(self.state, torch.tensor([i], device=self.device))
            try:
                self.decoder.step(tokens[i : i + 1], alone)
            except Exception as e:  # noqa: BLE001
                culprits.append((i, e))
        return culprits

    # -- rows leave ---------------------------------------------------------------------------------
    def _drop_dead(self) -> None:
        if any(row.job.dead for row in self.rows):
            self._keep([i for i, row in enumerate(self.rows) if not row.job.dead])
        self.waiting = deque(row for row in self.waiting if not row.job.dead)

    def _keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep or self.state is None:
            self.state = None
            return
        self.state.select(torch.tensor(keep, device=self.device))
        batch_state.trim(self.state)

    def _shutdown(self) -> None:
        error = APIError(503, "the server shut down before this request finished", type="server_error", code="shutting_down")
        for row in [*self.rows, *self.waiting]:
            row.job.fail(error)
        self.rows, self.waiting, self.state = [], deque(), None

    # -- choosing and emitting tokens ---------------------------------------------------------------
    def _choose(self, logits: Tensor, history: Tensor, mask: Tensor, row: _Row) -> int:
        """The next token of ``row`` from its ``logits (V,)`` and its sequence so far ``history (L,)``:
        :func:`next_token` with the request's config, as ``generate`` runs it for a batch of one."""
        request: Completion = row.job.payload
        logits = logits[None, : self.writable]  # a vocabulary padded past the tokenizer's ids: never emit what cannot be written
        one = torch.ones(1, dtype=torch.long, device=self.device)
        alone = DecodeState(tokens=history[None], mask=mask[None], max_new_tokens=one, pads=one)  # the history next_token reads
        token = int(next_token(logits, alone, one * len(row.ids), request.config, row.generator)[0])
        row.scores.add(logits[0], token, request.logprobs, score=request.scored)
        return token

    def _emit(self, row: _Row, token: int) -> bool:
        """Record ``token`` for ``row`` and stream the new text; return whether the row is finished."""
        job, request = row.job, row.job.payload
        assert isinstance(request, Completion)
        self.metrics.tokens.labels("completion").inc()
        if job.first_token_at is None:
            job.first_token_at = time.perf_counter()
            self.metrics.time_to_first_token.observe(job.first_token_at - job.arrived)
        row.ids.append(token)
        row.next = token
        finish = None
        if token == request.config.eos_id:
            finish = "stop"
            row.scores.drop_last()  # EOS is not part of the text
        else:
            piece = row.streamer.push([token])
            if piece and job.stream:
                self._send(row, piece)
            if row.streamer.stopped:
                finish = "stop"
            elif len(row.ids) >= request.max_tokens:
                finish = "length"
        if finish is not None:
            self._finish(row, finish)
            return True
        return job.dead

    def _send(self, row: _Row, piece: str) -> None:
        """Stream ``piece`` with the log-probabilities of the tokens generated since the last piece."""
        scores = row.scores.since(row.sent)
        row.sent = len(row.scores)
        row.job.emit(TOKEN, row.index, piece, scores, len(row.echo_text) + len(row.streamer.text) - len(piece))

    def _finish(self, row: _Row, reason: str) -> None:
        job = row.job
        rest = row.streamer.finish()
        if job.stream and (rest or len(row.scores) > row.sent):
            self._send(row, rest)
        fed = len(row.prompt) + max(len(row.ids) - 1, 0)  # the last token is never fed back
        job.emit(DONE, row.index, {
            "finish_reason": reason, "text": row.streamer.text, "prompt_tokens": len(row.prompt), "completion_tokens": len(row.ids),
            "token_ids": row.ids, "scores": row.scores, "echo": row.echoed,
            "window_slid": self.window is not None and fed > self.window,
        })
