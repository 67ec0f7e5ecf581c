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
    MLMCollate,
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
)
from aiayn.data.batching import BatchPlan
from aiayn.data.datasets import SST2_CLASS_NAMES
from aiayn.data.loader import fetch
from aiayn.data.prepared import open_prepared
from aiayn.tokenization import train_tokenizer, train_tokenizer_pair
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import DEFAULT_SPECIAL_IDS, special_ids
from aiayn.training.config import DataSection
from aiayn.training.files import own_splits

__all__ = ["TaskData", "build_task_data", "load_splits", "check_classes", "size_hint"]

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
    train_tokens: int = 0  # tokens in the encoded training set (both sides for translation)


def load_splits(data: DataSection) -> tuple[Any, Any]:
    """The raw (train, validation) data of the section: parallel text, plain text or labelled text."""
    if data.dataset == "multi30k":
        return (load_multi30k("train", direction=data.direction, data_dir=data.data_dir),
                load_multi30k("val", direction=data.direction, data_dir=data.data_dir))
    if data.dataset == "tinyshakespeare":
        return load_tinyshakespeare("train", data_dir=data.data_dir), load_tinyshakespeare("val", data_dir=data.data_dir)
    if data.dataset == "sst2":
        return load_sst2("train", data_dir=data.data_dir), load_sst2("dev", data_dir=data.data_dir)
    if data.dataset == "wmt14-en-de":
        raise ValueError("data.dataset='wmt14-en-de' trains from shards: set data.prepared=DIR after "
                         "`aiayn prepare wmt14-en-de --out DIR` (4.5M pairs are tokenized once, not at every start)")
    return own_splits(data)


