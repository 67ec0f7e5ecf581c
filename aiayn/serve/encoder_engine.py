"""Classification, fill-mask and embedding requests that wait together share one encoder forward pass."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiayn.decoding.encoder_only import fill_mask
from aiayn.decoding.protocol import right_pad
from aiayn.inference.embed import Pooling, embed_ids
from aiayn.serve.errors import ModelFailure
from aiayn.serve.jobs import DONE, Job, Worker
from aiayn.serve.loading import ServedModel
from aiayn.serve.metrics import ServerMetrics
from aiayn.tokenization.special import special_ids

__all__ = ["Classify", "Embed", "EncoderEngine", "FillMask"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Classify:
    """The texts to classify, as ``aiayn.load(...).classify`` takes them (labels by name, the tokenizer's [CLS]/[SEP])."""

    texts: list[str]


@dataclass(frozen=True)
class FillMask:
    """Texts as ``[CLS] ids [SEP]`` with the tokenizer's mask id where a token is asked for; ``top_k`` candidates each."""

    texts: list[list[int]]
    top_k: int = 5


@dataclass(frozen=True)
class Embed:
    """Texts as ``[CLS] ids [SEP]``, pooled into one vector each (one ``pooling`` per served model)."""

    texts: list[list[int]]
    pooling: Pooling


class EncoderEngine(Worker):
    """The batching worker of an encoder-only :class:`ServedModel`."""

    name = "encoder-engine"

    def __init__(self, served: ServedModel, metrics: ServerMetrics, *, max_batch: int = 8, max_queue: int = 64) -> None:
        super().__init__(metrics, max_batch=max_batch, max_queue=max_queue)
        self.served = served
        self.loaded = served.as_loaded()  # classification runs the code of aiayn.load(...).classify
        self.device = next(served.model.parameters()).device

    def _work(self) -> None:
        jobs = self.take(self.max_batch, block=True)
        for kind in (Classify, FillMask, Embed):
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
        if isinstance(jobs[0].payload, Classify):
            texts = [(job, i, text) for job in jobs for i, text in enumerate(job.payload.texts)]
            classes = self.loaded.classify([t for _, _, t in texts], batch_size=len(texts))
            for (job, i, _), p in zip(texts, classes):
                job.emit(DONE, i, {"label": p.label, "prob": p.prob, "probs": p.probs})
            return
        rows = [(job, i, ids) for job in jobs for i, ids in enumerate(job.payload.texts)]
        ids, mask = right_pad([r[2] for r in rows], device=self.device)
        self.metrics.tokens.labels("prompt").inc(int(mask.sum()))
        if isinstance(jobs[0].payload, Embed):
            vectors = embed_ids(self.served.model, ids, mask, jobs[0].payload.pooling).tolist()  # type: ignore[arg-type]
            for (job, i, _), v in zip(rows, vectors):
                job.emit(DONE, i, {"embedding": v})
            return
        top_k = max(job.payload.top_k for job in jobs)
        specials = special_ids(self.served.src_tokenizer)
        predictions = fill_mask(self.served.model, ids, mask, top_k=top_k,  # type: ignore[arg-type]
                                mask_id=specials.need("mask", "fill-mask"), special=specials.ids())
        decode = self.served.tgt_tokenizer.decode
        for (job, i, _), masks in zip(rows, predictions):
            k = job.payload.top_k
            job.emit(DONE, i, {"masks": [
                {"position": m.position, "candidates": [
                    {"token_id": t, "token": decode([t]), "prob": p} for t, p in zip(m.token_ids[:k], m.probs[:k])
                ]} for m in masks
            ]})
