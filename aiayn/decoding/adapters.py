"""The two generative families behind the :class:`~aiayn.decoding.protocol.Decoder` protocol.

* :class:`Seq2SeqDecoder` (encoder-decoder): encodes the source once; its cross-attention keys and
  values are projected on the first step and then read from the cache (reordering beams copies them).
* :class:`CausalLMDecoder` (decoder-only): prefills a left-padded prompt in one pass. Row ``b``'s
  column ``c`` is position ``c - pads[b]`` (per-row offsets), and the key padding mask covers the
  cached and the new positions, so a padded batch gives each row the logits it would get alone.

``use_cache=False`` recomputes the whole prefix every step (the reference the cache is tested
against); ``static_cache=True`` preallocates the cache for the longest possible output, and
``compile=True`` (decoder-only) compiles the one-token step over it. Every path runs the model's
own ``forward`` with an explicit cache object (:mod:`aiayn.nn.cache`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.decoding.native_step import native_step
from aiayn.decoding.protocol import SOURCE_EXTRA_TOKENS, Decoder, DecodeState
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.nn.cache import KV_AUTO, KV_DTYPES, KVCache, LayerCache, StaticLayerCache
from aiayn.nn.masks import check_padding_mask
from aiayn.nn.multihead import MultiHeadAttention
from aiayn.nn.positional import LearnedPositions, PositionalEncoding, SinusoidalPositions
from aiayn.tokenization.special import BOS_ID

__all__ = ["Seq2SeqDecoder", "CausalLMDecoder", "StaticState", "as_decoder", "auto_kv_dtype"]

log = logging.getLogger(__name__)

# The settings whose layers keep keys and values (a cache that can be static, and cropped), and the value that does.
KV_CACHE_SETTINGS = {"mixer": "attention", "attention": "softmax"}


class Seq2SeqDecoder:
    """Decode an :class:`EncoderDecoder`: ``start(src (B, S), src_mask (B, S))`` then one token per step.

    Without ``max_new_tokens`` each row may generate its source length + 50 tokens (section 6.1),
    capped by learned target positions. Every row starts from ``bos_id``.
    """

    def __init__(self, model: EncoderDecoder, *, use_cache: bool = True, static_cache: bool = False, bos_id: int = BOS_ID) -> None:
        if static_cache and not use_cache:
            raise ValueError("static_cache=True needs use_cache=True")
        _warn_if_training(model)
        self.model, self.use_cache, self.static_cache, self.bos_id = model, use_cache, static_cache, bos_id

    @property
    def vocab_size(self) -> int:
        return self.model.config.target_vocab_size

    @torch.no_grad()
    def start(self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None) -> tuple[DecodeState, Tensor]:
        """Encode ``ids (B, S)`` (``mask``: ``True`` = real token; default ``ids != pad_id``); feed BOS.

        Raises ``ValueError`` for an all-padding row or ``max_new_tokens`` beyond learned positions.
        """
        model = self.model
        ids, mask = _inputs(ids, mask, model.config.pad_id, _device(model), "src")
        batch = ids.shape[0]
        lengths = mask.sum(dim=1) if mask is not None else torch.full((batch,), ids.shape[1], device=ids.device)
        limit = _position_limit(model.tgt_positions)  # target positions 0 .. max_new_tokens - 1 are fed
        if max_new_tokens is None:
            max_new = lengths + SOURCE_EXTRA_TOKENS
            if limit is not None:
                max_new = max_new.clamp(max=limit)
        else:
            _check_max_new(max_new_tokens, limit, "the target's learned positions")
            max_new = torch.full((batch,), max_new_tokens, device=ids.device)
        memory = model.encode(ids, mask)  # (B, S, D): once per source
        cache = None
        if self.use_cache:
            cache = model.new_cache(max_len=1 + int(max_new.max()) if self.static_cache else None)
        bos = torch.full((batch,), self.bos_id, dtype=torch.long, device=ids.device)
        state = DecodeState(
            tokens=bos[:, None], mask=torch.ones(batch, 1, dtype=torch.bool, device=ids.device),
            max_new_tokens=max_new.long(), pads=torch.zeros(batch, dtype=torch.long, device=ids.device),
            cache=cache, memory=memory, memory_mask=mask,
        )
        return state, self._logits(state, bos[:, None])

    @torch.no_grad()
    def step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        state.append(tokens)
        return self._logits(state, tokens[:, None])

    def reorder(self, state: DecodeState, index: Tensor, *, same_sources: bool = False) -> None:
        state.select(index, same_sources=same_sources)

    @torch.no_grad()
    def extend(self, tokens: Tensor, state: DecodeState) -> Tensor:
        """Feed ``tokens (B, T)`` in one pass over the cache (speculative decoding's check); logits ``(B, T, V)``."""
        if state.cache is None or state.memory is None:
            raise ValueError("extend needs a state started with use_cache=True")
        state.tokens = torch.cat([state.tokens, tokens], dim=1)
        state.mask = torch.cat([state.mask, state.mask.new_ones(tokens.shape)], dim=1)
        return self.model.decode(tokens, state.memory, src_mask=state.memory_mask, cache=state.cache)

    def _logits(self, state: DecodeState, new: Tensor) -> Tensor:
        if state.memory is None:
            raise ValueError("state has no encoder output (memory): start() it with this decoder")
        if state.cache is not None:
            logits = self.model.decode(new, state.memory, src_mask=state.memory_mask, cache=state.cache)
        else:
            logits = self.model.decode(state.tokens, state.memory, src_mask=state.memory_mask, tgt_mask=state.mask)
        return logits[:, -1]  # (B, V)


@dataclass
class StaticState(DecodeState):
    """A :class:`DecodeState` over a static cache, plus ``key_mask (B, S_max)`` (``False`` at left padding;
    ``None`` without padding, unless the step is compiled) and ``column (1,)``, the cache column of the next
    token (a tensor updated in place, so compiled steps never recompile)."""

    key_mask: Tensor | None = None
    column: Tensor | None = None

    def select(self, index: Tensor, *, same_sources: bool = False) -> None:
        super().select(index, same_sources=same_sources)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)

    def crop(self, length: int) -> None:
        super().crop(length)
        if self.column is not None:
            self.column.fill_(length)


