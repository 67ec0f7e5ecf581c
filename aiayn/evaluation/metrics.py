"""The task metrics, each computed by the tool made for it: sacreBLEU for BLEU and chrF.

Each function takes one model or a list of models; a list is an ensemble whose members' predicted
probabilities are averaged (the members must share the tokenizer).
"""

from __future__ import annotations

import math
from typing import Any, Sequence, TypeVar

import numpy as np
import sacrebleu
import torch
from tqdm import tqdm

from aiayn.data import (
    IGNORE_INDEX,
    ClassificationDataset,
    LabeledText,
    MLMCollate,
    SentenceDataset,
    SequentialBlockSampler,
    TokenStream,
    collate_classification,
    collate_lm,
    fetch,
)
from aiayn.decoding.beam import BeamConfig
from aiayn.decoding.ensemble import mean_log_probs
from aiayn.decoding.translate import translate_sentences
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.base import Tokenizer

__all__ = ["translate_corpus", "evaluate_translation", "evaluate_lm", "evaluate_mlm", "evaluate_classifier"]

M = TypeVar("M", bound=torch.nn.Module)


def _members(model: M | Sequence[M]) -> list[M]:
    """One model or an ensemble -> the list of models, in eval mode."""
    models = [model] if isinstance(model, torch.nn.Module) else list(model)
    if not models:
        raise ValueError("no model to evaluate: the ensemble is empty")
    return [m.eval() for m in models]


def translate_corpus(
    model: EncoderDecoder | Sequence[EncoderDecoder],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    sources: Sequence[str],
    *,
    beam: BeamConfig | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> list[str]:
    """The best beam-search translation of each source, detokenized, in input order ("" for an empty
    source); :func:`~aiayn.decoding.translate.translate_sentences` does the work."""
    hypotheses = translate_sentences(_members(model), src_tokenizer, sources, beam or BeamConfig(),
                                     tgt_tokenizer=tgt_tokenizer, batch_size=batch_size, progress=progress)
    return [tgt_tokenizer.decode(hyps[0].tokens) if hyps else "" for hyps in hypotheses]


def evaluate_translation(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """Corpus BLEU and chrF of detokenized text (sacreBLEU's defaults: 13a tokenization), with signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


@torch.no_grad()
def evaluate_lm(
    model: DecoderOnly | Sequence[DecoderOnly], tokenizer: Tokenizer, text: str, *, block_size: int, batch_size: int = 32,
    progress: bool = False,
) -> dict[str, Any]:
    """Mean next-token loss (nats) and perplexity over non-overlapping ``block_size`` windows of ``text``."""
    models = _members(model)
    stream = TokenStream.encode(text, tokenizer, block_size)
    device = next(models[0].parameters()).device
    total, count = 0.0, 0
    plan = SequentialBlockSampler(stream, batch_size).batches(0)
    for batch_ids in tqdm(plan, desc="scoring", unit="batch", disable=not progress, dynamic_ncols=True):
        batch = collate_lm(fetch(stream, batch_ids)).to(device)
        log_probs = mean_log_probs([m(batch.input) for m in models])
        total += float(torch.nn.functional.nll_loss(log_probs.flatten(0, 1), batch.target.flatten(), reduction="sum"))
        count += batch.target.numel()
    loss = total / count
    return {"loss": round(loss, 4), "perplexity": round(math.exp(loss), 3), "tokens": count}


@torch.no_grad()
def evaluate_mlm(
    model: EncoderOnly | Sequence[EncoderOnly], tokenizer: Tokenizer, texts: Sequence[str], *, max_len: int,
    batch_size: int = 64, seed: int = 0, progress: bool = False,
) -> dict[str, Any]:
    """Masked-LM loss (nats per predicted token) and accuracy of the predicted tokens, BERT's 15% masking
    drawn from ``seed`` so that two runs (and two models) are scored on the same masks."""
    models = _members(model)
    dataset = SentenceDataset.encode(list(texts), tokenizer, max_len=max_len, too_long="truncate")
    collate = MLMCollate(tokenizer.vocab_size)
    device = next(models[0].parameters()).device
    total, correct, count = 0.0, 0, 0
    starts = range(0, len(dataset), batch_size)
    for k, start in enumerate(tqdm(starts, desc="scoring", unit="batch", disable=not progress, dynamic_ncols=True)):
        examples = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        batch = collate(examples, np.random.default_rng([seed, k])).to(device)
        predicted = batch.labels != IGNORE_INDEX  # (B, T)
        log_probs = mean_log_probs([m.masked_lm_logits(m(batch.input, batch.pad_mask, batch.segment_ids)[predicted]) for m in models])
        labels = batch.labels[predicted]  # (N,)
        total += float(torch.nn.functional.nll_loss(log_probs, labels, reduction="sum"))
        correct += int((log_probs.argmax(-1) == labels).sum())
        count += labels.numel()
    if count == 0:
        raise ValueError("no token to predict: the texts are empty")
    loss = total / count
    return {"mlm_loss": round(loss, 4), "mlm_accuracy": round(correct / count, 4), "predicted_tokens": count, "examples": len(dataset)}


@torch.no_grad()
def evaluate_classifier(
    model: EncoderOnly | Sequence[EncoderOnly], tokenizer: Tokenizer, data: LabeledText, *, max_len: int, batch_size: int = 64,
    progress: bool = False,
) -> dict[str, Any]:
    """Accuracy of ``model`` on labelled text (sequences longer than ``max_len`` are truncated, not dropped)."""
    models = _members(model)
    dataset = ClassificationDataset.encode(data, tokenizer, max_len=max_len, too_long="truncate")
    device = next(models[0].parameters()).device
    correct = 0
    starts = range(0, len(dataset), batch_size)
    for start in tqdm(starts, desc="classifying", unit="batch", disable=not progress, dynamic_ncols=True):
        batch = collate_classification([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))], np.random.default_rng(0)).to(device)
        log_probs = mean_log_probs([m.classification_logits(m(batch.input, batch.pad_mask), batch.pad_mask) for m in models])
        correct += int((log_probs.argmax(-1) == batch.labels).sum())
    return {"accuracy": round(correct / len(dataset), 4), "examples": len(dataset)}
