"""Data: readers, named data sets, encoded data sets, batch plans, a resumable loader, batch types."""

from aiayn.data.batch import IGNORE_INDEX, ClassificationBatch, LMBatch, MLMBatch, TranslationBatch
from aiayn.data.batching import Batches, BatchPlan, FixedSizeBatchSampler, TokenBudgetBatchSampler
from aiayn.data.datasets import (
    DATASETS,
    ENV_VAR,
    cache_dir,
    load_multi30k,
    load_sst2,
    load_tinyshakespeare,
    resolve_files,
)
from aiayn.data.download import fetch_file
from aiayn.data.encoded import Ragged, TooLong
from aiayn.data.errors import DataError, DownloadError
from aiayn.data.lm import RandomWindowSampler, SequentialBlockSampler, TokenStream, collate_lm, split_text
from aiayn.data.loader import ResumableLoader, fetch
from aiayn.data.mlm import MLMCollate, mask_tokens
from aiayn.data.readers import (
    LabeledText,
    ParallelText,
    read_classification,
    read_lines,
    read_pairs,
    read_parallel,
    read_text,
)
from aiayn.data.sentences import ClassificationDataset, SentenceDataset, collate_classification
from aiayn.data.translation import PairBatch, TranslationDataset, collate_translation

__all__ = [
    "IGNORE_INDEX",
    "TranslationBatch",
    "LMBatch",
    "MLMBatch",
    "ClassificationBatch",
    "BatchPlan",
    "Batches",
    "TokenBudgetBatchSampler",
    "FixedSizeBatchSampler",
    "DATASETS",
    "ENV_VAR",
    "cache_dir",
    "resolve_files",
    "load_multi30k",
    "load_tinyshakespeare",
    "load_sst2",
    "fetch_file",
    "Ragged",
    "TooLong",
    "DataError",
    "DownloadError",
    "TokenStream",
    "RandomWindowSampler",
    "SequentialBlockSampler",
    "collate_lm",
    "split_text",
    "ResumableLoader",
    "fetch",
    "MLMCollate",
    "mask_tokens",
    "ParallelText",
    "LabeledText",
    "read_text",
    "read_lines",
    "read_parallel",
    "read_pairs",
    "read_classification",
    "SentenceDataset",
    "ClassificationDataset",
    "collate_classification",
    "TranslationDataset",
    "PairBatch",
    "collate_translation",
]