def auto_kv_dtype(model: nn.Module) -> torch.dtype | None:
    """The KV cache's dtype for ``kv_dtype="auto"``: bf16 where ``model``'s Linear layers hold weight-only int8 or int4
    weights under fp32 activations, else ``None`` (the activations'). Those models' logits already carry the weights'
    rounding, and a cache in bf16 made GPT-2 small's int8 and int4 decoding 6-9% faster after a 512-token prompt (with
    AVX-512 code, and AVX2 code built for the same machine) and the same or faster after 16 (docs/benchmarks.md); fp32
    weights gained nothing from it and keep Hugging Face's tokens with an fp32 cache; int8-dynamic layers (not weight-only:
    :class:`~aiayn.inference.int8_dynamic.Int8DynamicLinear`) decoded 2-8% slower with it, and keep it too."""
    from aiayn.inference.int4 import Int4Linear  # here: the inference package imports decoding
    from aiayn.inference.int8_dynamic import Int8DynamicLinear
    from aiayn.inference.quantization import Int8Linear

    if not any(isinstance(m, (Int8Linear, Int4Linear)) and not isinstance(m, Int8DynamicLinear) for m in model.modules()):
        return None
    activations = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return torch.bfloat16 if activations == torch.float32 else None


class CausalLMDecoder:
    """Decode a :class:`DecoderOnly`: ``start(prompt (B, P), mask (B, P), max_new_tokens=N)``.

    Prompts must be left-padded (see :func:`~aiayn.decoding.protocol.left_pad`); ``mask`` defaults
    to ``ids != pad_id``. With learned positions, a sequence longer than ``max_len`` keeps going on
    its last ``max_len`` tokens (nanoGPT's crop): every position then shifts at each step, so the
    window is re-encoded from scratch (cached keys would hold the old positions).

    ``static_cache=True``: softmax attention keeps its keys and values in buffers preallocated for prompt
    + new tokens (:class:`~aiayn.nn.cache.StaticLayerCache`: fixed buffers, attention over the filled
    columns only); the ring buffer of local attention and the states of linear attention and the SSM are of
    fixed size anyway; ALiBi (its bias counts keys from the last column) and runs past learned positions
    keep the growing cache. ``compile=True`` (implies it) compiles the one-token step (``fullgraph=True``)
    and raises ``ValueError`` at once for a model without a static KV cache: one graph for every prompt
    length, ``max_new_tokens`` and step (the filled width and the buffers' length are dynamic, the rest
    static), whose guards check layer 0 for all layers (:func:`_step_guards`) and whose weights are frozen into
    it (:func:`compiled_step`): build a new decoder after changing the model's layers or weights. The prefill
    checks the prompt's ids; a compiled step does not check the model's own tokens. Without ``compile``, the
    one-token steps over either cache run in C++ where the model allows it (:mod:`aiayn.decoding.native_step`: the same
    kernels without the Python between them; the same contract on weights); ``native=False`` keeps them in the model's
    forward. ``kv_dtype`` (not with ``compile``): the dtype the KV cache, static or growing, keeps keys and values in
    (:data:`~aiayn.nn.cache.KV_DTYPES`; ``None``: the activations'): ``torch.bfloat16`` under fp32 activations halves the
    cache's memory and the bytes each step reads from it, its values rounded to bf16 once as they are written and widened
    exactly as they are read. ``"auto"`` (what ``aiayn generate``, ``aiayn serve`` and ``aiayn.load(...).generate`` pass
    by default): :func:`auto_kv_dtype`'s choice for the model, ``None`` with ``compile`` or without a cache.
    """

    def __init__(self, model: DecoderOnly, *, use_cache: bool = True, static_cache: bool = False, compile: bool = False,
                 native: bool = True, kv_dtype: torch.dtype | str | None = None) -> None:
        if kv_dtype == KV_AUTO:
            kv_dtype = auto_kv_dtype(model) if use_cache and not compile else None
        if (static_cache or compile) and not use_cache:
            raise ValueError(f"{'compile' if compile else 'static_cache'}=True needs use_cache=True")
        blocker = _static_blocker(model)
        if compile and blocker is not None:
            raise ValueError(f"compile=True needs a static KV cache (softmax attention, positions other than alibi); this model "
                             f"has {blocker}: decode it without compile (static_cache=True keeps its constant-size cache)")
        if kv_dtype is not None:
            if kv_dtype not in KV_DTYPES:
                raise ValueError(f"kv_dtype={kv_dtype!r}: a KV cache keeps keys and values in one of "
                                 f"{', '.join(map(str, KV_DTYPES))}, None (the activations' dtype) or {KV_AUTO!r}")
            if compile or not use_cache:
                raise ValueError(f"kv_dtype={kv_dtype} is the KV cache's, decoded without compile; got "
                                 f"{'compile=True' if compile else 'use_cache=False'}")
        self.kv_dtype: torch.dtype | None = kv_dtype  # KV_AUTO resolved above
        _warn_if_training(model)
        self.model, self.use_cache, self.compiled = model, use_cache, compile
        self.static_cache = (static_cache or compile) and blocker is None
        # the one-token step in C++ where it applies (aiayn.decoding.native_step), over either cache; else the model's forward
        self._native = native_step(model) if native and use_cache and not compile else None
        self._step = _chosen_step(model) if compile else (self._native or _decode_one)
        # ALiBi's bias measures key positions by column (0..S-1), so it gets column offsets; its
        # scores depend only on distances, which left padding does not change.
        self._column_positions = model.positions.kind in ("alibi", "none")
        self._window = _position_limit(model.positions)  # learned positions: a sliding window of max_len

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @torch.no_grad()
    def start(self, ids: Tensor, mask: Tensor | None = None, *, max_new_tokens: int | None = None) -> tuple[DecodeState, Tensor]:
        """Prefill the prompt ``ids (B, P)``; return the state and the logits ``(B, V)`` of the first new token.

        Raises ``ValueError`` when ``max_new_tokens`` is missing, when a row is all padding, when
        the padding is not on the left, or for token ids outside the vocabulary.
        """
        model = self.model
        if max_new_tokens is None:
            raise ValueError("max_new_tokens is required for a decoder-only model (there is no source length to derive it from)")
        ids, mask = _inputs(ids, mask, model.config.pad_id, _device(model), "prompt")
        batch, prompt_len = ids.shape
        if mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        elif prompt_len > 1 and not bool((mask[:, 1:] >= mask[:, :-1]).all()):
            raise ValueError("prompts must be left-padded (mask False only before a row's first token); use left_pad()")
        _check_max_new(max_new_tokens, None, "")
        total = prompt_len + max_new_tokens
        if self.static_cache and (self._window is None or total <= self._window):
            return self._start_static(ids, mask, total, max_new_tokens)
        state = DecodeState(
            tokens=ids, mask=mask, max_new_tokens=torch.full((batch,), max_new_tokens, device=ids.device),
            pads=(~mask).sum(dim=1), cache=self._new_cache(None) if self.use_cache else None,
        )
        if self._outgrows_window(state):
            return state, self._encode_window(state)
        return state, self._prefill(ids, self._pad_mask(state), state.cache, self._offset(state, 0))

    @torch.no_grad()
    def step(self, tokens: Tensor, state: DecodeState) -> Tensor:
        state.append(tokens)
        if isinstance(state, StaticState) and state.column is not None:
            key_mask = state.key_mask
            if self.compiled and key_mask is not None:
                key_mask = key_mask[:, : state.tokens.shape[1]]  # the columns filled so far: attention reads only these
                # Its width marked dynamic, so one graph serves every length (no recompilation, no bucketing).
                torch._dynamo.mark_dynamic(key_mask, 1)
            logits = self._step(self.model, tokens[:, None], state.cache, key_mask, state.column - state.pads)
            state.column.add_(1)  # in place: the next step's column
            return logits
        if self._outgrows_window(state):
            return self._encode_window(state)
        if state.cache is not None:
            column = state.tokens.shape[1] - 1
            return (self._native or _decode_one)(self.model, tokens[:, None], state.cache, self._pad_mask(state), self._offset(state, column))
        return self.model(state.tokens, self._pad_mask(state), offset=self._offset(state, 0), logits_to_keep=1)[:, -1]

    @torch.no_grad()
    def extend(self, tokens: Tensor, state: DecodeState) -> Tensor:
        """Feed ``tokens (B, T)`` in one pass over the cache (speculative decoding's check); logits ``(B, T, V)``.

        Raises ``ValueError`` without a cache, or past learned positions (where the window is re-encoded)."""
        if state.cache is None:
            raise ValueError("extend needs a state with a KV cache (use_cache=True, within learned positions' max_len)")
        column = state.tokens.shape[1]
        state.tokens = torch.cat([state.tokens, tokens], dim=1)
        state.mask = torch.cat([state.mask, state.mask.new_ones(tokens.shape)], dim=1)
        if self._outgrows_window(state):
            raise ValueError(f"extend: {column + tokens.shape[1]} positions do not fit learned positions' max_len={self._window}")
        if isinstance(state, StaticState) and state.column is not None:
            logits = self._new_positions(tokens, state.cache, state.key_mask, state.column - state.pads)
            state.column.add_(tokens.shape[1])
            return logits
        return self._new_positions(tokens, state.cache, self._pad_mask(state), self._offset(state, column))

    def _new_positions(self, tokens: Tensor, cache: KVCache, mask: Tensor | None, offset: Tensor | int) -> Tensor:
        """Logits ``(B, T, V)`` of ``tokens (B, T)`` fed after the cached positions: the C++ step where it applies."""
        if self._native is not None:
            return self._native.logits(self.model, tokens, cache, mask, offset)
        return self.model(tokens, mask, cache=cache, offset=offset)

    def _start_static(self, ids: Tensor, mask: Tensor, total: int, max_new_tokens: int) -> tuple[DecodeState, Tensor]:
        """The prefill into a cache of ``total`` columns; row ``b``'s column ``c`` is position ``c - pads[b]``."""
        positions = self.model.positions
        if isinstance(positions, SinusoidalPositions):
            positions.embed(positions.table.new_zeros(1, 1, positions.d_model), total - 1)  # grow the table now, not in a graph
        batch, prompt_len = ids.shape
        pads = (~mask).sum(dim=1)  # (B,)
        # Compiled: one spare column, so that the filled width never reaches the buffers' (a slice of every
        # column is contiguous, a shorter one is not, and the graph would be specialised on which).
        columns = total + 1 if self.compiled else total
        padded, key_mask = bool(pads.any()), None
        if padded or self.compiled:  # a compiled step always takes one: its width is the filled length
            key_mask = torch.ones(batch, columns, dtype=torch.bool, device=ids.device)
            key_mask[:, :prompt_len] = mask
        cache = self._new_cache(columns)
        state = StaticState(
            tokens=ids, mask=mask, max_new_tokens=torch.full((batch,), max_new_tokens, device=ids.device), pads=pads,
            cache=cache, key_mask=key_mask, column=torch.full((1,), prompt_len, dtype=torch.long, device=ids.device),
        )
        logits = self._prefill(ids, key_mask if padded else None, cache, -pads)
        if self.compiled:  # the buffers (the prefill allocated them) of any length: one graph for every prompt and max_new_tokens
            for layer in cache.self_attn:
                torch._dynamo.mark_dynamic(layer.k, 2)
                torch._dynamo.mark_dynamic(layer.v, 2)
        return state, logits

    def _new_cache(self, max_len: int | None) -> KVCache:
        """The model's empty KV cache (static of ``max_len`` columns, or growing), its key/value layers in ``kv_dtype``
        where given (else the activations', by their first write)."""
        cache = self.model.new_cache(max_len=max_len)
        for layer in cache.self_attn:
            if isinstance(layer, (StaticLayerCache, LayerCache)):
                layer.dtype = self.kv_dtype
        return cache

    def _prefill(self, ids: Tensor, key_mask: Tensor | None, cache: KVCache | None, offset: Tensor | int) -> Tensor:
        """The prompt's last logits ``(B, V)`` into an empty cache (static or growing): through the C++ step where it
        applies, the cache's tensors allocated first as the model's first write would (the same bits as the forward: a
        16-token GPT-2 prompt 27-30 against 31-32 ms, a 112-token one of a 1.8 M-parameter model 3.4-5.0 against 4.8-6.6
        ms, Zen 4 EPYC), else the model's forward."""
        if self._native is None or cache is None or not all(type(c) in (StaticLayerCache, LayerCache) for c in cache.self_attn):
            return self.model(ids, key_mask, cache=cache, offset=offset, logits_to_keep=1)[:, -1]
        dtype = self.model.embed.weight.dtype  # the activations', so the keys' and values' (the forward's first write)
        for c, layer in zip(cache.self_attn, self.model.decoder.layers):
            attention = layer.self_attn
            assert isinstance(attention, MultiHeadAttention)  # a key/value cache (static or growing) is softmax attention's
            c.allocate(ids.shape[0], attention.n_kv_heads, attention.head_dim, dtype, ids.device)
        return self._native(self.model, ids, cache, key_mask, offset)

    def reorder(self, state: DecodeState, index: Tensor, *, same_sources: bool = False) -> None:
        state.select(index, same_sources=same_sources)

    def _outgrows_window(self, state: DecodeState) -> bool:
        """Whether the longest row no longer fits the learned positions (a host read, learned positions only)."""
        return self._window is not None and state.tokens.shape[1] - int(state.pads.min()) > self._window

    def _encode_window(self, state: DecodeState) -> Tensor:
        """Logits ``(B, V)`` of the last ``max_len`` columns, encoded from scratch (positions from 0 again)."""
        state.cache = None  # from here on every step re-encodes its window
        ids, mask = state.tokens[:, -self._window :], state.mask[:, -self._window :]  # type: ignore[operator]
        pads = (~mask).sum(dim=1)  # (B,) padding left inside the window
        offset: int | Tensor = -pads if bool(pads.any()) else 0
        return self.model(ids, mask, offset=offset, logits_to_keep=1)[:, -1]

    def _pad_mask(self, state: DecodeState) -> Tensor | None:
        # Explicit without a cache: the model would otherwise guess padding from pad_id, and a
        # generated pad-id token is a real token here. With a cache, None keeps the unmasked path.
        if state.cache is not None and not bool(state.pads.any()):
            return None
        return state.mask

    def _offset(self, state: DecodeState, column: int) -> int | Tensor:
        """Position of ``column`` in each row: ``column - pads`` (an int when no row is padded)."""
        if self._column_positions or not bool(state.pads.any()):
            return column
        return column - state.pads  # (B,)


