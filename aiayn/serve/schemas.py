"""Request bodies, validated by pydantic before any work: unknown fields, wrong types and values out of
range are refused with a 400 that names the field, the value and the rule (see ``app.validation_error``).

Limits that depend on the model (the context length) are checked in :mod:`aiayn.serve.requests`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_INPUTS",
    "MAX_STOPS",
    "UNSUPPORTED_COMPLETION_FIELDS",
    "AttentionRequest",
    "ClassificationRequest",
    "CompletionRequest",
    "FillMaskRequest",
    "TranslationRequest",
]

MAX_INPUTS = 64  # prompts or texts in one request
MAX_STOPS = 4  # OpenAI's limit on stop strings
_SEED_LIMIT = 2**63


class _Request(BaseModel):
    # strict: "5" is not 5 and true is not 1; an int is still a valid float.
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class CompletionRequest(_Request):
    """``POST /v1/completions`` in OpenAI's schema (the fields this server implements, and the others at their defaults)."""

    prompt: str | list[str]
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=_SEED_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> a bias in [-100, 100] added to its logit
    # OpenAI fields this server does not implement: accepted only at their neutral value.
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


# field -> (values that mean "not used", why it is refused otherwise)
UNSUPPORTED_COMPLETION_FIELDS: dict[str, tuple[tuple[object, ...], str]] = {
    "n": ((1,), "is not supported: this server returns one choice per prompt (send n=1, or the prompt several times with different seeds)"),
    "best_of": ((None, 1), "is not supported (best_of must be 1)"),
    "logprobs": ((None,), "is not supported: this server does not return log-probabilities"),
    "echo": ((False,), "is not supported: the prompt is not echoed"),
    "suffix": ((None, ""), "is not supported: this server does not insert text"),
    "presence_penalty": ((0, 0.0), "is not supported (must be 0)"),
    "frequency_penalty": ((0, 0.0), "is not supported (must be 0)"),
}


class TranslationRequest(_Request):
    """``POST /v1/translations``: beam search (section 6.1); ``beam_size=1`` is greedy and streams token by token."""

    text: str | list[str]
    beam_size: int = Field(4, ge=1, le=16)
    max_tokens: int | None = Field(None, gt=0)
    length_penalty: float = Field(0.6, ge=0, le=10)
    stream: bool = False


class ClassificationRequest(_Request):
    """``POST /v1/classifications``: class probabilities per text."""

    input: str | list[str]


class FillMaskRequest(_Request):
    """``POST /v1/fill-mask``: candidates for each ``<mask>`` in each text."""

    input: str | list[str]
    top_k: int = Field(5, ge=1, le=100)


class AttentionRequest(_Request):
    """``POST /v1/attention``: the attention explorer page for a text (and, for translation, its target)."""

    text: str = Field(min_length=1, max_length=2000)
    target: str | None = Field(None, max_length=2000)
