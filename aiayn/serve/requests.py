"""From a validated body to an engine's work item, with the checks that need the model: empty
inputs, the context length, unsupported OpenAI fields. Each failure is a 400 naming field, value and limit."""

from __future__ import annotations

import secrets

from aiayn.decoding.encoder_only import encode_masked_text
from aiayn.serve.encoder_engine import Classify, FillMask
from aiayn.serve.errors import APIError, bad_field
from aiayn.serve.lm_engine import Completion
from aiayn.serve.loading import ServedModel
from aiayn.serve.schemas import (
    MAX_INPUTS,
    MAX_STOPS,
    UNSUPPORTED_COMPLETION_FIELDS,
    ClassificationRequest,
    CompletionRequest,
    FillMaskRequest,
    TranslationRequest,
)
from aiayn.serve.seq2seq_engine import Translation
from aiayn.tokenization.special import CLS_ID, MASK, SEP_ID

__all__ = ["check_model_name", "classification", "completion", "fill_mask_request", "translation"]


def check_model_name(requested: str | None, served: ServedModel) -> None:
    if requested is not None and requested != served.name:
        raise APIError(404, f"model={requested!r} is not served here; this server serves {served.name!r}", param="model", code="model_not_found")


def completion(body: CompletionRequest, served: ServedModel) -> Completion:
    for name, (neutral, why) in UNSUPPORTED_COMPLETION_FIELDS.items():
        value = getattr(body, name)
        if value not in neutral:
            raise bad_field(name, value, why)
    prompts = _texts(body.prompt, "prompt")
    context = served.config.max_len
    ids = []
    for i, text in enumerate(prompts):
        name = "prompt" if isinstance(body.prompt, str) else f"prompt[{i}]"
        tokens = served.src_tokenizer.encode(text)
        if not tokens:
            raise bad_field(name, text, "encodes to no tokens")
        if len(tokens) > context:
            raise bad_field(name, _short(text), f"has {len(tokens)} tokens: the model's context is {context} positions")
        limit = context - len(tokens) + 1  # the last generated token is never fed back
        if body.max_tokens > limit:
            raise bad_field("max_tokens", body.max_tokens,
                            f"is beyond the model's context: {name} has {len(tokens)} tokens and the model reads {context} positions, "
                            f"so max_tokens must be <= {limit}")
        ids.append(tokens)
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise bad_field("stop", body.stop, f"must be at most {MAX_STOPS} non-empty strings")
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    return Completion(ids, body.max_tokens, body.temperature, body.top_p, stops, seed, _logit_bias(body.logit_bias, served))


def _logit_bias(given: dict[str, float] | None, served: ServedModel) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as strings) the tokenizer can write, biases in [-100, 100]."""
    vocab = served.tgt_tokenizer.vocab_size
    out = []
    for key, bias in (given or {}).items():
        if not key.isdigit() or int(key) >= vocab:
            raise bad_field("logit_bias", {key: bias}, f"must map token ids (0..{vocab - 1}, as strings) to biases")
        if not -100 <= bias <= 100:
            raise bad_field("logit_bias", {key: bias}, "biases must be in [-100, 100]")
        out.append((int(key), float(bias)))
    return tuple(out)


def translation(body: TranslationRequest, served: ServedModel) -> Translation:
    context = served.config.max_len
    sources = []
    for i, text in enumerate(_texts(body.text, "text")):
        ids = served.src_tokenizer.encode(text, add_eos=True)  # fairseq-style EOS, as in training
        if len(ids) > context:
            name = "text" if isinstance(body.text, str) else f"text[{i}]"
            raise bad_field(name, _short(text), f"has {len(ids)} tokens with EOS: the model's context is {context} positions")
        sources.append(ids)
    if body.max_tokens is not None and body.max_tokens > context:
        raise bad_field("max_tokens", body.max_tokens, f"is beyond the model's context: must be <= {context}")
    return Translation(sources, body.beam_size, body.max_tokens, body.length_penalty)


def classification(body: ClassificationRequest, served: ServedModel) -> Classify:
    if not served.config.n_classes:  # type: ignore[attr-defined]
        raise APIError(400, "this model has no classification head (n_classes=0)", code="unsupported_model")
    return Classify([_sentence(served, [CLS_ID, *served.src_tokenizer.encode(t), SEP_ID], body.input, i, t) for i, t in enumerate(_texts(body.input, "input"))])


def fill_mask_request(body: FillMaskRequest, served: ServedModel) -> FillMask:
    if not served.config.mlm_head:  # type: ignore[attr-defined]
        raise APIError(400, "this model has no masked-LM head (mlm_head=False)", code="unsupported_model")
    texts = []
    for i, text in enumerate(_texts(body.input, "input")):
        if MASK not in text:
            raise bad_field("input" if isinstance(body.input, str) else f"input[{i}]", _short(text), f"has no {MASK} to fill")
        texts.append(_sentence(served, encode_masked_text(served.src_tokenizer, text), body.input, i, text))
    return FillMask(texts, body.top_k)


def _sentence(served: ServedModel, ids: list[int], given: str | list[str], i: int, text: str) -> list[int]:
    if len(ids) > served.config.max_len:
        name = "input" if isinstance(given, str) else f"input[{i}]"
        raise bad_field(name, _short(text), f"has {len(ids)} tokens with [CLS] and [SEP]: the model's context is {served.config.max_len} positions")
    return ids


def _texts(given: str | list[str], name: str) -> list[str]:
    texts = [given] if isinstance(given, str) else given
    if not texts:
        raise bad_field(name, given, "is empty: give a string or a list of strings")
    if len(texts) > MAX_INPUTS:
        raise bad_field(name, f"<list of {len(texts)}>", f"holds too many items: at most {MAX_INPUTS}")
    for i, text in enumerate(texts):
        if not text:
            raise bad_field(name if isinstance(given, str) else f"{name}[{i}]", text, "is empty: nothing to work on")
    return texts


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."