def as_decoder(model: nn.Module | Decoder, *, use_cache: bool = True, static_cache: bool = False) -> Decoder:
    """The :class:`Decoder` for a generative model (a decoder is returned as it is).

    Raises ``TypeError`` for a model that does not generate.
    """
    if not isinstance(model, nn.Module):
        return model
    if isinstance(model, EncoderDecoder):
        return Seq2SeqDecoder(model, use_cache=use_cache, static_cache=static_cache)
    if isinstance(model, DecoderOnly):
        return CausalLMDecoder(model, use_cache=use_cache, static_cache=static_cache)
    raise TypeError(
        f"cannot generate with a {type(model).__name__}: only EncoderDecoder and DecoderOnly models generate "
        "(for an EncoderOnly model use aiayn.decoding.fill_mask or classify)"
    )


def _decode_one(model: DecoderOnly, tokens: Tensor, cache: KVCache | None, key_mask: Tensor | None, offset: Tensor | int) -> Tensor:
    """One token per row ``tokens (B, 1)`` at positions ``offset (B,)`` through the model's forward: logits ``(B, V)``."""
    return model(tokens, key_mask, cache=cache, offset=offset)[:, -1]


# Held while a compiled step runs with Inductor's freezing switched on (a global setting): one step at a time.
_FREEZING = threading.Lock()


