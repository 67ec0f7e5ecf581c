"""Check that a tokenizer fits a model's embedding table when the two are put together."""

from __future__ import annotations

from aiayn.tokenization.base import N_SPECIAL, Tokenizer

__all__ = ["check_tokenizer_fits"]


def check_tokenizer_fits(tokenizer: Tokenizer, vocab_size: int, name: str = "vocab_size") -> None:
    """Raise ``ValueError`` unless every id of ``tokenizer`` indexes a row of a ``vocab_size`` table.

    Call it when a model (whose config field is ``name``) and a tokenizer meet, so a mismatch fails
    there and not at the first out-of-range id in the middle of training.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"{name} must be an int, got {type(vocab_size).__name__}")
    if vocab_size < N_SPECIAL:
        raise ValueError(f"{name}={vocab_size} is smaller than the {N_SPECIAL} special tokens (ids 0..{N_SPECIAL - 1})")
    needed = tokenizer.vocab_size
    if needed > vocab_size:
        raise ValueError(
            f"the tokenizer has {needed} ids (0..{needed - 1}) but the model's {name} is {vocab_size}: "
            f"ids >= {vocab_size} would index past the embedding table; build the model with "
            f"{name} >= {needed} or use a smaller tokenizer"
        )
