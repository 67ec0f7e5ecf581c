"""Tiny models and a fake decoder with a fixed table of probabilities, shared by the decoding tests."""

from __future__ import annotations

import math

import torch

from aiayn import build_model
from aiayn.decoding.protocol import DecodeState
from aiayn.tokenization.special import BOS_ID, EOS_ID

A, B = 3, 4  # the fake decoder's two real tokens (0 pad, 1 bos, 2 eos)


def enc_dec(positions: str = "sinusoidal", **overrides):
    torch.manual_seed(0)
    return build_model("tiny-encoder-decoder", positions=positions, **overrides).eval()


def gpt(positions: str = "learned", **overrides):
    torch.manual_seed(0)
    return build_model("tiny-decoder-only", positions=positions, **overrides).eval()


def random_rows(lengths, seed=0, low=7, high=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, high, (n,), generator=g).tolist() for n in lengths]


class TableDecoder:
    """A :class:`~aiayn.decoding.protocol.Decoder` whose next-token probabilities depend only on the
    tokens generated so far, looked up in ``table`` (prefix tuple -> {token: prob}); an unknown
    prefix gives EOS with probability 1."""

    vocab_size = 5

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]) -> None:
        self.table = table
        self.steps = 0

    def start(self, ids, mask=None, *, max_new_tokens=None):
        batch = ids.shape[0]
        state = DecodeState(
            tokens=torch.full((batch, 1), BOS_ID), mask=torch.ones(batch, 1, dtype=torch.bool),
            max_new_tokens=torch.full((batch,), max_new_tokens or 10), pads=torch.zeros(batch, dtype=torch.long),
        )
        return state, self._logits(state)

    def step(self, tokens, state):
        self.steps += 1
        state.append(tokens)
        return self._logits(state)

    def reorder(self, state, index, *, same_sources=False):
        state.select(index, same_sources=same_sources)

    def _logits(self, state):
        rows = []
        for row in state.tokens[:, 1:].tolist():
            probs = self.table.get(tuple(row), {EOS_ID: 1.0})
            rows.append([math.log(probs[t]) if probs.get(t) else float("-inf") for t in range(self.vocab_size)])
        return torch.tensor(rows, dtype=torch.float64)