def build_task_data(
    data: DataSection,
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> TaskData:
    """Load, tokenize (training a tokenizer unless ``tokenizers`` are given, e.g. on resume) and batch."""
    if data.prepared is not None:  # tokenized once by `aiayn prepare`: its shards are read, no text and no encoding
        prepared = open_prepared(data.prepared, tokenizers=tokenizers)
        src_tok = tgt_tok = prepared.tokenizer
        train_set: Any = prepared.pairs("train", max_len=data.max_len, too_long=data.too_long)
        val_set: Any = prepared.pairs("val", max_len=data.max_len, too_long=data.too_long)
    else:
        train_raw, val_raw = load_splits(data)
    if data.task == "translation":
        if data.prepared is None:
            if data.dataset in ("tinyshakespeare", "sst2"):
                raise ValueError(f"data.task=translation needs parallel text, got data.dataset={data.dataset!r}")
            src_tok, tgt_tok = tokenizers or train_tokenizer_pair(
                data.tokenizer, train_raw.src, train_raw.tgt, _bpe_size(data), shared=data.shared_vocab
            )
            train_set = TranslationDataset.encode(train_raw, src_tok, tgt_tok, max_len=data.max_len, too_long=data.too_long)
            val_set = TranslationDataset.encode(val_raw, src_tok, tgt_tok, max_len=data.max_len, too_long=data.too_long)
        _report(train_set, "training")
        tokens = int(train_set.src_lengths.sum() + train_set.tgt_lengths.sum())

        def plan(ds: TranslationDataset, shuffle: bool) -> BatchPlan:
            return TokenBudgetBatchSampler([ds.src_lengths, ds.tgt_lengths], data.max_tokens, shuffle=shuffle, seed=seed,
                                           pad_to_multiple=data.pad_to_multiple)

        specials = special_ids(tgt_tok)  # BOS starts and EOS ends every target: the tokenizer's own ids
        collate_pairs = functools.partial(
            collate_translation, bos_id=specials.need("bos", "translation training"), eos_id=specials.need("eos", "translation training"),
            pad_to_multiple=data.pad_to_multiple,
        )
        task_data = _assemble(data, train_set, val_set, plan, collate_pairs, (src_tok, tgt_tok), rank, world_size)
        task_data.train_tokens = tokens
        return task_data

    if data.task == "lm":
        if not isinstance(train_raw, str):
            raise ValueError(f"data.task=lm needs plain text, got data.dataset={data.dataset!r}")
        tok = tokenizers[0] if tokenizers else train_tokenizer(data.tokenizer, [train_raw], _bpe_size(data))
        train_stream = TokenStream.encode(train_raw, tok, data.block_size)
        val_stream = TokenStream.encode(val_raw, tok, data.block_size)
        train_plan = RandomWindowSampler(train_stream, data.batch_size, seed=seed)
        train = ResumableLoader(train_stream, train_plan, collate_lm, collate_rng=False, num_workers=data.num_workers,
                                rank=rank, world_size=world_size)
        val = _collate_all(val_stream, SequentialBlockSampler(val_stream, data.batch_size), collate_lm)
        return TaskData(data.task, train, val, tok, tok, train_tokens=len(train_stream.tokens))

    if data.dataset in ("multi30k", "tinyshakespeare"):
        raise ValueError(f"data.task={data.task} needs labelled sentences (sst2 or files), got data.dataset={data.dataset!r}")
    texts = list(train_raw.texts)
    tok = tokenizers[0] if tokenizers else train_tokenizer(data.tokenizer, texts, _bpe_size(data))
    if data.task == "mlm":
        train_set = SentenceDataset.encode(texts, tok, max_len=data.max_len, too_long=data.too_long)
        val_set = SentenceDataset.encode(list(val_raw.texts), tok, max_len=data.max_len, too_long=data.too_long)
        specials = special_ids(tok)  # ours, or a pretrained tokenizer's [MASK] and specials
        special = None if specials == DEFAULT_SPECIAL_IDS else specials.ids()  # ours: the draw stays as it always was
        collate: Callable[..., Any] = MLMCollate(tok.vocab_size, mask_id=specials.need("mask", "masked-LM training"), special=special,
                                                     pad_to_multiple=data.pad_to_multiple)
        n_classes = 0
    else:
        train_set = ClassificationDataset.encode(train_raw, tok, max_len=data.max_len, too_long=data.too_long)
        val_set = ClassificationDataset.encode(val_raw, tok, max_len=data.max_len, too_long=data.too_long)
        collate = functools.partial(collate_classification, pad_to_multiple=data.pad_to_multiple)
        n_classes = len(train_raw.label_names)
    _report(train_set, "training")

    def sentence_plan(ds: Any, shuffle: bool) -> BatchPlan:  # a SentenceDataset or ClassificationDataset (sized)
        return FixedSizeBatchSampler(len(ds), data.batch_size, shuffle=shuffle, seed=seed)

    task_data = _assemble(data, train_set, val_set, sentence_plan, collate, (tok, tok), rank, world_size)
    task_data.n_classes = n_classes
    task_data.train_tokens = int(train_set.lengths.sum())
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
    random = data.task == "mlm"  # the only collate that draws (its masks); the others get no generator
    train = ResumableLoader(train_set, plan(train_set, True), collate, collate_rng=random, num_workers=data.num_workers,
                            rank=rank, world_size=world_size)
    val = _collate_all(val_set, plan(val_set, False), collate)
    return TaskData(data.task, train, val, tokenizers[0], tokenizers[1])


def _collate_all(dataset: Dataset, plan: BatchPlan, collate: Callable[..., Any]) -> list[Any]:
    """Every batch of one epoch, collated once; the fixed generator makes MLM masks the same each time."""
    return [collate(fetch(dataset, batch), np.random.default_rng([0, k])) for k, batch in enumerate(plan.batches(0))]


def _bpe_size(data: DataSection) -> int | None:
    return data.vocab_size if data.tokenizer == "bpe" else None


def _report(dataset: Any, what: str) -> None:
    dropped, truncated = getattr(dataset, "n_dropped", 0), getattr(dataset, "n_truncated", 0)
    if dropped or truncated:
        log.warning("%s data: %d examples dropped and %d truncated for being longer than data.max_len", what, dropped, truncated)


def check_classes(n_classes: int, data: TaskData) -> None:
    """Fail before step 1 when the classifier has fewer classes than the training file has labels."""
    names = data.label_names or []
    if data.task == "classification" and n_classes < data.n_classes:
        raise ValueError(
            f"model.n_classes={n_classes} is fewer than the {data.n_classes} labels of the training data {names}: "
            f"set model.n_classes=auto (one class per label of the training file) or at least {data.n_classes}"
        )


def size_hint(data: TaskData, n_params: int, *, pretrained: bool = False) -> str:
    """One line comparing the training corpus (tokens) with the model (parameters), with a hint when
    they are far apart: a model much larger than its data memorises it, a much smaller one underfits.

    The thresholds are loose on purpose; Hoffmann et al. (2022) found about 20 tokens per parameter
    compute-optimal for language models, and a small corpus is read for many epochs.
    """
    tokens = max(data.train_tokens, 1)
    line = f"data: {data.train_tokens:,} training tokens; model: {n_params:,} parameters ({tokens / max(n_params, 1):.3g} tokens per parameter)"
    if pretrained:
        return line + "; fine-tuning a pretrained model (train.init_from) needs less data than training from scratch"
    if n_params > 10 * tokens:
        return line + ("; hint: the model is far larger than the data and will memorise it: try a smaller one "
                       "(fewer model.n_layers, a smaller model.d_model and model.d_ff) or more data")
    if tokens > 1000 * n_params:
        return line + "; hint: the model is small for this much data: a larger one (more model.n_layers, model.d_model) may learn more"
    return line
