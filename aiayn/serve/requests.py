"""From a validated body to an engine's work item, with the checks that need the model: empty
inputs, the context length, the vocabulary, unsupported OpenAI fields. Each failure is a 400 naming
field, value and limit. Every special id comes from the served tokenizer, through the helpers the CLI
and ``aiayn.load`` use (:mod:`aiayn.decoding.text`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from aiayn.decoding.encoder_only import encode_masked_text
from aiayn.decoding.sampling import GenerationConfig
from aiayn.decoding.text import generation_config, prompt_ids, source_ids
from aiayn.serve.encoder_engine import Classify, FillMask
from aiayn.serve.errors import APIError, bad_field
from aiayn.serve.lm_engine import Completion
from aiayn.serve.loading import ServedModel
from aiayn.serve.logprobs import MAX_LOGPROBS
from aiayn.serve.schemas import (
    MAX_INPUTS,
    MAX_STOPS,
    UNSUPPORTED_COMPLETION_FIELDS,
    ClassificationRequest,
    CompletionRequest,
    FillMaskRequest,
    TokenizeRequest,
    TranslationRequest,
)
from aiayn.serve.seq2seq_engine import Translation
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import sentence_ids, special_ids

__all__ = ["check_model_name", "classification", "completion", "fill_mask_request", "tokenize", "translation", "vocabulary"]

# GenerationConfig's field -> the request's field, for its errors
_REQUEST_FIELD = {"max_new_tokens": "max_tokens", "stop_strings": "stop", "temperature": "temperature"}


def check_model_name(requested: str | None, served: ServedModel) -> None:
    if requested is not None and requested != served.name:
        raise APIError(404, f"model={requested!r} is not served here; this server serves {served.name!r}", param="model", code="model_not_found")


def completion(body: CompletionRequest, served: ServedModel, *, token_budget: int) -> Completion:
    """A completion request; ``token_budget``: the most tokens one request may ask to generate
    (prompts x ``best_of`` x ``max_tokens``)."""
    for name, (neutral, why) in UNSUPPORTED_COMPLETION_FIELDS.items():
        value = getattr(body, name)
        if value not in neutral:
            raise bad_field(name, value, why)
    if body.logprobs is not None and body.logprobs > MAX_LOGPROBS:
        raise bad_field("logprobs", body.logprobs, f"is above the limit: at most {MAX_LOGPROBS} alternatives per token")
    best_of = body.best_of if body.best_of is not None else body.n
    if best_of < body.n:
        raise bad_field("best_of", best_of, f"must be >= n={body.n} (the n best of best_of samples are returned)")
    if body.stream and best_of > body.n:
        raise bad_field("best_of", best_of, f"cannot stream: the best {body.n} of {best_of} samples are known only at the end (stream=false)")
    if body.max_tokens == 0 and not body.echo:
        raise bad_field("max_tokens", 0, "gives nothing without echo: ask for >= 1 token, or echo=true with logprobs to score the prompt")
    prompts = _prompts(body, served)
    asked = len(prompts) * best_of * body.max_tokens
    if asked > token_budget:
        raise bad_field("max_tokens", body.max_tokens,
                        f"asks for {asked} tokens in all ({len(prompts)} prompts x n/best_of={best_of} x max_tokens={body.max_tokens}), "
                        f"beyond this server's budget of {token_budget} tokens per request")
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise bad_field("stop", body.stop, f"must be at most {MAX_STOPS} non-empty strings")
    config = _config(served, body, stops)
    seed = body.seed if body.seed is not None else secrets.randbits(62)
    return Completion(prompts, config, body.max_tokens, seed, body.n, best_of, body.logprobs, body.echo)


def _config(served: ServedModel, body: CompletionRequest, stops: tuple[str, ...]) -> GenerationConfig:
    """The request's :class:`GenerationConfig` (temperature 0: greedy), with the tokenizer's EOS and pad;
    its own checks of the values become 400s naming the request's field."""
    greedy = body.temperature == 0
    try:
        return generation_config(
            served.tgt_tokenizer, max_new_tokens=body.max_tokens or None, greedy=greedy,
            temperature=1.0 if greedy else body.temperature, top_k=body.top_k,
            top_p=None if body.top_p == 1 else body.top_p, min_p=body.min_p or None, repetition_penalty=body.repetition_penalty,
            presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
            logit_bias=_logit_bias(body.logit_bias, served), stop_strings=stops,
        )
    except ValueError as e:
        name = str(e).split("=", 1)[0]
        field = _REQUEST_FIELD.get(name, name)
        raise APIError(400, str(e) if field == name else f"{field}: {e}", param=field, code="invalid_value") from None