def compiled_step(model: nn.Module, options: dict[str, Any] | None = None) -> Callable[..., Tensor]:
    """:func:`_decode_one` compiled for ``model``: one full graph, static shapes but the filled width, guards on layer
    0 only (:func:`_step_guards`), the weights frozen into it as constants (Inductor's freezing).

    Frozen weights are not gathered as inputs at every token, and oneDNN's packed weights
    (:class:`~aiayn.inference.precision.PackedLinear`, packed now if stale) enter the graph directly, with no call
    into Python around each matmul (bf16 GPT-2-small 1.13-1.54x the step before, docs/benchmarks.md); FBGEMM's
    packed weights (int8-dynamic layers, also packed now) are called through an opaque op. Inductor's own repacking
    is off, so each layer keeps the kernel timed fastest here. Where Inductor writes AVX2 code, a model with
    weight-only int8 layers is compiled without freezing (:func:`~aiayn.inference.quantization.avx512_graphs`). The step holds the weights as they were when it
    compiled: build a new decoder after changing them. Dynamo reads ``freezing`` from the global config while it
    traces (the ``options`` of ``torch.compile`` reach only Inductor), so it is switched on around each call.
    ``options``: more Inductor settings for this step (``benchmarks/compile_options.py`` tries some)."""
    import torch._inductor.config as inductor_config  # here, not at module level: it imports Dynamo (70 MB, 0.9 s)

    from aiayn.inference import gemv
    from aiayn.inference.int8_dynamic import Int8DynamicLinear
    from aiayn.inference.precision import PackedLinear
    from aiayn.inference.quantization import Int8Linear, avx512_graphs

    gemv.allow_in_graphs()  # our kernels in the graph only where Inductor writes AVX-512 code
    for module in model.modules():
        if isinstance(module, (PackedLinear, Int8DynamicLinear)):  # the packed weights the graph will call
            module.refresh()
    # Not frozen: weight-only int8 layers where Inductor writes AVX2 code (a frozen step gave wrong tokens there, see
    # avx512_graphs); packed layers then run F.linear in the graph.
    freeze = avx512_graphs() or not any(type(module) is Int8Linear for module in model.modules())
    step = torch.compile(_decode_one, fullgraph=True, dynamic=False, options={"guard_filter_fn": _step_guards, **(options or {})})

    def frozen(*args: Any) -> Tensor:
        with _FREEZING:
            saved = inductor_config.freezing, inductor_config.cpp.weight_prepack
            inductor_config.freezing, inductor_config.cpp.weight_prepack = freeze, False
            try:
                return step(*args)
            finally:
                inductor_config.freezing, inductor_config.cpp.weight_prepack = saved

    return frozen


