"""``POST /v1/embeddings`` in OpenAI's schema, for encoder-only models: sentence embeddings pooled as
:func:`aiayn.inference.embed.embedding_pooling` says (sentence-transformers' files, else the mean), the
same vectors as ``aiayn.load(dir).embed``. Requests that wait together share one forward pass (the
encoder engine). ``input`` is a string, a list of strings, or token ids (a list of ints, or a list of
lists): the ids of the text without [CLS] and [SEP], which are added as for text.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from fastapi import FastAPI
from pydantic import Field

from aiayn.inference.embed import Pooling, embedding_pooling, sentence_rows
from aiayn.models.encoder_only import EncoderOnly
from aiayn.serve.app import ServerState, _collect, _submit
from aiayn.serve.encoder_engine import Embed
from aiayn.serve.errors import APIError, bad_field
from aiayn.serve.loading import ServedModel
from aiayn.serve.requests import _short, _texts, check_model_name, vocabulary
from aiayn.serve.schemas import MAX_INPUTS, _Request

__all__ = ["EmbeddingRequest", "add_embeddings_route", "embedding_request"]

PATH = "/v1/embeddings"


class EmbeddingRequest(_Request):
    """``POST /v1/embeddings``: OpenAI's fields (``dimensions`` only at the model's own size)."""

    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)
    user: str | None = None


def add_embeddings_route(app: FastAPI, state: ServerState) -> None:
    """Register ``POST /v1/embeddings`` on ``app`` (see :func:`aiayn.serve.app.create_app`)."""

    @app.post(PATH)
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        if state.served is not None and state.served.family != "encoder-only":
            raise APIError(400, f"model={state.served.name!r} is a {state.served.family} model: {PATH} needs an encoder-only model "
                           f"(this server offers {state.endpoints()})", param="model", code="unsupported_model")
        served, engine = state.need(PATH)
        check_model_name(body.model, served)
        payload = embedding_request(body, served)
        results = await _collect(_submit(engine, payload, len(payload.texts)))
        tokens = sum(len(row) for row in payload.texts)
        return {
            "object": "list", "model": served.name,
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(r["embedding"], body.encoding_format)} for i, r in enumerate(results)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


def embedding_request(body: EmbeddingRequest, served: ServedModel) -> Embed:
    """The engine's work item; a 400 naming the field, the value and the limit for ``dimensions``, token ids
    outside the vocabulary, and inputs that are empty, too many or longer than the model embeds."""
    pooling = _pooling(served)
    size = served.config.d_model
    if body.dimensions is not None and body.dimensions != size:
        raise bad_field("dimensions", body.dimensions, f"must be {size}, this model's embedding size: it cannot shorten its embeddings")
    inputs = _inputs(body.input, served)
    rows = sentence_rows(served.src_tokenizer, [ids for _, _, ids in inputs], None)
    for (name, shown, _), row in zip(inputs, rows):
        if len(row) > pooling.max_tokens:  # type: ignore[operator]  # embedding_pooling sets it
            raise bad_field(name, shown, f"has {len(row)} tokens with [CLS] and [SEP]: this model embeds at most {pooling.max_tokens}")
    return Embed(rows, pooling)


def _inputs(given: str | list[str] | list[int] | list[list[int]], served: ServedModel) -> list[tuple[str, object, list[int]]]:
    """``(field name, value as shown in an error, token ids)`` of each input."""
    if isinstance(given, str) or (given and all(isinstance(t, str) for t in given)):
        texts = _texts(given, "input")  # type: ignore[arg-type]  # str | list[str] here
        names = ["input"] if isinstance(given, str) else [f"input[{i}]" for i in range(len(texts))]
        return [(name, _short(text), served.src_tokenizer.encode(text)) for name, text in zip(names, texts)]
    one = bool(given) and all(isinstance(t, int) for t in given)
    rows = cast("list[list[int]]", [given] if one else given)  # str and list[str] went above
    if not rows:
        raise bad_field("input", given, "is empty: give a string, a list of strings or token ids")
    if len(rows) > MAX_INPUTS:
        raise bad_field("input", f"<list of {len(rows)}>", f"holds too many items: at most {MAX_INPUTS}")
    out: list[tuple[str, object, list[int]]] = []
    for i, row in enumerate(rows):
        name = "input" if one else f"input[{i}]"
        if not row:
            raise bad_field(name, row, "is empty: nothing to embed")
        out.append((name, f"<{len(row)} token ids>", vocabulary(served, row, name, served.src_tokenizer)))
    return out


def _pooling(served: ServedModel) -> Pooling:
    if not isinstance(served.model, EncoderOnly):  # the family check comes first; this keeps the types honest
        raise APIError(400, f"{served.name} is not an encoder-only model", param="model", code="unsupported_model")
    try:
        return _pooling_of(served.model, served.path)
    except ValueError as e:  # sentence-transformers' files describe something aiayn does not run
        raise APIError(400, f"this model cannot embed: {e}", param="model", code="unsupported_model") from None


@functools.lru_cache(maxsize=4)
def _pooling_of(model: EncoderOnly, path: Path | None) -> Pooling:
    """Once per served model, so every request (and every batch the engine forms) pools alike."""
    return embedding_pooling(model, path)


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """OpenAI's ``base64``: the float32 values, little-endian, base64-encoded."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