def _prompts(body: CompletionRequest, served: ServedModel) -> list[list[int]]:
    """The prompts' ids: text through the tokenizer (an empty text starts from BOS, as in the CLI), or
    ids checked against the vocabulary. Past the context, a window slides (learned positions), except
    for ``echo``, which scores the whole prompt in one pass."""
    given = body.prompt
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        items: list[str | list[int]] = [given]
        names = ["prompt"]
    else:
        items = list(given)  # type: ignore[arg-type]
        names = [f"prompt[{i}]" for i in range(len(items))]
    if not items:
        raise bad_field("prompt", given, "is empty: give a string, a list of strings, token ids or lists of token ids")
    if len(items) > MAX_INPUTS:
        raise bad_field("prompt", f"<list of {len(items)}>", f"holds too many prompts: at most {MAX_INPUTS}")
    out = []
    for name, item in zip(names, items):
        if isinstance(item, str):
            try:
                ids = prompt_ids(served.src_tokenizer, item)
            except ValueError as e:
                raise bad_field(name, item, f"cannot start generation: {e}") from None
        else:
            ids = vocabulary(served, item, name)
        if body.echo and served.window is not None and len(ids) > served.window:
            raise bad_field(name, _short(str(item)), f"has {len(ids)} tokens: echo scores the prompt in one pass, "
                            f"so it must fit the model's context of {served.config.max_len} positions")
        out.append(ids)
    return out


def vocabulary(served: ServedModel, ids: list[int], name: str, tokenizer: Tokenizer | None = None) -> list[int]:
    """``ids``, refused when empty or when one is outside the vocabulary of ``tokenizer`` (default: the target's)."""
    vocab = (tokenizer or served.tgt_tokenizer).vocab_size
    if not ids:
        raise bad_field(name, ids, "is empty: give at least one token id")
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise bad_field(f"{name}[{i}]", token, f"is outside the vocabulary: token ids must be in 0..{vocab - 1}")
    return ids


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
    if body.echo:
        raise bad_field("echo", True, "is not supported for a translation model: its output does not continue its source (echo=false)")
    context = served.config.max_len
    sources = []
    for i, text in enumerate(_texts(body.text, "text")):
        ids = source_ids(served.src_tokenizer, text)  # as in training: text + EOS, or an import's own template (BART <s> x </s>)
        if len(ids) > context:
            name = "text" if isinstance(body.text, str) else f"text[{i}]"
            raise bad_field(name, _short(text), f"has {len(ids)} tokens with EOS: the model's context is {context} positions")
        sources.append(ids)
    if body.max_tokens is not None and body.max_tokens > context:
        raise bad_field("max_tokens", body.max_tokens, f"is beyond the model's context: must be <= {context}")
    return Translation(sources, max_tokens=body.max_tokens, **served.decode.beam(body.beam_size, body.length_penalty))


def classification(body: ClassificationRequest, served: ServedModel) -> Classify:
    texts = _texts(body.input, "input")
    for i, text in enumerate(texts):
        _fits(served, len(served.src_tokenizer.encode(text)) + 2, body.input, i, text)
    return Classify(texts)


def fill_mask_request(body: FillMaskRequest, served: ServedModel) -> FillMask:
    tokenizer = served.src_tokenizer
    mask_id = special_ids(tokenizer).need("mask", "fill-mask")  # checked before: the endpoint is refused without one
    mask = tokenizer.id_to_token(mask_id)
    texts = []
    for i, text in enumerate(_texts(body.input, "input")):
        ids = encode_masked_text(tokenizer, text)
        if mask_id not in ids:
            raise bad_field("input" if isinstance(body.input, str) else f"input[{i}]", _short(text), f"has no {mask} to fill")
        _fits(served, len(ids), body.input, i, text)
        texts.append(ids)
    return FillMask(texts, body.top_k)


def tokenize(body: TokenizeRequest, served: ServedModel) -> list[int]:
    """vLLM's ``/tokenize``; a special token's spelling (``<|endoftext|>``, ``[MASK]``) is its id."""
    tokenizer = served.src_tokenizer
    specials = special_ids(tokenizer)
    spelled = {tokenizer.id_to_token(i): i for i in specials.ids()}
    spelled.pop(None, None)
    ids = _encode_with_specials(tokenizer.encode, body.prompt, spelled)  # type: ignore[arg-type]
    if not body.add_special_tokens:
        return ids
    if served.family == "encoder-only":
        cls, sep, _ = sentence_ids(tokenizer)
        return [cls, *ids, sep]
    if served.family == "encoder-decoder":  # around the text, what /v1/translations adds: EOS, or an import's template
        plain, source = tokenizer.encode(body.prompt), source_ids(tokenizer, body.prompt)
        at = next((i for i in range(len(source) - len(plain) + 1) if source[i : i + len(plain)] == plain), 0)
        return [*source[:at], *ids, *source[at + len(plain):]]
    return ids


def _encode_with_specials(encode: Callable[[str], list[int]], text: str, spelled: dict[str, int]) -> list[int]:
    """``encode`` the text between special tokens' spellings; each spelling becomes its id."""
    hits = [(text.find(s), s) for s in spelled if s and s in text]
    if not hits:
        return encode(text) if text else []
    start, spelling = min(hits)
    return [*_encode_with_specials(encode, text[:start], spelled), spelled[spelling],
            *_encode_with_specials(encode, text[start + len(spelling):], spelled)]


def _fits(served: ServedModel, n_ids: int, given: str | list[str], i: int, text: str) -> None:
    if n_ids > served.config.max_len:
        name = "input" if isinstance(given, str) else f"input[{i}]"
        raise bad_field(name, _short(text), f"has {n_ids} tokens with [CLS] and [SEP]: the model's context is {served.config.max_len} positions")


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
