"""Evaluate a model on a held-out split, with the data and the metric its training config names.

The task decides the metric: translation -> sacreBLEU + chrF, lm -> perplexity, mlm -> masked-token
loss and accuracy, classification -> accuracy. The data section (named set, or ``dataset=files``
with ``val_files``) decides where the split comes from, so a run on your own files is evaluated on
its own validation files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import nn

from aiayn.data import LabeledText, load_multi30k, load_sst2, load_tinyshakespeare
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation.metrics import evaluate_classifier, evaluate_lm, evaluate_mlm, evaluate_translation, translate_corpus
from aiayn.tokenization.base import Tokenizer
from aiayn.training.config import DataSection

__all__ = ["HELD_OUT_SPLITS", "NATURAL_TASK", "METRICS", "HeldOutResult", "held_out_data", "evaluate_held_out"]

HELD_OUT_SPLITS: dict[str, tuple[str, ...]] = {
    "multi30k": ("val", "test2016"), "tinyshakespeare": ("val",), "sst2": ("dev",), "files": ("val",),
}
NATURAL_TASK = {"multi30k": "translation", "tinyshakespeare": "lm", "sst2": "classification"}  # without a training config
METRICS = {
    "translation": "sacreBLEU + chrF", "lm": "perplexity", "mlm": "masked-token loss and accuracy", "classification": "accuracy",
}


@dataclass
class HeldOutResult:
    metrics: dict[str, Any]
    hypotheses: list[str] = field(default_factory=list)  # translation only: the outputs, in input order


def held_out_data(data: DataSection, split: str) -> Any:
    """The raw ``split`` of the data ``data`` describes: parallel text, plain text or labelled text.

    Raises ``ValueError`` naming the split and the held-out splits of the data set.
    """
    if split not in HELD_OUT_SPLITS[data.dataset]:
        raise ValueError(f"--split {split!r} is not a held-out split of {data.dataset}; choose one of {HELD_OUT_SPLITS[data.dataset]}")
    if data.dataset == "multi30k":
        return load_multi30k(split, direction=data.direction, data_dir=data.data_dir)
    if data.dataset == "tinyshakespeare":
        return load_tinyshakespeare(split, data_dir=data.data_dir)
    if data.dataset == "sst2":
        return load_sst2(split, data_dir=data.data_dir)
    from aiayn.training.tasks import load_splits  # the same reading (and lm split) as training

    return load_splits(data)[1]


def evaluate_held_out(
    models: nn.Module | Sequence[nn.Module],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    data: DataSection,
    split: str,
    *,
    beam: BeamConfig | None = None,
    limit: int | None = None,
    progress: bool = False,
) -> HeldOutResult:
    """Score ``models`` (one, or an ensemble) on ``split`` with the metric of ``data.task``.

    ``limit``: only the first N examples (N characters of text for an LM), a quick look.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    raw = held_out_data(data, split)
    if data.task == "translation":
        beam = beam or BeamConfig()
        sources, references = raw.src[:limit], raw.tgt[:limit]
        hypotheses = translate_corpus(models, src_tokenizer, tgt_tokenizer, sources, beam=beam, progress=progress)  # type: ignore[arg-type]
        metrics = {"direction": data.direction, "beam_size": beam.beam_size, "length_penalty": beam.length_penalty}
        return HeldOutResult(metrics | evaluate_translation(hypotheses, references), hypotheses)
    if data.task == "lm":
        text = raw[:limit]
        lm = evaluate_lm(models, src_tokenizer, text, block_size=data.block_size, progress=progress)  # type: ignore[arg-type]
        return HeldOutResult({"block_size": data.block_size} | lm)
    if not isinstance(raw, LabeledText):
        raise ValueError(f"data.task={data.task!r} needs labelled sentences, got data.dataset={data.dataset!r}")
    if limit:
        raw = LabeledText(raw.texts[:limit], raw.labels[:limit], raw.label_names)
    if data.task == "mlm":
        return HeldOutResult(evaluate_mlm(models, src_tokenizer, raw.texts, max_len=data.max_len, progress=progress))  # type: ignore[arg-type]
    return HeldOutResult(evaluate_classifier(models, src_tokenizer, raw, max_len=data.max_len, progress=progress))  # type: ignore[arg-type]
