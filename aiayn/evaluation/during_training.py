"""BLEU on validation sentences while a translation model trains (``train.eval_bleu``).

Greedy decoding, not beam search: it is several times cheaper and ranks checkpoints the same way
closely enough to pick or stop on. The references are the validation targets decoded back to text,
so the score is sacreBLEU on detokenized text, like ``aiayn evaluate`` (which uses beam search).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from aiayn.data.batch import TranslationBatch
from aiayn.decoding.greedy import greedy
from aiayn.decoding.text import beam_config, seq2seq_decoder
from aiayn.evaluation.metrics import evaluate_translation

__all__ = ["bleu_eval_hook"]


def bleu_eval_hook(sentences: int) -> Callable[[nn.Module, Any, int], dict[str, float]]:
    """An ``EvalHook`` giving ``val_bleu``: greedy translations of the first ``sentences`` validation
    sentences (in the validation batches' fixed order), scored with sacreBLEU."""
    if sentences < 1:
        raise ValueError(f"sentences={sentences} must be >= 1")

    @torch.no_grad()
    def hook(model: nn.Module, data: Any, step: int) -> dict[str, float]:
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        decoder = seq2seq_decoder(model, data.tgt_tokenizer)  # type: ignore[arg-type]  # BOS, EOS, pad: the target tokenizer's own
        ends = beam_config(data.tgt_tokenizer)
        hypotheses: list[str] = []
        references: list[str] = []
        for batch in data.val:
            if not isinstance(batch, TranslationBatch):
                raise TypeError(f"train.eval_bleu needs translation batches, got {type(batch).__name__}")
            take = min(sentences - len(hypotheses), batch.src.shape[0])
            src, src_mask = batch.src[:take].to(device), batch.src_mask[:take].to(device)
            for tokens in greedy(decoder, src, src_mask, eos_id=ends.eos_id, pad_id=ends.pad_id).sequences():
                hypotheses.append(data.tgt_tokenizer.decode(tokens))
            for row, mask in zip(batch.tgt_out[:take].tolist(), batch.tgt_mask[:take].tolist()):
                references.append(data.tgt_tokenizer.decode([t for t, real in zip(row, mask) if real]))
            if len(hypotheses) >= sentences:
                break
        model.train(was_training)
        return {"val_bleu": float(evaluate_translation(hypotheses, references)["bleu"])}

    return hook
