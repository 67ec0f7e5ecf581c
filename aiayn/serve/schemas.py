"""Request bodies, validated by pydantic before any work: unknown fields, wrong types and values out of
range are refused with a 400 that names the field, the value and the rule (see ``app.validation_error``).

Limits that depend on the model (the context length, the vocabulary) are checked in
:mod:`aiayn.serve.requests`; the sampling settings by :class:`~aiayn.decoding.sampling.GenerationConfig`,
the one check the CLI and Python share.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_BEST_OF",
    "MAX_INPUTS",
    "MAX_STOPS",
    "UNSUPPORTED_COMPLETION_FIELDS",
    "AttentionRequest",
    "ClassificationRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "FillMaskRequest",
    "TokenizeRequest",
    "TranslationRequest",
]

MAX_INPUTS = 64  # prompts or texts in one request
MAX_STOPS = 4  # OpenAI's limit on stop strings
MAX_BEST_OF = 20  # OpenAI's limit on best_of (and so on n)
_SEED_LIMIT = 2**63


class _Request(BaseModel):
    # strict: "5" is not 5 and true is not 1; an int is still a valid float.
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class CompletionRequest(_Request):
    """``POST /v1/completions`` in OpenAI's schema, with vLLM's ``top_k``, ``min_p``, ``repetition_penalty``
    and ``return_tokens_as_token_ids``. ``prompt``: text, texts, token ids or lists of token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=0)  # 0: only with echo (score the prompt)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = Field(1, ge=1, le=MAX_BEST_OF)
    best_of: int | None = Field(None, ge=1, le=MAX_BEST_OF)
    logprobs: int | None = Field(None, ge=0)  # alternatives per token; the limit (20) is checked with the others
    echo: bool = False
    return_tokens_as_token_ids: bool = False
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=_SEED_LIMIT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> a bias in [-100, 100] added to its logit
    # OpenAI fields this server does not implement: accepted only at their neutral value.
    suffix: str | None = None


# field -> (values that mean "not used", why it is refused otherwise)
UNSUPPORTED_COMPLETION_FIELDS: dict[str, tuple[tuple[object, ...], str]] = {
    "suffix": ((None, ""), "is not supported: this server does not insert text"),
}


class TranslationRequest(_Request):
    """``POST /v1/translations``: beam search (section 6.1); ``beam_size=1`` is greedy and streams token by token.
    ``beam_size`` and ``length_penalty`` default to the model's ``decode`` settings (its recipe's, else 4 and 0.6)."""

    text: str | list[str]
    beam_size: int | None = Field(None, ge=1, le=16)
    max_tokens: int | None = Field(None, gt=0)
    length_penalty: float | None = Field(None, ge=0, le=10)
    stream: bool = False
    echo: bool = False  # refused: a translation is not a continuation of its source


class TokenizeRequest(_Request):
    """``POST /tokenize`` (vLLM's): the ids of ``prompt``; ``add_special_tokens``: as the model's endpoint
    adds them (``[CLS]``/``[SEP]`` for an encoder, a translation source's EOS or template (BART ``<s> x </s>``), none for a prompt)."""

    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(_Request):
    """``POST /detokenize`` (vLLM's): the text of ``tokens``."""

    tokens: list[int]


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
