"""Log-probabilities of completions in OpenAI's legacy shape (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``): what lm-evaluation-harness reads to score text.

They are the model's own distribution (``log_softmax`` of its logits, before ``logit_bias``, the
penalties and the temperature), as vLLM reports by default, so they do not depend on how a token was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["MAX_LOGPROBS", "TokenLogprobs", "legacy_logprobs", "prompt_logprobs"]

MAX_LOGPROBS = 20  # OpenAI's limit on ``logprobs`` (alternatives per token)


@dataclass
class TokenLogprobs:
    """Tokens with their log-probability (``None``: not scored, e.g. a prompt's first token) and
    their ``top`` alternatives as ``(id, log-probability)`` pairs (``None``: none asked for)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    tops: list[list[tuple[int, float]] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, logits: Tensor, token: int, k: int | None, *, score: bool = True) -> None:
        """Record ``token`` chosen from ``logits (V,)``, with its log-probability when ``score`` and the top ``k``."""
        if not score:
            self.append(token, None, None)
            return
        log_probs = logits.float().log_softmax(dim=-1)
        self.append(token, float(log_probs[token]), _top(log_probs, k))

    def append(self, token: int, logprob: float | None, top: list[tuple[int, float]] | None) -> None:
        self.ids.append(token)
        self.logprobs.append(logprob)
        self.tops.append(top)

    def drop_last(self) -> None:
        for part in (self.ids, self.logprobs, self.tops):
            part.pop()

    def since(self, start: int) -> TokenLogprobs:
        return TokenLogprobs(self.ids[start:], self.logprobs[start:], self.tops[start:])

    def total(self) -> float:
        return sum(lp for lp in self.logprobs if lp is not None)

    def __add__(self, other: TokenLogprobs) -> TokenLogprobs:
        return TokenLogprobs(self.ids + other.ids, self.logprobs + other.logprobs, self.tops + other.tops)


@torch.no_grad()
def prompt_logprobs(model: nn.Module, ids: Tensor, writable: int, k: int | None) -> TokenLogprobs:
    """The log-probability of each token of the prompt ``ids (1, P)`` given the ones before it (the
    first: ``None``), with the top ``k`` alternatives at each position (OpenAI's ``echo``)."""
    logits = model(ids, torch.ones_like(ids, dtype=torch.bool))[0, :-1, :writable]  # (P-1, V): predicts tokens 1..P-1
    log_probs = logits.float().log_softmax(dim=-1)
    tokens = ids[0].tolist()
    out = TokenLogprobs()
    out.append(tokens[0], None, None)
    chosen = log_probs.gather(-1, ids[0, 1:, None].to(log_probs.device))[:, 0].tolist()
    for t, (token, lp) in enumerate(zip(tokens[1:], chosen)):
        out.append(token, lp, _top(log_probs[t], k))
    return out


def legacy_logprobs(
    scores: TokenLogprobs, decode: Callable[[Sequence[int]], str], *, offset: int = 0, as_ids: bool = False
) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs`` object for ``scores``; ``text_offset`` counts characters of the
    choice's text from ``offset`` (``decode`` of the tokens before each one). ``as_ids``: tokens as ``"token_id:N"`` (vLLM's
    ``return_tokens_as_token_ids``), which stay exact where a token is part of a character."""

    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else decode([token])

    tops: list[dict[str, float] | None] = []
    for top in scores.tops:
        tops.append(None if top is None else {name(t): lp for t, lp in top})
    return {
        "tokens": [name(t) for t in scores.ids],
        "token_logprobs": list(scores.logprobs),
        "top_logprobs": tops,
        "text_offset": [offset + len(decode(scores.ids[:i])) for i in range(len(scores.ids))],
    }


def _top(log_probs: Tensor, k: int | None) -> list[tuple[int, float]] | None:
    if k is None:
        return None
    if k == 0:
        return []
    top = log_probs.topk(min(k, log_probs.shape[-1]))
    return list(zip(top.indices.tolist(), top.values.tolist()))