def _chosen_step(model: nn.Module) -> Callable[..., Tensor]:
    """:func:`compiled_step` through the wrapper timed fastest here (:mod:`aiayn.decoding.step_wrapper`); Inductor's
    Python wrapper alone where it writes AVX2 code (the C++ one is untested there)."""
    from aiayn.decoding.step_wrapper import WRAPPERS, ChosenStep
    from aiayn.inference.quantization import avx512_graphs

    return ChosenStep(model, compiled_step, WRAPPERS if avx512_graphs() else WRAPPERS[:1])


# A guard's source in a layer after the first: its modules and weights, or its cache.
_LATER_LAYER = re.compile(r"\._modules\['layers'\]\._modules\['[1-9][0-9]*'\]|\.self_attn\[[1-9][0-9]*\]")


def _step_guards(entries: list) -> list[bool]:
    """Which guards the compiled step keeps (torch.compile's ``guard_filter_fn``): all but those on the layers
    after the first. One :class:`~aiayn.nn.blocks.LayerSpec` builds every layer alike and one ``new_cache``
    allocates every layer's cache alike, so layer 0's guards (its modules, the dtypes and shapes of its
    weights and cache) stand for all of them, and a step checks as many guards for 48 layers as for 2.
    What this trusts: that the model's layers are not changed one by one after the decoder is built."""
    return [not _LATER_LAYER.search(entry.name) for entry in entries]


