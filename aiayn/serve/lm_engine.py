"""Continuous batching for decoder-only models (Orca/vLLM style, on the library's own decode step).

Every step, the worker (1) drops rows whose client went away or whose request failed, (2) admits
waiting prompts while the batch has room: each is prefilled alone and joins the running batch
(:func:`~aiayn.serve.batch_state.join`), (3) runs one decode step for the whole batch, and (4) lets
finished rows leave. Each row samples with its own ``torch.Generator`` (seeded by its request), so
its tokens never depend on which other rows share the batch.

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
from aiayn.decoding.sampling import logits_to_probs, sample
from aiayn.serve import batch_state
from aiayn.serve.errors import APIError, ModelFailure
from aiayn.serve.jobs import DONE, TOKEN, Job, Worker
from aiayn.serve.loading import ServedModel
from aiayn.serve.metrics import ServerMetrics
from aiayn.tokenization.special import EOS_ID

__all__ = ["Completion", "LMEngine"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """A validated completion request: token ids per prompt and the sampling settings.
    ``temperature == 0`` is greedy; ``top_p == 1`` keeps the whole distribution; ``logit_bias`` is
    added to the logits first (OpenAI's field)."""

    prompts: list[list[int]]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); -100 bans a token


@dataclass(eq=False)
class _Row:
    """One prompt of a job, waiting or in the running batch."""

    job: Job
    index: int
    prompt: list[int]
    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    sent: str = ""  # text already handed to the client
    next: int = 0  # the token to feed at the next step


class LMEngine(Worker):
    """The continuous-batching worker of a decoder-only :class:`ServedModel` (at most ``max_batch`` rows)."""

    name = "lm-engine"

    def __init__(self, served: ServedModel, metrics: ServerMetrics, *, max_batch: int = 8, max_queue: int = 64) -> None:
        super().__init__(metrics, max_batch=max_batch, max_queue=max_queue)
        self.served = served
        self.decoder = CausalLMDecoder(served.model)  # type: ignore[arg-type]
        self.device = next(served.model.parameters()).device
        self.pad_id = served.config.pad_id if served.config.pad_id is not None else 0
        self.writable = served.tgt_tokenizer.vocab_size
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
                for i, prompt in enumerate(request.prompts):
                    generator = torch.Generator(device=self.device).manual_seed(request.seed)
                    self.waiting.append(_Row(job, i, prompt, generator))
        while self.waiting and len(self.rows) < self.max_batch:
            self._admit(self.waiting.popleft())
        if self.rows:
            self._step()
        self.metrics.running.set(len(self.rows))

    # -- joining: prefill alone, sample the first token, join the batch ---------------------------
    def _admit(self, row: _Row) -> None:
        if row.job.dead:
            return
        request: Completion = row.job.payload
        ids = torch.tensor([row.prompt], device=self.device)
        try:
            state, logits = self.decoder.start(ids, torch.ones_like(ids, dtype=torch.bool), max_new_tokens=request.max_tokens)
        except Exception as e:  # noqa: BLE001 (any failure of the model is this request's 500)
            log.warning("prefill failed: %s: %s", type(e).__name__, e)
            row.job.fail(ModelFailure(e))
            return
        self.metrics.tokens.labels("prompt").inc(len(row.prompt))
        if self._emit(row, self._choose(logits[0], row)):
            return
        self.rows.append(row)
        self.state = state if self.state is None else batch_state.join(self.state, state, self.pad_id)

    # -- one decode step for the whole batch ------------------------------------------------------
    def _step(self) -> None:
        tokens = torch.tensor([row.next for row in self.rows], device=self.device)
        logits = self._logits(tokens)
        if logits is None:
            return
        keep = [i for i, row in enumerate(self.rows) if not self._emit(row, self._choose(logits[i], row))]
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
    def _choose(self, logits: Tensor, row: _Row) -> int:
        """The next token of ``row`` from its ``logits (V,)``: greedy at temperature 0, else sampled."""
        request: Completion = row.job.payload
        logits = logits[: self.writable]  # a vocabulary padded past the tokenizer's ids: never emit what cannot be written
        if request.logit_bias:
            logits = logits.float().clone()
            for token, bias in request.logit_bias:
                logits[token] += bias
        if request.temperature == 0:
            return int(logits.argmax())
        top_p = request.top_p if request.top_p < 1 else None
        return int(sample(logits_to_probs(logits[None], request.temperature, None, top_p), row.generator)[0])

    def _emit(self, row: _Row, token: int) -> bool:
        """Record ``token`` for ``row``, stream the new text; return whether the row is finished.

        The text is decoded every step only when it is needed then (a stream, or stop strings);
        a plain request decodes once, at its end."""
        job, request = row.job, row.job.payload
        assert isinstance(request, Completion)
        self.metrics.tokens.labels("completion").inc()
        if job.first_token_at is None:
            job.first_token_at = time.perf_counter()
            self.metrics.time_to_first_token.observe(job.first_token_at - job.arrived)
        decode = self.served.tgt_tokenizer.decode
        finish, text = None, None
        if token == EOS_ID:
            finish, text = "stop", decode(row.ids) if row.ids else ""
            row.ids.append(token)
        else:
            row.ids.append(token)
            if job.stream or request.stop:
                text = decode(row.ids)
                cut = _first_stop(text, request.stop, len(row.sent))
                if cut is not None:
                    text, finish = text[:cut], "stop"
            if finish is None and len(row.ids) >= request.max_tokens:
                finish = "length"
        if finish is not None and text is None:
            text = decode(row.ids)
        if job.stream and text is not None:
            self._stream(row, text, finished=finish is not None)
        row.next = token
        if finish is not None:
            job.emit(DONE, row.index, {"finish_reason": finish, "text": text, "prompt_tokens": len(row.prompt), "completion_tokens": len(row.ids)})
            return True
        return job.dead

    @staticmethod
    def _stream(row: _Row, text: str, finished: bool) -> None:
        """Send what ``text`` adds to the text already sent, holding back an incomplete UTF-8 character
        and what could still become a stop string."""
        visible = text
        if not finished:
            hold = max((len(s) - 1 for s in row.job.payload.stop), default=0)
            visible = text[: len(text) - hold] if hold else text
            if visible.endswith("\ufffd"):
                visible = row.sent
        if visible.startswith(row.sent) and len(visible) > len(row.sent):
            row.job.emit(TOKEN, row.index, visible[len(row.sent):])
            row.sent = visible


def _first_stop(text: str, stops: tuple[str, ...], sent: int) -> int | None:
    """Where the earliest stop string starts in ``text`` (searching from just before the text already sent)."""
    if not stops:
        return None
    start = max(0, sent - max(len(s) for s in stops) + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None
