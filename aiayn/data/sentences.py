"""Single sentences encoded as ``[CLS] text [SEP]`` (the encoder-only family), optionally labelled.

Used for masked-LM pre-training (unlabelled) and sentence classification (labelled).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from aiayn.data.batch import ClassificationBatch
from aiayn.data.encoded import Ragged, TooLong, limit_lengths, pad_batch
from aiayn.data.errors import DataError
from aiayn.data.readers import LabeledText
from aiayn.nn.masks import padding_mask_from_lengths
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import sentence_ids

__all__ = ["SentenceDataset", "ClassificationDataset", "collate_classification"]


class SentenceDataset(Dataset):
    """Item ``i`` is ``[CLS] ids [SEP]`` (an int32 array); ``lengths`` count both markers.

    ``n_dropped`` and ``n_truncated`` report what ``max_len`` did when the set was encoded.
    """

    def __init__(self, ids: Ragged, *, n_dropped: int = 0, n_truncated: int = 0) -> None:
        self.ids, self.n_dropped, self.n_truncated = ids, n_dropped, n_truncated
        self.kept = np.arange(len(ids))  # indices of the kept examples in the input texts

    @classmethod
    def encode(
        cls, texts: Sequence[str], tokenizer: Tokenizer, *, max_len: int | None = None, too_long: TooLong = "error"
    ) -> SentenceDataset:
        """Tokenize ``texts``; a sequence longer than ``max_len`` (markers included) is handled per
        ``too_long`` (``"error"``, ``"drop"``, ``"truncate"``). Raises ``DataError`` when none is left."""
        ids = tokenizer.encode_batch(texts)
        cls_id, sep_id, _ = sentence_ids(tokenizer)  # ours (4, 5) or a pretrained tokenizer's (BERT: 101, 102)
        lengths = np.array([len(s) + 2 for s in ids], dtype=np.int64)
        limit = limit_lengths([lengths], max_len, too_long, "sentences")
        cap = max_len or 0  # only read for truncated sentences, which exist only with a max_len
        out = [
            [cls_id, *(ids[i][: cap - 2] if cut else ids[i]), sep_id]
            for i, cut in zip(limit.keep.tolist(), limit.truncate.tolist())
        ]
        dataset = cls(Ragged.from_lists(out), n_dropped=limit.n_dropped, n_truncated=limit.n_truncated)
        dataset.kept = limit.keep
        return dataset

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[i]

    @property
    def lengths(self) -> np.ndarray:
        return self.ids.lengths


class ClassificationDataset(Dataset):
    """Item ``i`` is ``([CLS] ids [SEP], label)``."""

    def __init__(self, sentences: SentenceDataset, labels: np.ndarray, label_names: Sequence[str]) -> None:
        if len(sentences) != len(labels):
            raise ValueError(f"{len(sentences)} sentences but {len(labels)} labels")
        self.sentences, self.labels, self.label_names = sentences, np.asarray(labels, dtype=np.int64), list(label_names)

    @classmethod
    def encode(
        cls, data: LabeledText, tokenizer: Tokenizer, *, max_len: int | None = None, too_long: TooLong = "error"
    ) -> ClassificationDataset:
        if len(data) == 0:
            raise DataError("no labelled examples: the data set is empty")
        sentences = SentenceDataset.encode(data.texts, tokenizer, max_len=max_len, too_long=too_long)
        return cls(sentences, np.asarray(data.labels, dtype=np.int64)[sentences.kept], data.label_names)

    @property
    def n_dropped(self) -> int:
        return self.sentences.n_dropped

    @property
    def n_truncated(self) -> int:
        return self.sentences.n_truncated

    @property
    def lengths(self) -> np.ndarray:
        return self.sentences.lengths

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.sentences[i], int(self.labels[i])


def collate_classification(
    examples: Sequence[tuple[np.ndarray, int]], rng: np.random.Generator | None = None, *, pad_to_multiple: int = 1,
) -> ClassificationBatch:
    """Pad ``(ids, label)`` examples into a :class:`ClassificationBatch` (``rng`` is unused), the length
    rounded up to a multiple of ``pad_to_multiple``."""
    ids, lengths = pad_batch([e[0] for e in examples], multiple=pad_to_multiple)
    return ClassificationBatch(
        input=ids,
        labels=torch.tensor([e[1] for e in examples], dtype=torch.long),
        pad_mask=padding_mask_from_lengths(lengths, ids.shape[1]),
    )