def _static_blocker(model: DecoderOnly) -> str | None:
    """The setting that keeps ``model`` from a static KV cache, as ``name=value``; ``None`` when it has one."""
    for name, works in KV_CACHE_SETTINGS.items():
        value = getattr(model.config, name)
        if value != works:
            return f"{name}={value!r}"
    return "positions='alibi'" if model.positions.kind == "alibi" else None


def _inputs(ids: Tensor, mask: Tensor | None, pad_id: int | None, device: torch.device, name: str) -> tuple[Tensor, Tensor | None]:
    """Move ``ids``/``mask`` to the model, derive the mask from ``pad_id``, reject all-padding rows."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] == 0:
        got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a (B, L) tensor of token ids with L >= 1, got {got}")
    ids = ids.to(device)
    if mask is None and pad_id is not None:
        mask = ids != pad_id
    if mask is not None:
        check_padding_mask(mask, f"{name} mask", shape=tuple(ids.shape))
        mask = mask.to(device)
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"{name} rows {empty} are all padding: every row needs at least one real token")
        if bool(mask.all()):
            mask = None
    return ids, mask


def _check_max_new(max_new_tokens: int, limit: int | None, what: str) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if limit is not None and max_new_tokens > limit:
        raise ValueError(f"max_new_tokens={max_new_tokens} does not fit {what}: at most {max(limit, 0)}")


def _position_limit(positions: PositionalEncoding) -> int | None:
    return positions.max_len if isinstance(positions, LearnedPositions) else None


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _warn_if_training(model: nn.Module) -> None:
    if model.training:
        log.warning("decoding a %s in training mode: dropout makes outputs random; call model.eval()", type(model).__name__)
