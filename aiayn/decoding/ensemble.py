"""An ensemble of models behind the :class:`~aiayn.decoding.protocol.Decoder` protocol.

Each member decodes the same tokens with its own state; the ensemble's next-token distribution is
the mean of the members' probabilities (fairseq's ensembles average the same way). The strategies
(greedy, sampling, beam search) see one decoder and need no change. Members must share the
target vocabulary (the same tokenizer); checkpoint averaging (one model from several checkpoints
of one run) is the cheaper alternative when the members come from the same run.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from aiayn.decoding.protocol import Decoder, DecodeState

__all__ = ["EnsembleDecoder", "EnsembleState", "ensemble", "mean_log_probs", "mean_logits"]


def mean_log_probs(logits: Sequence[Tensor]) -> Tensor:
    """``log(mean_m softmax(logits_m))`` over the last axis: the members' averaged distribution, as log-probs."""
    if len(logits) == 0:
        raise ValueError("mean_log_probs needs at least one tensor of logits")
    if len(logits) == 1:
        return logits[0].float().log_softmax(dim=-1)  # one member: no stack, no logsumexp
    stacked = torch.stack([x.float().log_softmax(dim=-1) for x in logits])
    return torch.logsumexp(stacked, dim=0) - math.log(len(logits))


def mean_logits(logits: Sequence[Tensor]) -> Tensor:
    """Logits of the members' averaged distribution: ``mean_log_probs`` shifted, per row, by the mean of
    the members' ``logsumexp``, so that copies of one model give that model's own logits. The shift
    changes no probability, but logit processors (the CTRL repetition penalty) read the logits' signs,
    which log-probabilities (all <= 0) would all flip."""
    if len(logits) == 1:
        return logits[0]
    shift = torch.stack([x.float().logsumexp(dim=-1, keepdim=True) for x in logits]).mean(dim=0)
    return mean_log_probs(logits) + shift


class EnsembleState:
    """The members' states; the fields strategies read (tokens, mask, ...) are the first member's,
    which every member shares because each is fed the same tokens."""

    def __init__(self, members: list[DecodeState]) -> None:
        self.members = members

    @property
    def tokens(self) -> Tensor:
        return self.members[0].tokens

    @property
    def mask(self) -> Tensor:
        return self.members[0].mask

    @property
    def max_new_tokens(self) -> Tensor:
        """Per row, the fewest tokens any member allows (learned positions may limit one member)."""
        return torch.stack([s.max_new_tokens for s in self.members]).amin(dim=0)

    @property
    def batch_size(self) -> int:
        return self.members[0].batch_size


class EnsembleDecoder:
    """Decode with several :class:`Decoder` members at once, averaging their next-token probabilities.

    Raises ``ValueError`` for no members or members with different vocabulary sizes.
    """

    def __init__(self, members: Sequence[Decoder]) -> None:
        if len(members) == 0:
            raise ValueError("an ensemble needs at least one member decoder, got none")
        sizes = [m.vocab_size for m in members]
        if len(set(sizes)) != 1:
            raise ValueError(f"ensemble members must share one vocabulary, got vocab sizes {sizes}")
        self.members = list(members)

    @property
    def vocab_size(self) -> int:
        return self.members[0].vocab_size

    def start(self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None) -> tuple[EnsembleState, Tensor]:
        started = [m.start(ids, mask, max_new_tokens=max_new_tokens) for m in self.members]
        return EnsembleState([s for s, _ in started]), mean_logits([logits for _, logits in started])

    def step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        return mean_logits([m.step(tokens, s) for m, s in zip(self.members, state.members)])

    def reorder(self, state: EnsembleState, index: Tensor, *, same_sources: bool = False) -> None:
        for member, s in zip(self.members, state.members):
            member.reorder(s, index, same_sources=same_sources)


def ensemble(members: Sequence[Decoder]) -> Decoder:
    """The one decoder of a single member as it is, else an :class:`EnsembleDecoder` of them all."""
    return members[0] if len(members) == 1 else EnsembleDecoder(members)  # type: ignore[return-value]
