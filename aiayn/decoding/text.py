"""Text in, text out: encode -> batch -> search -> detokenize, once, for the CLI and :func:`aiayn.load`.

Every special id comes from the tokenizer (:func:`~aiayn.tokenization.special.special_ids`): ours
(``<bos>`` = 1) or a pretrained model's own (GPT-2's ``<|endoftext|>``, Marian's ``</s>`` = 0 and its
decoder start = pad).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.decoding.adapters import Seq2SeqDecoder
from aiayn.decoding.beam import BeamConfig
from aiayn.decoding.encoder_only import Classification, classify, encode_masked_text, encode_sentences, fill_mask
from aiayn.decoding.sampling import GenerationConfig
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import encode_sources, sentence_ids, special_ids

__all__ = [
    "FilledMask", "seq2seq_decoder", "beam_config", "generation_config", "source_ids", "prompt_ids",
    "pad_id", "classify_texts", "fill_mask_text", "score_texts",
]


@dataclass(frozen=True)
class FilledMask:
    """``text``: the input with each mask replaced by its best candidate, detokenized;
    ``candidates``: per mask, ``(token text, probability)`` pairs, most likely first."""

    text: str
    candidates: list[list[tuple[str, float]]]


def seq2seq_decoder(model: EncoderDecoder, tgt_tokenizer: Tokenizer) -> Seq2SeqDecoder:
    """A decoder that starts every row from the target tokenizer's BOS (an import's ``decoder_start_token_id``:
    Marian's pad, BART's ``</s>``)."""
    return Seq2SeqDecoder(model, bos_id=special_ids(tgt_tokenizer).need("bos", "translation (the first decoder input)"))


def pad_id(tokenizer: Tokenizer) -> int:
    """The tokenizer's pad id (else its EOS, else 0) for right-padding batches."""
    specials = special_ids(tokenizer)
    # GPT-2 has no pad token: finished rows are filled with EOS, as transformers does.
    for value in (specials.pad, specials.eos, 0):
        if value is not None:
            return value
    return 0


def beam_config(tgt_tokenizer: Tokenizer, **fields: object) -> BeamConfig:
    """A :class:`BeamConfig` with the target tokenizer's EOS and pad ids."""
    eos = special_ids(tgt_tokenizer).need("eos", "beam search")
    return BeamConfig(**fields, eos_id=eos, pad_id=pad_id(tgt_tokenizer))  # type: ignore[arg-type]


def generation_config(tokenizer: Tokenizer, **fields: object) -> GenerationConfig:
    """A :class:`GenerationConfig` with the tokenizer's EOS (``None``: never stop early) and pad ids."""
    return GenerationConfig(**fields, eos_id=special_ids(tokenizer).eos, pad_id=pad_id(tokenizer))  # type: ignore[arg-type]


def source_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A translation source, as training encodes it (:func:`~aiayn.tokenization.special.encode_sources`)."""
    return encode_sources(tokenizer, [text])[0]


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """A generation prompt's ids; an empty prompt starts from BOS."""
    return tokenizer.encode(prompt) or [special_ids(tokenizer).need("bos", "an empty prompt")]



@torch.no_grad()
def classify_texts(
    model: EncoderOnly, tokenizer: Tokenizer, texts: Sequence[str], *, batch_size: int = 32, device: torch.device | str | None = None
) -> Classification:
    """Classify ``texts`` as ``[CLS] text [SEP]``: labels ``(N,)`` and probabilities ``(N, n_classes)``."""
    labels, probs = [], []
    for start in range(0, len(texts), batch_size):
        ids, mask = encode_sentences(tokenizer, texts[start : start + batch_size])
        result = classify(model, ids.to(device), mask.to(device))
        labels.append(result.labels.cpu())
        probs.append(result.probs.cpu())
    return Classification(torch.cat(labels), torch.cat(probs))


