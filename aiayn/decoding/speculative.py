"""Speculative decoding: a cheap drafter proposes up to K tokens, and the target model checks them all
in one forward over its cache, which is then cropped back to the tokens that were accepted.

Drafters: prompt lookup (the continuation of the last earlier occurrence of the current n-gram in
prompt + output, as Hugging Face's ``prompt_lookup_num_tokens``, which takes the first occurrence
instead) and a smaller draft model of the same tokenizer. Each emitted token is chosen from the
target's own logits, as plain decoding chooses it: greedy output is plain greedy, token for token.
Sampling keeps the target distribution by the rule of Leviathan et al. 2023 / Chen et al. 2023:
keep a draft ``d ~ q`` with probability ``min(1, p(d) / q(d))``, else draw from ``norm(max(0, p - q))``.
For prompt lookup ``q`` is a point mass, and the rule is "sample from ``p``; keep the draft if they agree".

:class:`SpeculativeDecoder` meets the :class:`~aiayn.decoding.protocol.Decoder` protocol for one
sequence at a time; :func:`~aiayn.decoding.generation.generate_steps` asks it to :meth:`~SpeculativeDecoder.choose`
each token. Caches that cannot roll back (local attention's ring buffer, linear attention's and the
SSM's recurrent states) are refused at construction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from aiayn.decoding.adapters import KV_CACHE_SETTINGS, CausalLMDecoder, Seq2SeqDecoder, as_decoder
from aiayn.decoding.protocol import DecodeState
from aiayn.decoding.sampling import GenerationConfig, argmax_last, logits_to_probs, next_token, next_token_probs, sample
from aiayn.inference.gemv import FEW_ROWS
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.cache import KV_AUTO
from aiayn.nn.positional import LearnedPositions
from aiayn.validation import is_int, rule

__all__ = [
    "SPECULATIVE_MODES", "DEFAULT_DRAFT_TOKENS", "DEFAULT_NGRAM", "SpeculativeDecoder", "PromptLookup", "DraftModel",
    "accept_or_resample", "check_same_vocabulary", "lookup_continuation", "NgramIndex",
]

log = logging.getLogger(__name__)

SPECULATIVE_MODES = ("prompt-lookup", "draft")
# The most drafts a check takes (a run asks for fewer after a rejected one: SpeculativeDecoder): the last token and
# 7 drafts are the most rows the C++ step's Linear layers take through our kernel, each weight row read once for them
# all, as the one-token step reads it; more go to a matrix product, whose call cost a small model 77 us against ours'
# few (the copying model on a Zen 4 EPYC, 2026-12-07: prompt lookup 2.32-2.43x plain greedy at K = 7, 1.99-2.11x at 10).
DEFAULT_DRAFT_TOKENS = FEW_ROWS - 1
DEFAULT_NGRAM = 3


def accept_or_resample(p: Tensor, q: Tensor, draft: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """The token ``(B,)`` that replaces ``draft (B,)`` drawn from ``q (B, V)``, given the target's ``p (B, V)``:
    ``draft`` with probability ``min(1, p/q)``, else a draw from ``norm(max(0, p - q))``, so the result is
    distributed as ``p`` (Leviathan et al. 2023, algorithm 1)."""
    p_draft = p.gather(1, draft[:, None])[:, 0]
    q_draft = q.gather(1, draft[:, None])[:, 0]
    u = torch.rand(draft.shape, generator=generator, device=generator.device if generator is not None else p.device)
    keep = u.to(p.device) * q_draft < p_draft  # u < p/q without dividing; q(draft) > 0 as draft ~ q
    residual = (p - q).clamp_min(0.0)
    total = residual.sum(dim=1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), p)  # p == q: never rejected
    return torch.where(keep, draft, sample(residual, generator))


def lookup_continuation(history: list[int], ngram: int, count: int) -> list[int]:
    """Prompt lookup: the ``count`` tokens after the last earlier occurrence of the final n-gram of ``history``,
    trying ``n = ngram, ngram - 1, ..., 1``; ``[]`` when no suffix occurred before. Where the copy runs past the
    end of ``history`` (the occurrence is fewer than ``count`` tokens back) it goes on copying its own drafts:
    text that repeats with that period is guessed to keep repeating, as a loop of greedy decoding does. (A scan of
    the history; a run's drafter asks :class:`NgramIndex`, which answers the same without one.)"""
    length = len(history)
    for n in range(min(ngram, length - 1), 0, -1):
        suffix = history[length - n :]
        for start in range(length - n - 1, -1, -1):  # the last occurrence first: the most recent copy
            if history[start : start + n] == suffix:
                return _copy_after(history, start + n, count)
    return []


def _copy_after(history: list[int], at: int, count: int) -> list[int]:
    """``count`` tokens of ``history`` from ``at`` on, copied on with period ``len(history) - at`` past its end."""
    drafts = history[at : at + count]
    while len(drafts) < count:  # at + i >= length: the token i - period places back
        drafts.append(drafts[at + len(drafts) - len(history)])
    return drafts


class NgramIndex:
    """:func:`lookup_continuation` for one run's history, which only grows: the last start of every n-gram (n = 1 ..
    ``ngram``) that a known token follows, kept as the history grows, so that a lookup costs a few dictionary reads
    whatever the history's length (where nothing matched, the scan took 63 us at 240 tokens and 602 at 2,000; the index 1;
    docs/benchmarks.md)."""

    def __init__(self, ngram: int) -> None:
        self.ngram = ngram
        self.starts: dict[tuple[int, ...], int] = {}
        self.ends = 0  # the n-grams ending before this position are in `starts`

    def continuation(self, history: list[int], count: int) -> list[int]:
        """``lookup_continuation(history, ngram, count)``, for a ``history`` that extends the one of the last call."""
        length, starts = len(history), self.starts
        if length <= self.ends:  # not an extension of the last history (shorter): index this one from its start
            starts.clear()
            self.ends = 0
        for end in range(self.ends, length - 1):  # each n-gram ending at `end`, the token after it known
            for n in range(1, min(self.ngram, end + 1) + 1):
                starts[tuple(history[end - n + 1 : end + 1])] = end - n + 1  # later starts replace earlier ones
        self.ends = max(0, length - 1)
        for n in range(min(self.ngram, length - 1), 0, -1):
            start = starts.get(tuple(history[length - n :]))
            if start is not None:
                return _copy_after(history, start + n, count)
        return []


def check_same_vocabulary(target: nn.Module, draft: nn.Module, name: str = "draft_model") -> None:
    """``ValueError`` naming ``name`` unless ``draft`` has the target's family, vocabulary size and padding id."""
    if type(draft) is not type(target):
        raise ValueError(f"{name}: a {type(draft).__name__} cannot draft for a {type(target).__name__}: give a smaller model of the same family")
    for key in ("vocab_size", "target_vocab_size", "pad_id"):
        mine, theirs = getattr(target.config, key, None), getattr(draft.config, key, None)
        if mine != theirs:
            raise ValueError(f"{name}: its {key}={theirs!r} differs from the target's {key}={mine!r}: "
                             "a draft model must share the target's tokenizer (same vocabulary and special ids)")


class Drafter(Protocol):
    """Proposes the tokens after ``state``'s sequence; ``start`` prepares a run (its result is kept in the state)."""

    def start(self, ids: Tensor, mask: Tensor | None, max_new_tokens: int | None) -> object: ...

    def propose(
        self, sequence: list[int], count: int, run: object, config: GenerationConfig | None, generator: torch.Generator | None
    ) -> tuple[list[int], list[Tensor | None]]:
        """Up to ``count`` draft tokens after ``sequence`` (the ids so far, padding left out), and the distribution ``(1, V)`` each was drawn
        from (``None``: chosen outright, a point mass)."""
        ...


class PromptLookup:
    """Drafts by copying: see :func:`lookup_continuation`."""

    def __init__(self, ngram: int = DEFAULT_NGRAM) -> None:
        rule(is_int(ngram) and ngram >= 1, "ngram", ngram, "must be an integer >= 1 (the longest n-gram looked up)")
        self.ngram = ngram

    def start(self, ids: Tensor, mask: Tensor | None, max_new_tokens: int | None) -> object:
        return NgramIndex(self.ngram)  # the run's: its history grows by the tokens emitted

    def propose(
        self, sequence: list[int], count: int, run: object, config: GenerationConfig | None, generator: torch.Generator | None
    ) -> tuple[list[int], list[Tensor | None]]:
        assert isinstance(run, NgramIndex), "the run's state is what start() returned"
        drafts = run.continuation(sequence, count)
        return drafts, [None] * len(drafts)


class DraftModel:
    """Drafts with a smaller model of the same tokenizer, decoded as the target is (a static cache, the C++ step where it
    applies, ``kv_dtype="auto"``), its cache cropped to what the target accepted before each proposal (a growing cache
    would concatenate every layer's keys and values at each draft step)."""

    def __init__(self, model: nn.Module) -> None:
        _check_croppable(model, "draft model")
        self.decoder = (CausalLMDecoder(model, static_cache=True, kv_dtype=KV_AUTO) if isinstance(model, DecoderOnly)
                        else as_decoder(model, static_cache=True))
        self.model = model

    def start(self, ids: Tensor, mask: Tensor | None, max_new_tokens: int | None) -> object:
        if not _fits(self.model, ids, max_new_tokens):
            return None  # no drafts for this run
        state, _ = self.decoder.start(ids, mask, max_new_tokens=max_new_tokens)
        return state

    def propose(
        self, sequence: list[int], count: int, run: object, config: GenerationConfig | None, generator: torch.Generator | None
    ) -> tuple[list[int], list[Tensor | None]]:
        if not isinstance(run, DecodeState):  # the run outgrows the draft model's learned positions
            return [], []
        decoder = self.decoder
        assert isinstance(decoder, (CausalLMDecoder, Seq2SeqDecoder))
        fed = run.tokens[0].tolist()
        same = next((i for i, (a, b) in enumerate(zip(fed, sequence)) if a != b), min(len(fed), len(sequence)))  # the common prefix
        same = min(same, len(sequence) - 1)  # feed at least the last token: its logits come next
        run.crop(same)
        logits = decoder.extend(torch.tensor([sequence[same:]], device=run.tokens.device), run)[:, -1]  # (1, V)
        drafts: list[int] = []
        probs: list[Tensor | None] = []
        for index in range(count):
            if config is None or config.greedy:
                token, q = argmax_last(logits), None
            else:
                q = logits_to_probs(logits, config.temperature, config.top_k, config.top_p, config.min_p)
                token = sample(q, generator)
            drafts.append(int(token))
            probs.append(q)
            if index + 1 < count:
                logits = decoder.step(token, run)
        return drafts, probs


@dataclass
class _Checked:
    """A draft token fed to the target, the distribution it was drawn from, and the target's logits after it."""

    token: int
    q: Tensor | None
    logits: Tensor  # (1, V)


@dataclass
class SpeculativeState(DecodeState):
    """The sequence as emitted (``tokens``, ``mask``) over the target's own state ``inner``, which runs ahead by
    the drafts still unconfirmed (``checked``); ``run``: the drafter's per-run state; ``prefix``: prompt columns;
    ``config``/``generator``: the run's settings, recorded by :meth:`SpeculativeDecoder.choose` (``None``: greedy drafts);
    ``plain``: decode without drafts (the run outgrows learned positions); ``draft_length``: the drafts asked
    for next (see :meth:`SpeculativeDecoder.step`); ``drafted``: how many the last forward checked; ``history``: the ids
    emitted so far, padding left out, as the drafters read them (a list: one append a token, no copy)."""

    inner: DecodeState | None = None
    checked: list[_Checked] = field(default_factory=list)
    draft_length: int = 1
    drafted: int = 0
    run: object = None
    prefix: int = 0
    config: GenerationConfig | None = None
    generator: torch.Generator | None = None
    plain: bool = False
    history: list[int] = field(default_factory=list)


class SpeculativeDecoder:
    """Decode one sequence speculatively: ``SpeculativeDecoder(model, mode="prompt-lookup" | "draft", ...)``.

    ``target``: a generative model, or its :class:`CausalLMDecoder` / :class:`Seq2SeqDecoder` with a cache
    (``static_cache=True`` works). ``draft_tokens``: K, the most draft tokens checked per target forward; a run
    starts at K, asks for one fewer after a rejected draft and two more (up to K) after a forward whose drafts
    were all accepted (Hugging Face's "heuristic" schedule), so a wrong guess wastes ever smaller forwards.
    ``ngram``: prompt lookup's longest n-gram. ``draft_model``: mode ``"draft"``'s smaller model.
    Raises ``ValueError`` for an unknown mode, K < 1, a draft model with another vocabulary, or a model
    whose cache cannot roll back (``attention='local'``/``'linear'``, ``mixer='ssm'``) or whose rows are not computed
    apart (``quantize='int8-dynamic'``).
    ``drafted``/``accepted`` count the draft tokens of the last run (:attr:`acceptance_rate`).
    """

    def __init__(
        self, target: nn.Module | CausalLMDecoder | Seq2SeqDecoder, *, mode: str = "prompt-lookup",
        draft_tokens: int = DEFAULT_DRAFT_TOKENS, ngram: int = DEFAULT_NGRAM, draft_model: nn.Module | None = None,
    ) -> None:
        rule(mode in SPECULATIVE_MODES, "speculative", mode, f"must be one of {SPECULATIVE_MODES}")
        rule(is_int(draft_tokens) and draft_tokens >= 1, "draft_tokens", draft_tokens,
             "must be an integer >= 1 (the draft tokens the target checks per forward)")
        decoder = as_decoder(target) if isinstance(target, nn.Module) else target
        if not isinstance(decoder, (CausalLMDecoder, Seq2SeqDecoder)) or not decoder.use_cache:
            raise ValueError("speculative decoding needs a CausalLMDecoder or Seq2SeqDecoder with use_cache=True "
                             f"(it crops the cache), got {type(target).__name__}")
        _check_croppable(decoder.model, "model")
        _check_row_independent(decoder.model)
        self.drafter: Drafter
        if mode == "draft":
            if draft_model is None:
                raise ValueError("speculative='draft' needs draft_model (a smaller model of the same tokenizer); "
                                 "or use speculative='prompt-lookup', which needs none")
            check_same_vocabulary(decoder.model, draft_model)
            self.drafter = DraftModel(draft_model)
        else:
            if draft_model is not None:
                raise ValueError("draft_model is used by speculative='draft' only, got speculative='prompt-lookup'")
            self.drafter = PromptLookup(ngram)
        self.target, self.mode, self.draft_tokens = decoder, mode, draft_tokens
        self.drafted = self.accepted = self.forwards = 0

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens of the last run (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @torch.no_grad()
    def start(self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None) -> tuple[DecodeState, Tensor]:
        """Prefill one row ``ids (1, L)``. Raises ``ValueError`` for more rows. A run that would outgrow learned
        positions (whose window is then re-encoded without a cache) is decoded plainly, without drafts."""
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"speculative decoding decodes one sequence: ids must have shape (1, L), got {got} "
                             "(decode the rows one by one, or without speculative decoding)")
        if mask is not None and mask.shape == ids.shape and not bool(mask.all()):
            ids, mask = ids[:, mask[0].to(ids.device)], None  # one row needs no padding: drafters then see its tokens only
        inner, logits = self.target.start(ids, mask, max_new_tokens=max_new_tokens)
        self.drafted = self.accepted = 0
        self.forwards = 1
        state = SpeculativeState(
            tokens=inner.tokens, mask=inner.mask, max_new_tokens=inner.max_new_tokens, pads=inner.pads,
            inner=inner, run=self.drafter.start(ids, mask, max_new_tokens), prefix=inner.tokens.shape[1],
            plain=isinstance(self.target, CausalLMDecoder) and not _fits(self.target.model, ids, max_new_tokens),
            draft_length=self.draft_tokens, history=inner.tokens[0][inner.mask[0]].tolist(),
        )
        if state.plain:
            log.info("speculative decoding: prompt + max_new_tokens outgrow learned positions; decoding this run plainly")
        return state, logits

    def choose(
        self, logits: Tensor, state: DecodeState, n_generated: Tensor, config: GenerationConfig, generator: torch.Generator | None = None
    ) -> Tensor:
        """The next token ``(1,)``: plain :func:`~aiayn.decoding.sampling.next_token`, or, for a sampled draft,
        :func:`accept_or_resample` against the distribution :func:`next_token` samples from."""
        checked: list[_Checked] = []
        if isinstance(state, SpeculativeState):  # the draft model samples its drafts with the same settings
            state.config, state.generator = config, generator
            checked = state.checked
        if config.greedy or not checked or checked[0].q is None:
            token = next_token(logits, state, n_generated, config, generator)
        else:
            draft = torch.tensor([checked[0].token], device=logits.device)
            q = checked[0].q.to(logits.device)
            token = accept_or_resample(next_token_probs(logits, state, n_generated, config), q, draft, generator)
        if checked and int(token.item()) == checked[0].token:
            self.accepted += 1  # counted here: the last token is chosen but never fed
        return token

    def step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        """Feed the emitted token ``(1,)``: the logits checked with it if it is the next draft, else draft
        again after it and check the drafts in one forward of the target. (Not under ``no_grad`` itself: the target's
        forwards and the draft model's are; a token taken from a check computes nothing.)"""
        if not isinstance(state, SpeculativeState) or state.inner is None:
            raise ValueError("state was not made by SpeculativeDecoder.start")
        if state.plain:
            state.append(tokens)
            return self.target.step(tokens, state.inner)
        token = int(tokens.item())
        state.history.append(token)
        inner, length = state.inner, state.tokens.shape[1] + 1
        if state.checked and state.checked[0].token == token:
            # the target was fed this draft at the next column: the sequence is a view of the target's (no copy a token)
            state.tokens, state.mask = inner.tokens[:, :length], inner.mask[:, :length]
            return state.checked.pop(0).logits
        inner.crop(length - 1)  # forget the drafts not taken
        if state.drafted:  # a draft still unconfirmed was rejected: ask for fewer; none left: all accepted, ask for more
            shorter, longer = max(1, state.draft_length - 1), min(self.draft_tokens, state.draft_length + 2)
            state.draft_length = shorter if state.checked else longer
        state.checked = []
        remaining = int(state.max_new_tokens[0]) - (length - state.prefix)  # tokens still to emit
        drafts: list[int] = []
        probs: list[Tensor | None] = []
        if remaining > 0:
            drafts, probs = self.drafter.propose(state.history, min(state.draft_length, remaining), state.run, state.config, state.generator)
        fed = torch.tensor([[token, *drafts]], dtype=torch.long, device=inner.tokens.device)
        rows = self.target.extend(fed, inner).unbind(1)  # each fed token's logits (1, V)
        state.tokens, state.mask = inner.tokens[:, :length], inner.mask[:, :length]  # the token is the target's, at length - 1
        self.forwards += 1
        self.drafted += len(drafts)
        state.drafted = len(drafts)
        state.checked = [_Checked(d, q, row) for d, q, row in zip(drafts, probs, rows[1:])]
        return rows[0]

    def reorder(self, state: DecodeState, index: Tensor, *, same_sources: bool = False) -> None:
        raise ValueError("speculative decoding decodes one sequence and does not reorder rows (beam search): "
                         "use greedy decoding or sampling")


def _check_croppable(model: nn.Module, name: str) -> None:
    """``ValueError`` for a model whose generation cache cannot roll back to the accepted tokens."""
    for key, works in KV_CACHE_SETTINGS.items():
        value = getattr(model.config, key, works)
        if value != works:
            raise ValueError(f"speculative decoding rolls the {name}'s cache back to the accepted tokens, which "
                             f"model.{key}={value} cannot (its cache is a ring buffer or a recurrent state); it works "
                             f"with model.{key}={works}: decode this model without speculative decoding")


def _check_row_independent(model: nn.Module) -> None:
    """``ValueError`` for a model whose rows are not computed apart (int8-dynamic layers quantise a call's rows with
    one range): the K + 1 rows the target checks at once would differ from the one-token steps of plain decoding."""
    from aiayn.inference.int8_dynamic import Int8DynamicLinear

    if any(isinstance(m, Int8DynamicLinear) for m in model.modules()):
        raise ValueError("speculative decoding keeps a draft token only where the target's check of several tokens at once "
                         "equals plain decoding, which quantize='int8-dynamic' cannot promise (a call's rows share one "
                         "activation range); it works with quantize='int8' (weight-only), int4 or none")


def _fits(model: nn.Module, ids: Tensor, max_new_tokens: int | None) -> bool:
    """Whether a decoder-only run stays within learned positions (past them the cache is dropped)."""
    positions = getattr(model, "positions", None)
    return not (isinstance(positions, LearnedPositions) and max_new_tokens is not None and ids.shape[1] + max_new_tokens > positions.max_len)
