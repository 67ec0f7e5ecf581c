"""Beam search with the GNMT length penalty, batched, for any :class:`~aiayn.decoding.protocol.Decoder`.

The paper (section 6.1) used beam size 4 and length penalty alpha = 0.6, with ``lp(Y) =
((5 + |Y|) / 6) ** alpha`` (Wu et al., 2016); a finished hypothesis is ranked by
``log P(Y | X) / lp(Y)``, where ``|Y|`` counts its generated tokens, EOS included.

Each step, every source keeps its ``K`` best unfinished beams from the ``2K`` best extensions
(so ``K`` survivors remain even when some of them end with EOS); an extension ending with EOS
becomes a finished hypothesis if it ranks among the ``K`` best. A source stops when it has ``K``
finished hypotheses and either ``early_stopping`` is set or no live beam can still beat the worst
of them, or when it reaches its length limit (its live beams are then finished as they are).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.decoding.adapters import as_decoder
from aiayn.decoding.processors import block_repeated_ngrams, suppress_tokens
from aiayn.decoding.protocol import Decoder
from aiayn.tokenization.special import EOS_ID, PAD_ID
from aiayn.validation import is_int, rule

__all__ = ["BeamConfig", "Hypothesis", "beam_search", "length_penalty"]

NEG_INF = float("-inf")


@dataclass(frozen=True, kw_only=True)
class BeamConfig:
    """Settings of beam search (defaults: the paper's, section 6.1); validated at construction.

    ``max_new_tokens``: ``None`` = source length + 50 per row (encoder-decoder only).
    ``n_best``: how many hypotheses to return per source (at most ``beam_size``).
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    no_repeat_ngram_size: int = 0
    early_stopping: bool = True
    n_best: int = 1
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    def __post_init__(self) -> None:
        rule(is_int(self.beam_size) and self.beam_size >= 1, "beam_size", self.beam_size, "must be an integer >= 1")
        rule(is_int(self.n_best) and 1 <= self.n_best <= self.beam_size, "n_best", self.n_best, f"must be an integer in [1, beam_size={self.beam_size}]")
        if self.max_new_tokens is not None:
            rule(is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be an integer >= 1 or None")
        rule(is_int(self.min_new_tokens) and self.min_new_tokens >= 0, "min_new_tokens", self.min_new_tokens, "must be an integer >= 0")
        if self.max_new_tokens is not None:
            rule(self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", self.min_new_tokens, f"must be <= max_new_tokens={self.max_new_tokens}")
        rule(is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size", self.no_repeat_ngram_size, "must be an integer >= 0 (0 = off)")
        rule(is_int(self.eos_id) and self.eos_id >= 0, "eos_id", self.eos_id, "must be an integer >= 0")


@dataclass(frozen=True)
class Hypothesis:
    """A finished hypothesis: generated ``tokens`` (ending with EOS unless cut at the length limit),
    their summed ``log_prob``, and ``score = log_prob / length_penalty(len(tokens), alpha)``."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``lp = ((5 + length) / 6) ** alpha`` (1 for ``alpha = 0``: no normalisation)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    decoder: Decoder | nn.Module, ids: Tensor, mask: Tensor | None = None, config: BeamConfig | None = None
) -> list[list[Hypothesis]]:
    """Beam search over a batch ``ids (B, L)`` (source, or left-padded prompt; ``mask`` ``True`` = real).

    Returns, per row, the ``config.n_best`` best :class:`Hypothesis`, best first. Raises
    ``ValueError`` for inputs the decoder rejects.
    """
    config = config if config is not None else BeamConfig()
    decoder = as_decoder(decoder)
    state, logits = decoder.start(ids, mask, max_new_tokens=config.max_new_tokens)
    batch, beams, alpha = state.batch_size, config.beam_size, config.length_penalty
    prefix_len = state.tokens.shape[1]
    max_new = state.max_new_tokens.tolist()
    device = logits.device

    expand = torch.arange(batch, device=device).repeat_interleave(beams)  # B rows -> B*K beams
    decoder.reorder(state, expand)
    logits = logits.index_select(0, expand)
    scores = torch.zeros(batch, beams, device=device)
    scores[:, 1:] = NEG_INF  # the K copies start identical: extend only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    done = [False] * batch

    for t in range(max(max_new)):  # t tokens generated so far
        log_probs = logits.float().log_softmax(dim=-1)  # (B*K, V)
        if config.no_repeat_ngram_size:
            log_probs = block_repeated_ngrams(log_probs, state.tokens, state.mask, config.no_repeat_ngram_size)
        if t < config.min_new_tokens:
            log_probs = suppress_tokens(log_probs, [config.eos_id])
        vocab = log_probs.shape[-1]
        candidates = (scores.view(-1, 1) + log_probs).view(batch, beams * vocab)  # (B, K*V)
        top_scores, top_index = candidates.topk(min(2 * beams, beams * vocab), dim=1)  # (B, 2K), best first
        top_beam, top_token = (top_index // vocab).tolist(), (top_index % vocab).tolist()
        top_scores_list = top_scores.tolist()

        next_scores = torch.full((batch, beams), NEG_INF, device=device)
        next_beam = torch.zeros(batch, beams, dtype=torch.long, device=device)
        next_token = torch.full((batch, beams), config.pad_id, dtype=torch.long, device=device)
        for b in range(batch):
            if done[b]:
                continue
            live: list[tuple[float, int, int]] = []
            for rank, (score, beam, token) in enumerate(zip(top_scores_list[b], top_beam[b], top_token[b])):
                if score == NEG_INF or len(live) == beams:
                    break
                if token == config.eos_id:
                    if rank < beams:
                        _add(finished[b], _generated(state.tokens, b * beams + beam, prefix_len) + [token], score, alpha, beams)
                else:
                    live.append((score, beam, token))
            if t + 1 >= max_new[b]:  # the length limit: live beams end here, without EOS
                for score, beam, token in live:
                    _add(finished[b], _generated(state.tokens, b * beams + beam, prefix_len) + [token], score, alpha, beams)
                done[b] = True
                continue
            for k, (score, beam, token) in enumerate(live):
                next_scores[b, k], next_beam[b, k], next_token[b, k] = score, beam, token
            best_live = live[0][0] if live else NEG_INF
            done[b] = _source_done(finished[b], best_live, t + 1, max_new[b], config)
        if all(done):
            break
        # Every beam stays with its source: the encoder output and cross-attention keys are kept as they are.
        decoder.reorder(state, (torch.arange(batch, device=device)[:, None] * beams + next_beam).view(-1), same_sources=True)
        scores = next_scores
        logits = decoder.step(next_token.view(-1), state)

    return [sorted(hyps, key=lambda h: -h.score)[: config.n_best] for hyps in finished]


def _generated(tokens: Tensor, row: int, prefix_len: int) -> list[int]:
    return tokens[row, prefix_len:].tolist()


def _add(hyps: list[Hypothesis], tokens: list[int], log_prob: float, alpha: float, keep: int) -> None:
    """Add a finished hypothesis, keeping the ``keep`` best by score."""
    hyps.append(Hypothesis(tokens, log_prob, log_prob / length_penalty(len(tokens), alpha)))
    hyps.sort(key=lambda h: -h.score)
    del hyps[keep:]


def _source_done(hyps: list[Hypothesis], best_live: float, length: int, max_len: int, config: BeamConfig) -> bool:
    """Whether a source can stop: ``K`` finished and (early stopping, or no live beam can win)."""
    if len(hyps) < config.beam_size:
        return False
    if config.early_stopping or best_live == NEG_INF:
        return True
    # A live beam's log-prob (<= 0) only falls; its score is best at the length that maximises lp:
    # the longest allowed for alpha > 0, the shortest (one more token) otherwise.
    best_length = max_len if config.length_penalty > 0 else length + 1
    return best_live / length_penalty(best_length, config.length_penalty) <= hyps[-1].score