def fill_mask_text(
    model: EncoderOnly, tokenizer: Tokenizer, text: str, *, top_k: int = 5, device: torch.device | str | None = None
) -> FilledMask:
    """The ``top_k`` candidates for each mask token of ``text`` (its own spelling: ``<mask>``, ``[MASK]``), as text."""
    specials = special_ids(tokenizer)
    mask_id = specials.need("mask", "fill-mask")
    ids = encode_masked_text(tokenizer, text)
    if mask_id not in ids:
        raise ValueError(f"text must contain the mask token {tokenizer.id_to_token(mask_id)!r}, got {text!r}")
    batch = torch.tensor([ids], device=device)
    predictions = fill_mask(model, batch, top_k=top_k, mask_id=mask_id, special=specials.ids())[0]
    filled = list(ids)
    candidates = []
    for prediction in predictions:
        candidates.append([(tokenizer.decode([t]).strip(), p) for t, p in zip(prediction.token_ids, prediction.probs)])
        filled[prediction.position] = prediction.token_ids[0]
    return FilledMask(tokenizer.decode(filled), candidates)


@torch.no_grad()
def score_texts(
    model: nn.Module,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    texts: Sequence[str],
    targets: Sequence[str] | None = None,
    *,
    device: torch.device | str | None = None,
) -> list[float]:
    """Log-probability (natural log, summed over tokens) of each text under the model.

    Decoder-only: ``log p(text)`` after BOS (without one, the first token is given, not scored).
    Encoder-decoder: ``log p(target + EOS | text)`` (``targets`` required). Encoder-only: the
    pseudo-log-likelihood (each token masked in turn; Salazar et al., 2020).
    """
    if isinstance(model, EncoderDecoder):
        if targets is None or len(targets) != len(texts):
            raise ValueError(f"an encoder-decoder scores targets given sources: targets must have {len(texts)} texts, got {targets!r}")
        return [_score_pair(model, src_tokenizer, tgt_tokenizer, s, t, device) for s, t in zip(texts, targets)]
    if targets is not None:
        raise ValueError(f"targets are only for an encoder-decoder model, got a {type(model).__name__}")
    if isinstance(model, DecoderOnly):
        return [_score_lm(model, src_tokenizer, t, device) for t in texts]
    if isinstance(model, EncoderOnly):
        return [_score_masked(model, src_tokenizer, t, device) for t in texts]
    raise TypeError(f"model must be one of aiayn's families, got {type(model).__name__}")


def _token_log_probs(logits: Tensor, targets: Tensor) -> float:
    return float(logits.float().log_softmax(-1).gather(-1, targets[..., None]).sum())


def _score_lm(model: DecoderOnly, tokenizer: Tokenizer, text: str, device: torch.device | str | None) -> float:
    bos = special_ids(tokenizer).bos
    ids = tokenizer.encode(text) if bos is None else [bos, *tokenizer.encode(text)]
    if len(ids) < 2:
        return 0.0
    x = torch.tensor([ids], device=device)
    mask = torch.ones_like(x, dtype=torch.bool)
    return _token_log_probs(model(x[:, :-1], mask[:, :-1]), x[:, 1:])


def _score_pair(model: EncoderDecoder, src_tok: Tokenizer, tgt_tok: Tokenizer, source: str, target: str, device: torch.device | str | None) -> float:
    specials = special_ids(tgt_tok)
    src = torch.tensor([source_ids(src_tok, source)], device=device)
    y = tgt_tok.encode(target)
    tgt_in = torch.tensor([[specials.need("bos", "scoring"), *y]], device=device)
    tgt_out = torch.tensor([[*y, specials.need("eos", "scoring")]], device=device)
    ones = torch.ones_like(tgt_in, dtype=torch.bool)  # explicit: Marian's first input is the pad id
    return _token_log_probs(model(src, tgt_in, torch.ones_like(src, dtype=torch.bool), ones), tgt_out)


def _score_masked(model: EncoderOnly, tokenizer: Tokenizer, text: str, device: torch.device | str | None) -> float:
    cls, sep, _ = sentence_ids(tokenizer)
    mask_id = special_ids(tokenizer).need("mask", "a pseudo-log-likelihood")
    body = tokenizer.encode(text)
    if not body:
        return 0.0
    ids = torch.tensor([cls, *body, sep], device=device)
    n = len(body)
    batch = ids.repeat(n, 1)  # (n, n + 2): row i masks token i
    rows = torch.arange(n, device=ids.device)
    batch[rows, rows + 1] = mask_id
    hidden = model(batch, torch.ones_like(batch, dtype=torch.bool))
    logits = model.masked_lm_logits(hidden[rows, rows + 1])  # (n, V)
    return _token_log_probs(logits, ids[1 : n + 1])
