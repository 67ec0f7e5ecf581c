"""What the served model can do, read from the model and its own tokenizer: which endpoints it serves
(an endpoint whose special token the tokenizer lacks is refused, with a 400 naming it, and not listed),
and the card ``/v1/models`` and ``/tokenizer_info`` report (context length, special tokens, heads)."""

from __future__ import annotations

from typing import Any

from aiayn.serve.loading import ServedModel
from aiayn.tokenization.special import ROLES, sentence_ids, special_ids

__all__ = ["model_card", "refusal", "tokenizer_info"]


def refusal(served: ServedModel, path: str) -> str | None:
    """Why ``served`` cannot serve ``path`` (an endpoint of its family), or ``None`` when it can."""
    config, tokenizer = served.config, served.src_tokenizer
    specials = special_ids(tokenizer)
    if path in ("/v1/classifications", "/v1/fill-mask", "/v1/embeddings"):
        try:
            sentence_ids(tokenizer)
        except ValueError as e:
            return str(e)
    if path == "/v1/classifications" and not config.n_classes:  # type: ignore[attr-defined]
        return "this model has no classification head (n_classes=0)"
    if path == "/v1/fill-mask":
        if not config.mlm_head:  # type: ignore[attr-defined]
            return "this model has no masked-LM head (mlm_head=False)"
        if specials.mask is None:
            return f"the tokenizer has no mask token (special tokens: {_spelled(served)}), which fill-mask needs"
    if path == "/v1/translations":
        target = special_ids(served.tgt_tokenizer)
        for role, why in (("bos", "the first decoder input"), ("eos", "where a translation ends")):
            if getattr(target, role) is None:
                return f"the target tokenizer has no {role} token, which translation needs ({why})"
    return None


def model_card(served: ServedModel, endpoints: list[str]) -> dict[str, Any]:
    """The extra fields of the model's entry in ``/v1/models`` (its ``endpoints``: the ones it serves)."""
    config = served.config
    card: dict[str, Any] = {
        "family": served.family, "context_length": config.max_len, "endpoints": endpoints,
        "past_context": ("sliding window" if served.window is not None else "extrapolates")
        if served.family == "decoder-only" else "refused",
        "tokenizer": {"vocab_size": served.src_tokenizer.vocab_size, "special_tokens": _specials(served.src_tokenizer)},
    }
    if served.family == "encoder-decoder":
        card["target_tokenizer"] = {"vocab_size": served.tgt_tokenizer.vocab_size, "special_tokens": _specials(served.tgt_tokenizer)}
    if served.family == "encoder-only":
        n_classes = int(config.n_classes)  # type: ignore[attr-defined]
        card["mask_head"] = bool(config.mlm_head)  # type: ignore[attr-defined]
        card["classes"] = (served.labels or [str(i) for i in range(n_classes)]) if n_classes else []
    return card


def tokenizer_info(served: ServedModel) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info``: the special tokens' spellings (what lm-eval's remote tokenizer reads)."""
    info: dict[str, Any] = {f"{role}_token": entry["token"] for role, entry in _specials(served.src_tokenizer).items()}
    return info | {"model_max_length": served.config.max_len, "vocab_size": served.src_tokenizer.vocab_size}


def _specials(tokenizer: Any) -> dict[str, dict[str, Any]]:
    """``role -> {"id", "token"}`` for each special token the tokenizer has."""
    specials = special_ids(tokenizer)
    out = {}
    for role in ROLES:
        token_id = getattr(specials, role)
        if token_id is not None:
            out[role] = {"id": token_id, "token": tokenizer.id_to_token(token_id)}
    return out


def _spelled(served: ServedModel) -> str:
    return ", ".join(f"{role}={e['token']!r}" for role, e in _specials(served.src_tokenizer).items()) or "none"
