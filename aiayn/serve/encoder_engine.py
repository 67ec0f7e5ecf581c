"""Classification and fill-mask requests that wait together share one encoder forward pass."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiayn.decoding.encoder_only import classify, fill_mask
from aiayn.decoding.protocol import right_pad
from aiayn.serve.errors import ModelFailure
from aiayn.serve.jobs import DONE, Job, Worker
from aiayn.serve.loading import ServedModel
from aiayn.serve.metrics import ServerMetrics

__all__ = ["Classify", "EncoderEngine", "FillMask"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Classify:
    """Texts as ``[CLS] ids [SEP]``."""

    texts: list[list[int]]


@dataclass(frozen=True)
class FillMask:
    """Texts as ``[CLS] ids [SEP]`` with ``MASK_ID`` where a token is asked for; ``top_k`` candidates each."""

    texts: list[list[int]]
    top_k: int = 5


class EncoderEngine(Worker):
    """The batching worker of an encoder-only :class:`ServedModel`."""

    name = "encoder-engine"

    def __init__(self, served: ServedModel, metrics: ServerMetrics, *, max_batch: int = 8, max_queue: int = 64) -> None:
        super().__init__(metrics, max_batch=max_batch, max_queue=max_queue)
        self.served = served
        self.device = next(served.model.parameters()).device

    def _work(self) -> None:
        jobs = self.take(self.max_batch, block=True)
        for kind in (Classify, FillMask):
            mine = [job for job in jobs if isinstance(job.payload, kind)]
            if not mine:
                continue
            try:
                self._run(mine)
            except Exception as e:  # noqa: BLE001 (retry alone so only the failing requests get a 500)
                log.warning("an encoder batch failed (%s: %s)", type(e).__name__, e)
                for job in mine:
                    try:
                        self._run([job]) if len(mine) > 1 else job.fail(ModelFailure(e))
                    except Exception as e_alone:  # noqa: BLE001
                        job.fail(ModelFailure(e_alone))

    def _run(self, jobs: list[Job]) -> None:
        rows = [(job, i, ids) for job in jobs for i, ids in enumerate(job.payload.texts)]
        ids, mask = right_pad([r[2] for r in rows], device=self.device)
        self.metrics.tokens.labels("prompt").inc(int(mask.sum()))
        if isinstance(jobs[0].payload, Classify):
            probs = classify(self.served.model, ids, mask).probs.tolist()  # type: ignore[arg-type]
            for (job, i, _), p in zip(rows, probs):
                job.emit(DONE, i, {"label": max(range(len(p)), key=p.__getitem__), "probs": p})
            return
        top_k = max(job.payload.top_k for job in jobs)
        predictions = fill_mask(self.served.model, ids, mask, top_k=top_k)  # type: ignore[arg-type]
        decode = self.served.tgt_tokenizer.decode
        for (job, i, _), masks in zip(rows, predictions):
            k = job.payload.top_k
            job.emit(DONE, i, {"masks": [
                {"position": m.position, "candidates": [
                    {"token_id": t, "token": decode([t]), "prob": p} for t, p in zip(m.token_ids[:k], m.probs[:k])
                ]} for m in masks
            ]})
