"""Evaluate a model on a held-out split, with the data and the metric its training config names.

The task decides the metric: translation -> sacreBLEU + chrF, lm -> perplexity, mlm -> masked-token
loss and accuracy, classification -> accuracy. The data section (named set, or ``dataset=files``
with ``val_files`` / ``test_files``) decides where the split comes from, so a run on your own files
is evaluated on its own validation or test files; any other files in the task's format can be
given instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import nn

from aiayn.data import LabeledText, load_multi30k, load_sst2, load_tinyshakespeare
from aiayn.data.wmt14 import load_wmt14
from aiayn.decoding.beam import BeamConfig
from aiayn.evaluation.metrics import evaluate_classifier, evaluate_lm, evaluate_mlm, evaluate_translation, translate_corpus
from aiayn.evaluation.paper_bleu import paper_bleu
from aiayn.tokenization.base import Tokenizer
from aiayn.training.config import DataSection
from aiayn.training.files import read_task_files

__all__ = ["HELD_OUT_SPLITS", "NATURAL_TASK", "METRICS", "HeldOutResult", "held_out_data", "evaluate_held_out"]

HELD_OUT_SPLITS: dict[str, tuple[str, ...]] = {
    "multi30k": ("val", "test2016"), "tinyshakespeare": ("val",), "sst2": ("dev",), "files": ("val", "test"),
    "wmt14-en-de": ("newstest2013", "newstest2014"),
}
NATURAL_TASK = {"multi30k": "translation", "tinyshakespeare": "lm", "sst2": "classification",  # without a training config
                "wmt14-en-de": "translation"}
DEFAULT_DIRECTION = {"multi30k": "de-en", "wmt14-en-de": "en-de"}  # without a training config: each corpus's usual direction
METRICS = {
    "translation": "sacreBLEU + chrF", "lm": "perplexity", "mlm": "masked-token loss and accuracy", "classification": "accuracy",
}


@dataclass
class HeldOutResult:
    metrics: dict[str, Any]
    hypotheses: list[str] = field(default_factory=list)  # translation only: the outputs, in input order


def held_out_data(data: DataSection, split: str | None, *, files: Sequence[str] | None = None,
                  label_names: Sequence[str] | None = None) -> Any:
    """The raw ``split`` of the data ``data`` describes (or ``files``, read in the task's format):
    parallel text, plain text or labelled text.

    ``label_names``: the classes of the model, in order (else those of the training file). Raises
    ``ValueError`` naming the split and the held-out splits of the data set.
    """
    if files:
        return read_task_files(data, files, "--files", **_labels(data, label_names))
    if split not in HELD_OUT_SPLITS[data.dataset]:
        raise ValueError(f"--split {split!r} is not a held-out split of {data.dataset}; choose one of {HELD_OUT_SPLITS[data.dataset]}")
    if data.dataset == "wmt14-en-de":
        return load_wmt14(split, direction=data.direction, data_dir=data.data_dir)
    if data.dataset == "multi30k":
        return load_multi30k(split, direction=data.direction, data_dir=data.data_dir)
    if data.dataset == "tinyshakespeare":
        return load_tinyshakespeare(split, data_dir=data.data_dir)
    if data.dataset == "sst2":
        return load_sst2(split, data_dir=data.data_dir)
    if split == "test":
        if not data.test_files:
            raise ValueError("--split test reads data.test_files, which the training config does not set: "
                             "pass the files with --files PATH [PATH] instead")
        return read_task_files(data, data.test_files, "data.test_files", **_labels(data, label_names))
    from aiayn.training.tasks import load_splits  # the same reading (and held-out split) as training

    return load_splits(data)[1]


def _labels(data: DataSection, label_names: Sequence[str] | None) -> dict[str, Any]:
    """The label set a classification file is read with: the model's, else the training file's."""
    if data.task != "classification":
        return {}
    if label_names is not None:
        return {"label_names": label_names, "known_from": "the labels the model was trained on"}
    if data.dataset != "files":
        raise ValueError(f"the class names of this model are unknown: evaluating files needs the labels it was trained on "
                         f"(data.dataset={data.dataset!r})")
    train = read_task_files(data, data.train_files, "data.train_files")
    return {"label_names": train.label_names, "known_from": f"data.train_files ({data.train_files[0]})"}


def evaluate_held_out(
    models: nn.Module | Sequence[nn.Module],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    data: DataSection,
    split: str | None,
    *,
    files: Sequence[str] | None = None,
    label_names: Sequence[str] | None = None,
    beam: BeamConfig | None = None,
    limit: int | None = None,
    progress: bool = False,
) -> HeldOutResult:
    """Score ``models`` (one, or an ensemble) on ``split`` (or ``files``) with the metric of ``data.task``.

    ``label_names``: a classifier's classes, in order. ``limit``: only the first N examples (N
    characters of text for an LM), a quick look. Only the fields that apply are returned (a
    direction only for a named data set).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    raw = held_out_data(data, split, files=files, label_names=label_names)
    if data.task == "translation":
        beam = beam or BeamConfig()
        sources, references = raw.src[:limit], raw.tgt[:limit]
        hypotheses = translate_corpus(models, src_tokenizer, tgt_tokenizer, sources, beam=beam, progress=progress)  # type: ignore[arg-type]
        metrics: dict[str, Any] = {"direction": data.direction} if data.dataset != "files" and not files else {}  # own files: their columns
        metrics |= {"beam_size": beam.beam_size, "length_penalty": beam.length_penalty}
        metrics |= evaluate_translation(hypotheses, references)
        if data.dataset in ("wmt14-en-de", "multi30k") and data.direction.endswith("-de") and not files:
            metrics |= paper_bleu(hypotheses, references, lang="de")  # the paper's tokenized BLEU, beside sacreBLEU
        return HeldOutResult(metrics, hypotheses)
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
