"""From a ``DataSection`` to tokenizers, a resumable training loader and validation batches, per task."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from torch.utils.data import Dataset

from aiayn.data import (
    ClassificationDataset,
    FixedSizeBatchSampler,
    LabeledText,
    MLMCollate,
    ParallelText,
    RandomWindowSampler,
    ResumableLoader,
    SentenceDataset,
    SequentialBlockSampler,
    TokenBudgetBatchSampler,
    TokenStream,
    TranslationDataset,
    collate_classification,
    collate_lm,
    collate_translation,
    load_multi30k,
    load_sst2,
    load_tinyshakespeare,
    read_classification,
    read_parallel,
    read_text,
    split_text,
)
from aiayn.data.batching import BatchPlan
from aiayn.data.datasets import SST2_CLASS_NAMES
from aiayn.tokenization import train_tokenizer, train_tokenizer_pair
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import DEFAULT_SPECIAL_IDS, special_ids
from aiayn.training.config import DataSection

__all__ = ["TaskData", "build_task_data", "load_splits"]

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    """What the loop needs from the data: a training loader, validation batches, the tokenizers."""

    task: str
    train: ResumableLoader
    val: list[Any]  # collated validation batches, in a fixed order
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    n_classes: int = 0
    label_names: list[str] | None = None  # classification: the name of each class id


def load_splits(data: DataSection) -> tuple[Any, Any]:
    """The raw (train, validation) data of the section: parallel text, plain text or labelled text."""
    if data.dataset == "multi30k":
        return (load_multi30k("train", direction=data.direction, data_dir=data.data_dir),
                load_multi30k("val", direction=data.direction, data_dir=data.data_dir))
    if data.dataset == "tinyshakespeare":
        return load_tinyshakespeare("train", data_dir=data.data_dir), load_tinyshakespeare("val", data_dir=data.data_dir)
    if data.dataset == "sst2":
        return load_sst2("train", data_dir=data.data_dir), load_sst2("dev", data_dir=data.data_dir)
    read = _FILE_READERS[data.task]
    train = read(data.train_files, "data.train_files")
    if data.val_files:
        if isinstance(train, LabeledText):  # the validation labels must mean what the training labels mean
            return train, _read_labelled(data.val_files, "data.val_files", label_names=train.label_names)
        return train, read(data.val_files, "data.val_files")
    if data.task != "lm":
        raise ValueError(f"data.val_files is required for task {data.task!r} with dataset=files")
    return split_text(train, 0.9)  # the nanoGPT split: last 10% of the text


def _read_parallel(files: list[str], name: str) -> ParallelText:
    if len(files) != 2:
        raise ValueError(f"{name} must be [source_file, target_file] for translation, got {files}")
    return read_parallel(files[0], files[1])


def _read_text(files: list[str], name: str) -> str:
    if len(files) != 1:
        raise ValueError(f"{name} must be [text_file] for language modelling, got {files}")
    return read_text(files[0])


def _read_labelled(files: list[str], name: str, label_names: list[str] | None = None) -> LabeledText:
    if len(files) != 1:
        raise ValueError(f"{name} must be [tsv_or_csv_file], got {files}")
    return read_classification(files[0], label_names=label_names)


_FILE_READERS: dict[str, Callable[[list[str], str], Any]] = {
    "translation": _read_parallel, "lm": _read_text, "mlm": _read_labelled, "classification": _read_labelled,
}


def build_task_data(
    data: DataSection,
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> TaskData:
    """Load, tokenize (training a tokenizer unless ``tokenizers`` are given, e.g. on resume) and batch."""
    train_raw, val_raw = load_splits(data)
    if data.task == "translation":
        if data.dataset in ("tinyshakespeare", "sst2"):
            raise ValueError(f"data.task=translation needs parallel text, got data.dataset={data.dataset!r}")
        src_tok, tgt_tok = tokenizers or train_tokenizer_pair(
            data.tokenizer, train_raw.src, train_raw.tgt, _bpe_size(data), shared=data.shared_vocab
        )
        train_set: Any = TranslationDataset.encode(train_raw, src_tok, tgt_tok, max_len=data.max_len, too_long=data.too_long)
        val_set: Any = TranslationDataset.encode(val_raw, src_tok, tgt_tok, max_len=data.max_len, too_long=data.too_long)
        _report(train_set, "training")

        def plan(ds: TranslationDataset, shuffle: bool) -> BatchPlan:
            return TokenBudgetBatchSampler([ds.src_lengths, ds.tgt_lengths], data.max_tokens, shuffle=shuffle, seed=seed)

        specials = special_ids(tgt_tok)  # BOS starts and EOS ends every target: the tokenizer's own ids
        collate_pairs = functools.partial(
            collate_translation, bos_id=specials.need("bos", "translation training"), eos_id=specials.need("eos", "translation training"),
        )
        return _assemble(data, train_set, val_set, plan, collate_pairs, (src_tok, tgt_tok), rank, world_size)

    if data.task == "lm":
        if not isinstance(train_raw, str):
            raise ValueError(f"data.task=lm needs plain text, got data.dataset={data.dataset!r}")
        tok = tokenizers[0] if tokenizers else train_tokenizer(data.tokenizer, [train_raw], _bpe_size(data))
        train_stream = TokenStream.encode(train_raw, tok, data.block_size)
        val_stream = TokenStream.encode(val_raw, tok, data.block_size)
        train_plan = RandomWindowSampler(train_stream, data.batch_size, seed=seed)
        train = ResumableLoader(train_stream, train_plan, collate_lm, num_workers=data.num_workers, rank=rank, world_size=world_size)
        val = _collate_all(val_stream, SequentialBlockSampler(val_stream, data.batch_size), collate_lm)
        return TaskData(data.task, train, val, tok, tok)

    if data.dataset in ("multi30k", "tinyshakespeare"):
        raise ValueError(f"data.task={data.task} needs labelled sentences (sst2 or files), got data.dataset={data.dataset!r}")
    texts = list(train_raw.texts)
    tok = tokenizers[0] if tokenizers else train_tokenizer(data.tokenizer, texts, _bpe_size(data))
    if data.task == "mlm":
        train_set = SentenceDataset.encode(texts, tok, max_len=data.max_len, too_long=data.too_long)
        val_set = SentenceDataset.encode(list(val_raw.texts), tok, max_len=data.max_len, too_long=data.too_long)
        specials = special_ids(tok)  # ours, or a pretrained tokenizer's [MASK] and specials
        special = None if specials == DEFAULT_SPECIAL_IDS else specials.ids()  # ours: the draw stays as it always was
        collate: Callable[..., Any] = MLMCollate(tok.vocab_size, mask_id=specials.need("mask", "masked-LM training"), special=special)
        n_classes = 0
    else:
        train_set = ClassificationDataset.encode(train_raw, tok, max_len=data.max_len, too_long=data.too_long)
        val_set = ClassificationDataset.encode(val_raw, tok, max_len=data.max_len, too_long=data.too_long)
        collate, n_classes = collate_classification, len(train_raw.label_names)
    _report(train_set, "training")

    def sentence_plan(ds: Any, shuffle: bool) -> BatchPlan:  # a SentenceDataset or ClassificationDataset (sized)
        return FixedSizeBatchSampler(len(ds), data.batch_size, shuffle=shuffle, seed=seed)

    task_data = _assemble(data, train_set, val_set, sentence_plan, collate, (tok, tok), rank, world_size)
    task_data.n_classes = n_classes
    if data.task == "classification":
        task_data.label_names = list(SST2_CLASS_NAMES if data.dataset == "sst2" else train_raw.label_names)
    return task_data


def _assemble(
    data: DataSection,
    train_set: Dataset,
    val_set: Dataset,
    plan: Callable[[Any, bool], BatchPlan],
    collate: Callable[..., Any],
    tokenizers: tuple[Tokenizer, Tokenizer],
    rank: int,
    world_size: int,
) -> TaskData:
    train = ResumableLoader(train_set, plan(train_set, True), collate, num_workers=data.num_workers, rank=rank, world_size=world_size)
    val = _collate_all(val_set, plan(val_set, False), collate)
    return TaskData(data.task, train, val, tokenizers[0], tokenizers[1])


def _collate_all(dataset: Dataset, plan: BatchPlan, collate: Callable[..., Any]) -> list[Any]:
    """Every batch of one epoch, collated once; the fixed generator makes MLM masks the same each time."""
    return [collate([dataset[i] for i in batch], np.random.default_rng([0, k])) for k, batch in enumerate(plan.batches(0))]


def _bpe_size(data: DataSection) -> int | None:
    return data.vocab_size if data.tokenizer == "bpe" else None


def _report(dataset: Any, what: str) -> None:
    dropped, truncated = getattr(dataset, "n_dropped", 0), getattr(dataset, "n_truncated", 0)
    if dropped or truncated:
        log.warning("%s data: %d examples dropped and %d truncated for being longer than data.max_len", what, dropped, truncated)
