"""Tokenizers: character-level and subword BPE, with the library's fixed special tokens."""

from aiayn.tokenization.base import N_SPECIAL, Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.build import TOKENIZER_KINDS, train_tokenizer, train_tokenizer_pair
from aiayn.tokenization.char import CharTokenizer
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.io import load_tokenizer, load_tokenizer_pair, save_tokenizer_pair
from aiayn.tokenization.special import (
    BOS,
    BOS_ID,
    CLS,
    CLS_ID,
    EOS,
    EOS_ID,
    MASK,
    MASK_ID,
    PAD,
    PAD_ID,
    SEP,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK,
    UNK_ID,
)

__all__ = [
    "Tokenizer",
    "CharTokenizer",
    "BPETokenizer",
    "TOKENIZER_KINDS",
    "train_tokenizer",
    "train_tokenizer_pair",
    "load_tokenizer",
    "save_tokenizer_pair",
    "load_tokenizer_pair",
    "check_tokenizer_fits",
    "N_SPECIAL",
    "SPECIAL_TOKENS",
    "PAD", "BOS", "EOS", "UNK", "CLS", "SEP", "MASK",
    "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "CLS_ID", "SEP_ID", "MASK_ID",
]
